// @ts-check
// Layer × step heatmap of one per-layer statistic. Layers are rows in model order (first layer on
// top), steps are columns. The trace is `transpose: true`, so z holds one row per *step*: a live
// step is one Plotly.extendTraces call appending a row to z (a column on screen) and a step to x.

import { CONFIG, Plotly, THEME, finiteOrNull, plotText, stepChartMargin, themedLayout } from './plot.js';

/** @import { LayerStats, Step } from './codec.js' */

/** Plotly's colour scale: [position in [0, 1], colour] stops. @typedef {[number, string][]} ColorScale */

/**
 * A statistic the heatmap shows.
 * @typedef {object} StatSpec
 * @property {string} label
 * @property {string} help
 * @property {ColorScale} colorscale
 * @property {string} format  plotly's d3 format of a cell's hover value
 * @property {(v: number) => string} legend  a colour bound as the legend's text
 * @property {number} [zmin]  fixed colour bounds (else the data's)
 * @property {number} [zmax]
 * @property {boolean} [symmetric]  bounds symmetric about 0
 * @property {(v: number) => number} [transform]  applied to each cell (log10 of amax)
 * @property {boolean} [events]  counts of events: non-zero cells get a marker while sparse
 */

/** The colour legend's elements. @typedef {{bar: HTMLElement, min: HTMLElement, max: HTMLElement}} Legend */

const MAX_COLUMNS = 5000;

// Small fractions matter (1% of a layer's gradient lost is already a finding), so the fraction
// colour scale spends most of its range near zero.
/** @type {ColorScale} */
const FRACTION_SCALE = [
  [0, '#f8fafc'], [0.005, '#fef3c7'], [0.05, '#fdba74'], [0.2, '#f97316'],
  [0.5, '#dc2626'], [1, '#5b0f0f'],
];
/** @type {(label: string, help: string) => StatSpec} */
const fraction = (label, help) => ({
  label, help, zmin: 0, zmax: 1, colorscale: FRACTION_SCALE, format: '.2%', legend: (v) => `${Math.round(100 * v)}%`,
});
/** @type {ColorScale} */
const VIRIDIS = [
  [0, '#440154'], [0.25, '#3b528b'], [0.5, '#21918c'], [0.75, '#5ec962'], [1, '#fde725'],
];
// Red = little or negative headroom (about to overflow), blue = plenty.
/** @type {ColorScale} */
const HEADROOM = [[0, '#b2182b'], [0.25, '#ef8a62'], [0.5, '#f7f7f7'], [0.75, '#67a9cf'], [1, '#2166ac']];
/** @param {number} v */
const fixed1 = (v) => v.toFixed(1);
const EVENT_COLOUR = '#7f1d1d';
// A lone NaN/inf cell among thousands of steps is one pixel wide or less: event statistics also
// mark every non-zero cell with a square of fixed pixel size, visible at any zoom.
// Beyond MAX_EVENT_MARKERS cells the events are no longer sparse: the colours show them, and
// markers would only slow the chart down.
const EVENT_MARKER = Object.freeze({ symbol: 'square', size: 7, color: EVENT_COLOUR, line: { width: 0 } });
const MAX_EVENT_MARKERS = 2000;

/** The statistics the selector offers, in its order. @type {Readonly<Record<string, StatSpec>>} */
export const STATS = Object.freeze({
  lost_frac: fraction('zeros + flushed', 'exact zeros plus values that would flush at this scale: an upper bound on what the format loses (exact zeros include structural ones, e.g. dead ReLU units; the Findings and the card count those apart, docs/findings.md)'),
  zero_frac: fraction('zero fraction', 'elements exactly 0: flushed upstream, or structural (dead ReLU units, unused rows)'),
  underflow_frac: fraction('underflow fraction', 'non-zero, but would flush to 0 in the target format at this scale'),
  subnormal_frac: fraction('subnormal fraction', 'non-zero but below the smallest normal at this scale: precision lost'),
  headroom_bits: {
    label: 'headroom (bits)', help: 'doublings of the scale left before this layer overflows; 0–2 bits is normal (dynamic loss scaling grows the scale until the next overflow)',
    colorscale: HEADROOM, symmetric: true, format: '.1f', legend: fixed1,
  },
  amax: {
    label: 'log₁₀ amax', help: 'largest |gradient| in true units, log10', transform: Math.log10,
    colorscale: VIRIDIS, format: '.2f', legend: fixed1,
  },
  nan_count: {
    label: 'NaN count', help: 'NaN elements in the gradient (marked ■ where they are sparse)', zmin: 0,
    colorscale: [[0, '#f8fafc'], [0.001, '#fecaca'], [1, EVENT_COLOUR]], format: 'd', legend: String, events: true,
  },
  inf_count: {
    label: 'inf count', help: '±inf elements in the gradient: the layers that overflowed at that step (marked ■ where they are sparse)', zmin: 0,
    colorscale: [[0, '#f8fafc'], [0.001, '#fecaca'], [1, EVENT_COLOUR]], format: 'd', legend: String, events: true,
  },
});

