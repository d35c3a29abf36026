// The run page's view in its address, so a link (an alert's too) opens the same view: the
// zoomed steps (?start=&end=), the smoothing (?smoothing=), the layers drawn as lines
// (?layers=, names joined by commas, each encoded), and the loss and grad-norm axes
// (?loss_axis=log|linear, ?grad_norm_axis=). Read once at load; every change replaces the
// current history entry (no new one per zoom).

const AXES = new Set(['log', 'linear']);

/** The view the address asks for; fields absent or malformed are null. */
export function readViewState(search = location.search) {
  const params = new URLSearchParams(search);
  const number = (key) => {
    if (!params.has(key)) return null;
    const v = Number(params.get(key));
    return Number.isFinite(v) ? v : null;
  };
  let start = number('start');
  let end = number('end');
  if (start === null || end === null || !(end > start)) start = end = null;
  const smoothing = number('smoothing');
  const axis = (key) => (AXES.has(params.get(key)) ? params.get(key) : null);
  return {
    start, end,
    smoothing: smoothing !== null && smoothing >= 0 && smoothing < 1 ? smoothing : null,
    layers: params.has('layers') ? params.get('layers').split(',').filter(Boolean).map(decodeURIComponent) : null,
    lossAxis: axis('loss_axis'),
    gradNormAxis: axis('grad_norm_axis'),
  };
}

/** Change the address's view: `patch` keys (as readViewState's) set; null removes one. */
export function writeViewState(patch) {
  const url = new URL(location.href);
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
