// @ts-check
// Shared Plotly setup: the global from /static/vendor/plotly.min.js, the theme, the config, and
// text escaping for plotly's labels (which parse a small HTML subset).

import { powerText } from './format.js';

/** plotly.js's global, read at each use: the run page runs its modules before plotly.js (see
 * run.html), so their first requests leave while plotly.js is run (~0.5-0.8 s of main thread
 * on the 2-core reference machine). Draw only after `plotlyLoaded()`. */
export const Plotly = /** @type {PlotlyStatic} */ (new Proxy({}, {
  get: (_, key) => /** @type {PlotlyStatic} */ (window.Plotly)[/** @type {keyof PlotlyStatic} */ (key)],
}));

/** Settles once plotly.js has run: at once on a page that loads it before its modules, else
 * when the document's deferred scripts have run (DOMContentLoaded).
 * @returns {Promise<void>} */
export function plotlyLoaded() {
  if (window.Plotly || document.readyState === 'complete') return Promise.resolve();
  return new Promise((resolve) => {
    window.addEventListener('DOMContentLoaded', () => resolve(), { once: true });
  });
}

export const COLORS = Object.freeze({
  scale: '#2563eb',
  band: 'rgba(37, 99, 235, 0.15)',
  skipped: '#dc2626',
  growth: '#16a34a',
  loss: '#7c3aed',
  gradNorm: '#0891b2',
  grid: '#eef0f4',
  axis: '#c9ced8',
  text: '#3b4252',
});

/**
 * The charts' surfaces and ink, light or dark as the system asks (web/css/dark.css does the
 * page): read once, at load. `gap` is the heatmap's background, where a cell has no value.
 */
export const DARK = typeof matchMedia === 'function' && matchMedia('(prefers-color-scheme: dark)').matches;
export const THEME = Object.freeze(DARK
  ? { plot: '#0d1117', grid: '#21262d', axis: '#3d444d', text: '#c9d1d9', gap: '#262c36' }
  : { plot: '#ffffff', grid: COLORS.grid, axis: COLORS.axis, text: COLORS.text, gap: '#eceff3' });

export const FONT = {
  family: 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif',
  size: 12,
  color: THEME.text,
};

/**
 * Plotly options for every chart: no logo, no lasso/select (nothing here uses a selection), and
 * nothing that sends a chart off the server: plotly's "Share chart..." (Chart Studio upload,
 * shown by default) is off and its destination empty, so no button or link can reach the cloud.
 */
export const CONFIG = Object.freeze({
  displaylogo: false,
  responsive: true,
  showSendToCloud: false,
  showEditInChartStudio: false,
  showLink: false,
  plotlyServerURL: '',
  modeBarButtonsToRemove: ['lasso2d', 'select2d', 'autoScale2d', 'sendDataToCloud'],
});

/**
 * The left and right margins of a page's step charts (every chart with steps on its x axis),
 * which `alignMargins` lines up. Relaying a drawn chart out redraws it (a 500-layer heatmap
 * took ~0.7 s of main thread on the 2-core reference machine, the run page's six charts ~1.5 s),
 * so a page that knows its widest y labels (the heatmap's layer names) fits the margins to them
 * before the first chart is drawn (`fitStepMargins`). Plotly's automargin still widens a chart
 * whose labels need more; `alignMargins` then lines the others up as before.
 */
const stepMargin = { l: 56, r: 16 };
const LABEL_PAD = 16; // px beside the widest label: plotly's tick offset (it needed 11) and slack
const STEP_RIGHT = 24; // px: the last x tick label ("1M") overhangs the plot area by half

/**
 * Size the step charts' margins to `labels` (y tick labels, e.g. layer names) in FONT.
 * @param {Iterable<string>} labels
 */
export function fitStepMargins(labels) {
  // A 2d context is always there for a new canvas (null is for a canvas given to another kind).
  const context = /** @type {CanvasRenderingContext2D} */ (document.createElement('canvas').getContext('2d'));
  context.font = `${FONT.size}px ${FONT.family}`;
  let widest = 0;
  for (const label of labels) widest = Math.max(widest, context.measureText(label).width);
  stepMargin.l = Math.max(stepMargin.l, Math.ceil(widest) + LABEL_PAD);
  stepMargin.r = Math.max(stepMargin.r, STEP_RIGHT);
}

/**
 * A step chart's margin (`fitStepMargins`), with the given top and bottom.
 * @param {number} [t]
 * @param {number} [b]
 * @returns {{l: number, r: number, t: number, b: number}}
 */
export function stepChartMargin(t = 8, b = 40) {
  return { l: stepMargin.l, r: stepMargin.r, t, b };
}

/**
 * The steps every step chart's autorange spans exactly (null: each chart's own). Plotly pads a
 * chart's autorange for its markers and a heatmap's by half a cell, so stacked charts of the
 * same steps started and ended up to ~200 px apart; including [first, last] and clipping to it
 * gives them one x range from the first render, and after any "reset axes". A page sets it
 * before drawing, for a run whose steps are all in (a live run's range grows with it).
 * @type {[number, number | null] | null}
 */
let stepSpan = null;

/**
 * Make every step chart drawn from now on span exactly steps [first, last]; with `last` null (a
 * live run, whose range grows) they start at `first` alike and end where their data does.
 * @param {number} first
 * @param {number | null} [last]
 */