/** One step's column of `stat` from its live per-layer arrays (null when the step has none).
 * `formatMax`: the target format's largest finite value (the run's `target_format_limits.max`,
 * from the server's formats), for headroom_bits as the read API computes it.
 * @param {Step} step
 * @param {string} stat
 * @param {number} formatMax
 * @returns {(number | null)[] | null} */
export function columnOf(step, stat, formatMax) {
  const layers = step.layers;
  if (!layers) return null;
  if (layers[stat]) return layers[stat];
  if (stat === 'lost_frac' && layers.zero_frac && layers.underflow_frac) {
    return layers.zero_frac.map((z, i) => (z === null || layers.underflow_frac[i] === null
      ? null : z + layers.underflow_frac[i]));
  }
  if (stat === 'headroom_bits' && layers.amax) {
    // As series_math.headroom_bits: no scale (no GradScaler) counts as 1; a scale that is not a
    // positive finite number gives no headroom.
    const scale = step.scale_before ?? 1;
    if (!Number.isFinite(scale) || scale <= 0) return layers.amax.map(() => null);
    return layers.amax.map((a) => {
      if (a === null) return null;
      return a === 0 ? Infinity : Math.log2(formatMax / (a * scale));
    });
  }
  return null;
}

/** The (step, layer) cells of `columns` (one array of cells per step) holding a non-zero count,
 * as the x/y/text arrays of a marker trace.
 * @param {number[]} steps
 * @param {(number | null)[][]} columns
 * @param {string[]} names  the rows'
 * @returns {{x: number[], y: string[], text: number[]}} */
export function eventCells(steps, columns, names) {
  /** @type {number[]} */
  const x = [];
  /** @type {string[]} */
  const y = [];
  /** @type {number[]} */
  const text = [];
  columns.forEach((column, j) => column.forEach((v, i) => {
    if (v === null || v === 0) return;
    x.push(steps[j]);
    y.push(names[i]);
    text.push(v);
  }));
  return { x, y, text };
}

/**
 * Row names as plot text, a repeated name numbered ("fc.weight #1"): a category axis merges equal ones.
 * @param {string[]} names
 * @returns {string[]}
 */
export function uniqueNames(names) {
  /** @type {Map<string, number>} */
  const seen = new Map();
  return names.map((name) => {
    const n = seen.get(name) ?? 0;
    seen.set(name, n + 1);
    return plotText(n ? `${name} #${n}` : name);
  });
}

/**
 * The colour legend, drawn in HTML: plotly's own colorbar sets style attributes, which the CSP
 * blocks. `legend` holds the {bar, min, max} elements; the gradient goes through the CSSOM.
 * @param {Legend} legend
 * @param {StatSpec} spec
 * @param {number} zmin
 * @param {number} zmax
 */
function drawLegend(legend, spec, zmin, zmax) {
  const stops = spec.colorscale.map(([at, color]) => `${color} ${(100 * at).toFixed(2)}%`);
  legend.bar.style.background = `linear-gradient(to right, ${stops.join(', ')})`;
  legend.min.textContent = Number.isFinite(zmin) ? spec.legend(zmin) : '';
  legend.max.textContent = Number.isFinite(zmax) ? spec.legend(zmax) : '';
}

export class LayerHeatmap {
  /**
   * @param {PlotDiv} div
   * @param {Legend} legend
   * @param {string} runId
   * @param {number} formatMax  the target format's largest finite value (columnOf)
   */
  constructor(div, legend, runId, formatMax) {
    this.div = div;
    this.legend = legend;
    this.runId = runId;
    this.formatMax = formatMax;
    this.stat = 'lost_frac';
    this.source = 'param';
    this.lastStep = -Infinity;
    this.zmin = Infinity;
    this.zmax = -Infinity;
    /** @type {string[]} the rows' names, as drawn */
    this.names = [];
    this.markers = 0; // event cells marked
  }

  /**
   * A value as its cell: the statistic's transform applied, non-finite values as gaps.
   * @param {number | null | undefined} value
   * @returns {number | null}
   */
  cell(value) {
    const t = STATS[this.stat].transform;
    const v = finiteOrNull(value);
    if (v === null) return null;
    return t ? finiteOrNull(t(v)) : v;
  }

