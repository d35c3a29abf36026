// @ts-check
// The run page's view in its address, so a link (an alert's too) opens the same view: the
// zoomed steps (?start=&end=), the smoothing (?smoothing=), the layers drawn as lines
// (?layers=, names joined by commas, each encoded), and the loss and grad-norm axes
// (?loss_axis=log|linear, ?grad_norm_axis=). Read once at load; every change replaces the
// current history entry (no new one per zoom).

const AXES = new Set(['log', 'linear']);

/**
 * A run page's view (each field null: the default).
 * @typedef {object} ViewState
 * @property {number | null} start  the zoomed steps (both, or neither)
 * @property {number | null} end
 * @property {number | null} smoothing  in [0, 1)
 * @property {string[] | null} layers  the layers drawn as lines, in order
 * @property {string | null} lossAxis  'log' or 'linear'
 * @property {string | null} gradNormAxis
 */

/**
 * The view the address asks for; fields absent or malformed are null.
 * @param {string} [search]
 * @returns {ViewState}
 */
export function readViewState(search = location.search) {
  const params = new URLSearchParams(search);
  /** @param {string} key */
  const number = (key) => {
    if (!params.has(key)) return null;
    const v = Number(params.get(key));
    return Number.isFinite(v) ? v : null;
  };
  let start = number('start');
  let end = number('end');
  if (start === null || end === null || !(end > start)) start = end = null;
  const smoothing = number('smoothing');
  /** @param {string} key */
  const axis = (key) => {
    const value = params.get(key);
    return value !== null && AXES.has(value) ? value : null;
  };
  const layers = params.get('layers');
  return {
    start, end,
    smoothing: smoothing !== null && smoothing >= 0 && smoothing < 1 ? smoothing : null,
    layers: layers !== null ? layers.split(',').filter(Boolean).map(decodeURIComponent) : null,
    lossAxis: axis('loss_axis'),
    gradNormAxis: axis('grad_norm_axis'),
  };
}

/**
 * Change the address's view: `patch` keys (as readViewState's) set; null removes one.
 * @param {Partial<ViewState>} patch
 */
export function writeViewState(patch) {
  const url = new URL(location.href);
  /**
   * @param {string} key
   * @param {unknown} value
   */
  const set = (key, value) => {
    if (value === null || value === undefined) url.searchParams.delete(key);
    else url.searchParams.set(key, String(value));
  };
  if ('start' in patch) set('start', patch.start);
  if ('end' in patch) set('end', patch.end);
  if ('smoothing' in patch) set('smoothing', patch.smoothing);
  if ('layers' in patch) {
    set('layers', patch.layers && patch.layers.length ? patch.layers.map(encodeURIComponent).join(',') : null);
  }
  if ('lossAxis' in patch) set('loss_axis', patch.lossAxis);
  if ('gradNormAxis' in patch) set('grad_norm_axis', patch.gradNormAxis);
  history.replaceState(history.state, '', url);
}