export function setStepSpan(first, last = null) {
  if (!Number.isFinite(first)) stepSpan = null;
  else stepSpan = typeof last === 'number' && Number.isFinite(last) && last > first ? [first, last] : [first, null];
}

/**
 * A layout on the app's theme; `uirevision` keeps the user's zoom across data updates.
 * @param {string} uirevision
 * @param {PlotLayout} [overrides]
 * @returns {PlotLayout & {xaxis: PlotAxis, yaxis: PlotAxis}}
 */
export function themedLayout(uirevision, overrides = {}) {
  // exponentformat 'e': plotly's own labels for powers ("10<sup>-5</sup>") are drawn as tspans
  // with an inline style, which the CSP blocks; "1e-5" is plain text (LogTicks labels powers).
  const axis = { gridcolor: THEME.grid, linecolor: THEME.axis, zeroline: false, automargin: true,
    exponentformat: 'e' };
  return {
    uirevision,
    font: FONT,
    paper_bgcolor: 'rgba(0,0,0,0)',
    plot_bgcolor: THEME.plot,
    margin: stepChartMargin(),
    hoverlabel: { font: { family: FONT.family, size: 12 } },
    showlegend: true,
    legend: { orientation: 'h', x: 0, y: 1.02, yanchor: 'bottom', font: { size: 11 } },
    ...overrides,
    xaxis: { ...axis, title: { text: 'step', standoff: 6 }, ...(stepAxis(overrides) ?? {}), ...(overrides.xaxis ?? {}) },
    yaxis: { ...axis, ...(overrides.yaxis ?? {}) },
  };
}

/**
 * The autorange options of a step chart's x axis (one whose x title is the default 'step').
 * @param {PlotLayout} overrides
 * @returns {PlotAxis | null}
 */
function stepAxis(overrides) {
  if (!stepSpan || (overrides.xaxis && overrides.xaxis.title !== undefined)) return null;
  const [first, last] = stepSpan;
  if (last === null) return { autorangeoptions: { include: [first], clipmin: first } };
  // The range itself too: a chart without data yet (the per-layer lines) has no autorange.
  return { range: [first, last], autorangeoptions: { include: [first, last], clipmin: first, clipmax: last } };
}

/**
 * User text for a plotly label: shown literally, not as plotly's pseudo-HTML.
 * @param {unknown} text
 * @returns {string}
 */
export function plotText(text) {
  return String(text).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

/**
 * A value plotly can draw: non-finite numbers become gaps.
 * @param {unknown} x
 * @returns {number | null}
 */
export function finiteOrNull(x) {
  return typeof x === 'number' && Number.isFinite(x) ? x : null;
}

/**
 * Tick labels for a log axis as powers of `base` (2 for the loss scale, 10 elsewhere), at most
 * ~8 of them. Feed it values with widen(); update() returns a relayout object when the ticks must
 * change (the data reached a new power), else null: the axis is not relaid out per frame.
 */
export class LogTicks {
  /**
   * @param {string} axis  the layout's axis ('yaxis')
   * @param {number} base
   */
  constructor(axis, base) {
    this.axis = axis;
    this.base = base;
    this.lo = Infinity;
    this.hi = -Infinity;
    this.key = '';
  }

  /**
   * Take in `values` (anything but positive finite numbers is passed over).
   * @param {Iterable<unknown>} values
   * @returns {this}
   */
  widen(values) {
    for (const v of values) {
      if (typeof v === 'number' && Number.isFinite(v) && v > 0) {
        if (v < this.lo) this.lo = v;
        if (v > this.hi) this.hi = v;
      }
    }
    return this;
  }

  /**
   * The tick attributes for a layout's axis object.
   * @returns {{tickmode: 'auto' | 'array', tickvals?: number[] | null, ticktext?: string[] | null}}
   */
  attributes() {
    if (!(this.lo <= this.hi)) return { tickmode: 'auto' };
    /** @param {number} x */
    const log = (x) => Math.log(x) / Math.log(this.base);
    let kmin = Math.floor(log(this.lo) + 1e-9);
    let kmax = Math.ceil(log(this.hi) - 1e-9);
    if (kmax - kmin < 3 && this.base === 10) {
      this.key = 'auto'; // under three decades plotly's own 1-2-5 labels say more
      return { tickmode: 'auto', tickvals: null, ticktext: null };
    }
    if (kmin === kmax) { kmin -= 1; kmax += 1; }
    const stride = Math.max(1, Math.ceil((kmax - kmin) / 8));
    const tickvals = [];
    const ticktext = [];
    for (let k = kmin - (((kmin % stride) + stride) % stride); k <= kmax; k += stride) {
      tickvals.push(this.base ** k);
      ticktext.push(powerText(this.base, k));
    }
    this.key = `${kmin}:${kmax}`;
    return { tickmode: 'array', tickvals, ticktext };
  }

  /**
   * A Plotly.relayout argument when the ticks changed since the last call, else null.
   * @returns {PlotUpdate | null}
   */
  update() {
    const before = this.key;
    const attrs = this.attributes();
    if (this.key === before) return null;
    /** @type {PlotUpdate} */
    const out = {};
    for (const [k, v] of Object.entries(attrs)) out[`${this.axis}.${k}`] = v;
    return out;
  }
}