  /**
   * Draw /layer-stats output (z[layer][step]) from scratch: on load and when the stat changes.
   * @param {LayerStats} body
   */
  async show(body) {
    this.stat = body.stat;
    this.source = body.source ?? 'param';
    const spec = STATS[this.stat];
    const names = uniqueNames(body.layers);
    const columns = body.steps.map((_, j) => body.z.map((row) => this.cell(row[j])));
    this.lastStep = body.steps.length ? body.steps[body.steps.length - 1] : -Infinity;
    this.zmin = Infinity;
    this.zmax = -Infinity;
    this.widen(columns);
    const [zmin, zmax] = this.range();
    const height = Math.max(240, Math.min(720, 90 + 22 * names.length));
    const trace = {
      type: 'heatmap', transpose: true, x: body.steps.slice(), y: names, z: columns,
      colorscale: spec.colorscale, zmin, zmax, zauto: false, showscale: false,
      hoverongaps: false, xgap: 0, ygap: 1,
      hovertemplate: `%{y}<br>step %{x}<br>${spec.label}: %{z:${spec.format}}<extra></extra>`,
    };
    const layout = themedLayout(`heatmap-${this.runId}`, {
      height,
      showlegend: false,
      margin: stepChartMargin(),
      plot_bgcolor: THEME.gap, // gaps (no data, non-finite) read as grey, not as "0"
      yaxis: { type: 'category', autorange: 'reversed', showgrid: false, ticks: '', automargin: true },
      xaxis: { showgrid: false },
    });
    /** @type {object[]} */
    const traces = [trace];
    this.names = names;
    this.markers = 0;
    const cells = spec.events ? eventCells(trace.x, columns, names) : null;
    if (cells && cells.x.length <= MAX_EVENT_MARKERS) {
      this.markers = cells.x.length;
      traces.push({
        type: 'scatter', mode: 'markers', ...cells, marker: { ...EVENT_MARKER }, cliponaxis: true,
        hovertemplate: `%{y}<br>step %{x}<br>${spec.label}: %{text}<extra></extra>`,
      });
    }
    this.div.style.height = `${height}px`; // responsive plots fill their div: size the div
    await Plotly.react(this.div, traces, layout, CONFIG);
    drawLegend(this.legend, spec, zmin, zmax);
  }

  /** @param {(number | null)[][]} columns */
  widen(columns) {
    for (const column of columns) {
      for (const v of column) {
        if (v === null) continue;
        if (v < this.zmin) this.zmin = v;
        if (v > this.zmax) this.zmax = v;
      }
    }
  }

  /**
   * The colour range: the statistic's fixed bounds, else the data's (symmetric about 0 if asked).
   * @returns {[number, number]}
   */
  range() {
    const spec = STATS[this.stat];
    let lo = spec.zmin ?? (Number.isFinite(this.zmin) ? this.zmin : 0);
    let hi = spec.zmax ?? (Number.isFinite(this.zmax) ? this.zmax : 1);
    if (spec.symmetric) {
      const m = Math.max(Math.abs(lo), Math.abs(hi), 1);
      [lo, hi] = [-m, m];
    }
    if (hi <= lo) hi = lo + 1;
    return [lo, hi];
  }

  /** Append live steps that carry per-layer stats (parameter gradients: the live socket carries
   * no activation statistics, so an activation heatmap stays as loaded).
   * @param {Step[]} steps
   */
  append(steps) {
    if (this.source !== 'param') return;
    /** @type {number[]} */
    const x = [];
    /** @type {(number | null)[][]} */
    const z = [];
    for (const step of steps) {
      if (step.step <= this.lastStep) continue;
      const column = columnOf(step, this.stat, this.formatMax);
      if (!column) continue;
      x.push(step.step);
      z.push(column.map((v) => this.cell(v)));
      this.lastStep = step.step;
    }
    if (!x.length) return;
    Plotly.extendTraces(this.div, { x: [x], z: [z] }, [0], MAX_COLUMNS);
    this.extendMarkers(eventCells(x, z, this.names));
    const before = this.range();
    this.widen(z);
    const [zmin, zmax] = this.range();
    if (zmin !== before[0] || zmax !== before[1]) {
      Plotly.restyle(this.div, { zmin: [zmin], zmax: [zmax] }, [0]);
      drawLegend(this.legend, STATS[this.stat], zmin, zmax);
    }
  }

  /**
   * Live event cells join the marker trace while they stay sparse; past that it goes.
   * @param {{x: number[], y: string[], text: number[]}} cells
   */
  extendMarkers(cells) {
    if (this.div.data.length < 2 || !cells.x.length) return;
    this.markers += cells.x.length;
    if (this.markers > MAX_EVENT_MARKERS) {
      Plotly.deleteTraces(this.div, 1);
      return;
    }
    Plotly.extendTraces(this.div, { x: [cells.x], y: [cells.y], text: [cells.text] }, [1]);
  }

  get rows() {
    return this.div.data ? this.div.data[0].y.length : 0;
  }
}
