// @ts-check
// "What if the scale were ×k?" (DESIGN.md §3): per layer, the exponent histogram of one sampled
// step (GET /api/runs/{id}/histogram) against the target format's min subnormal, min normal and
// max at scale s·k, and the shares that would be zero, flushed, subnormal and overflowing,
// recomputed here in the browser as k moves. Live: fetched again while steps arrive (at most every
// REFETCH_MS); a newer sampled step replaces the shown one unless the user picked a step.

import { getJSON } from './api.js';
import { el, numberText, powerText } from './format.js';
import { CONFIG, Plotly, plotText, themedLayout } from './plot.js';

/** @import { FormatLimits, Tagged } from './codec.js' */

/**
 * GET /api/runs/{id}/histogram: one sampled step's exponent histograms, per layer.
 * @typedef {object} HistogramView
 * @property {number | null} step  the sampled step shown; null when the run has none yet
 * @property {Tagged | null} scale  the scale in effect there (null: unknown, read as 1)
 * @property {number[]} steps  the run's latest sampled steps, newest first
 * @property {FormatLimits} format  the target format's
 * @property {number | null} min_exp  null when there is no histogram to show
 * @property {number | null} max_exp
 * @property {string[]} layers
 * @property {number[][]} counts  per layer (see sharesAt)
 */

/**
 * A layer's shares at a scale (counts of its values; `total` all of them).
 * @typedef {object} Shares
 * @property {number} zero
 * @property {number} nonfinite
 * @property {number} flushed
 * @property {number} subnormal
 * @property {number} overflow
 * @property {number} fits
 * @property {number} total
 * @property {number | null} overflowDoublings  doublings of the scale until its largest values
 *   overflow (≤ 0: they do already); null without a finite non-zero value
 */

const REFETCH_MS = 10000;
export const MIN_DOUBLINGS = -16;
export const MAX_DOUBLINGS = 16;

/**
 * The shares of one layer's histogram at scale `scale` (the scale in effect × k), for a target
 * format `fmt` ({max, min_normal, min_subnormal}). A bin [2^e, 2^(e+1)) is classed by its lower
 * edge times the scale: above fmt.max it overflows, below min_subnormal / 2 it flushes to zero,
 * below min_normal it is subnormal (precision lost), else it fits. With a power-of-two scale (as
 * GradScaler's always are) every bin lies wholly on one side of each threshold, except the sliver
 * [max, 2^16) of FP16, which counts as fitting. The edge bin below the range is classed by its
 * upper edge (its values are at most that); the one above by its lower edge.
 * @param {number[]} counts  [0] |g| = 0, [1] non-finite, [2] 0 < |g| < 2^minExp,
 *   [3 + k] 2^(minExp+k) ≤ |g| < 2^(minExp+k+1), [last] |g| ≥ 2^(maxExp+1)
 * @param {number} minExp
 * @param {number} maxExp
 * @param {number} scale
 * @param {{max: number, min_normal: number, min_subnormal: number}} fmt
 * @returns {Shares}
 */
export function sharesAt(counts, minExp, maxExp, scale, fmt) {
  /** @type {Shares} */
  const out = { zero: counts[0], nonfinite: counts[1], flushed: 0, subnormal: 0, overflow: 0, fits: 0, total: 0,
    overflowDoublings: null };
  const flush = fmt.min_subnormal / 2;
  /**
   * @param {number} edge
   * @param {number} n
   */
  const classify = (edge, n) => {
    const v = edge * scale;
    if (v > fmt.max) out.overflow += n;
    else if (v < flush) out.flushed += n;
    else if (v < fmt.min_normal) out.subnormal += n;
    else out.fits += n;
  };
  classify(2 ** minExp / 2, counts[2]); // the upper edge 2^minExp, classed as the bin just below
  let top = null; // lower edge of the largest non-empty finite bin
  for (let k = 0; k <= maxExp - minExp; k += 1) {
    const n = counts[3 + k];
    if (n > 0) top = 2 ** (minExp + k);
    classify(2 ** (minExp + k), n);
  }
  const above = counts[counts.length - 1];
  if (above > 0) top = 2 ** (maxExp + 1);
  classify(2 ** (maxExp + 1), above);
  for (const n of counts) out.total += n;
  // Doublings of the scale until this layer's largest values overflow (≤ 0: they do already).
  out.overflowDoublings = top === null ? null : Math.floor(Math.log2(fmt.max / (top * scale))) + 1;
  return out;
}

/**
 * @param {number} part
 * @param {number} total
 */
const pct = (part, total) => (total ? `${numberText((100 * part) / total, 3)}%` : '—');

export class WhatIf {
  /**
   * @param {string} runId
   * @param {{panel: HTMLElement, chart: PlotDiv, body: HTMLElement, slider: HTMLInputElement,
   *   output: HTMLElement, select: HTMLSelectElement, note: HTMLElement, empty: HTMLElement}} nodes
   *   the panel, its chart, the table's body, the ×k slider and its value, the step menu, the
   *   line under the table, the "no histogram yet" note
   */
  constructor(runId, { panel, chart, body, slider, output, select, note, empty }) {
    this.runId = runId;
    this.panel = panel;
    this.chart = chart;
    this.body = body;
    this.slider = slider;
    this.output = output;
    this.select = select;
    this.note = note;
    this.empty = empty;
    /** @type {HistogramView | null} */
    this.view = null;
    /** @type {(Shares & {name: string})[]} the table's data, for the console and the tests */
    this.rows = [];
    this.pinned = false; // the user chose a step: live updates leave it
    this.lastFetch = -Infinity;
    /** @type {number | null} */
    this.timer = null;
    slider.min = String(MIN_DOUBLINGS);
    slider.max = String(MAX_DOUBLINGS);
    slider.addEventListener('input', () => this.recompute());
    select.addEventListener('change', () => {
      this.pinned = true;
      this.load(Number(select.value)).catch((err) => this.fail(err));
    });
  }

  get doublings() {
    return Number(this.slider.value);
  }

  /**
   * Show sampled step `step` (null: the newest).
   * @param {number | null} [step]
   */
  async load(step = null) {
    this.lastFetch = performance.now();
    const query = step === null ? '' : `?step=${step}`;
    const view = /** @type {HistogramView} */ (
      await getJSON(`/api/runs/${encodeURIComponent(this.runId)}/histogram${query}`));
    if (view.scale === 'nan' || view.scale === 'inf' || view.scale === '-inf') view.scale = null;
    const changed = !this.view || this.view.step !== view.step;
    this.view = view;
    this.renderSteps(view);
    if (changed) await this.draw();
    else this.recompute();
  }

  /** Steps arrived: fetch again (throttled) unless the user pinned a step. */
  stepsArrived() {
    if (this.pinned || this.timer !== null) return;
    const wait = Math.max(0, this.lastFetch + REFETCH_MS - performance.now());
    this.timer = setTimeout(() => {
      this.timer = null;
      this.load().catch((err) => this.fail(err));
    }, wait);
  }

  /** @param {Error} err */
  fail(err) {
    this.note.textContent = `could not load the histograms: ${err.message}`;
  }

  /** @param {HistogramView} view */
  renderSteps(view) {
    const { steps, step } = view;
    this.select.replaceChildren(...steps.map((s) => {
      const option = el('option', null, `step ${s}`);
      option.value = String(s);
      return option;
    }));
    if (step !== null) this.select.value = String(step);
    this.select.disabled = steps.length === 0;
  }

  /**
   * The scale in effect at the shown step (1 when unknown, as no GradScaler means).
   * @param {HistogramView} view
   */
  baseScale(view) {
    return typeof view.scale === 'number' && view.scale > 0 ? view.scale : 1;
  }

  async draw() {
    const v = this.view;
    if (!v) return;
    this.empty.hidden = v.step !== null;
    // The chart's div stays displayed (plotly drawing into a hidden div sets inline styles,
    // which the CSP blocks): with nothing to draw, it is simply not plotted yet.
    if (v.step === null || v.min_exp === null || v.max_exp === null) {
      this.body.replaceChildren();
      this.note.textContent = '';
      return;
    }
    /** @type {number[]} */
    const bins = [];
    for (let e = v.min_exp; e <= v.max_exp; e += 1) bins.push(e);
    // log10(count): a layer's tiny tail stays visible beside its bulk; empty bins are gaps.
    const z = v.counts.map((row) => bins.map((_, k) => (row[3 + k] > 0 ? Math.log10(row[3 + k]) : null)));
    const height = Math.max(200, Math.min(640, 80 + 22 * v.layers.length));
    const trace = {
      type: 'heatmap', x: bins, y: v.layers.map(plotText), z, showscale: false, ygap: 1,
      colorscale: [[0, '#dbeafe'], [0.5, '#3b82f6'], [1, '#1e3a8a']], hoverongaps: false,
      hovertemplate: '%{y}<br>|g| in [2^%{x}, 2^(%{x}+1))<br>10^%{z:.1f} values<extra></extra>',
    };
    const layout = themedLayout(`whatif-${this.runId}`, {
      height, showlegend: false, margin: { l: 8, r: 8, t: 24, b: 40 }, plot_bgcolor: '#f8fafc',
      xaxis: { title: { text: 'log₂ |gradient| (true units)', standoff: 6 }, showgrid: false },
      yaxis: { type: 'category', autorange: 'reversed', showgrid: false, ticks: '', automargin: true },
    });
    this.chart.style.height = `${height}px`;
    await Plotly.react(this.chart, [trace], layout, CONFIG);
    this.recompute();
  }

  /**
   * The format's limits in true units at scale s·k, as vertical lines on the histogram.
   * @param {FormatLimits} f
   * @param {number} scale
   */
  shapes(f, scale) {
    /** @type {(value: number, color: string, dash: string) => object} */
    const line = (value, color, dash) => ({
      type: 'line', xref: 'x', yref: 'paper', y0: 0, y1: 1, x0: Math.log2(value / scale),
      x1: Math.log2(value / scale), line: { color, width: 2, dash },
    });
    return [line(f.min_subnormal / 2, '#dc2626', 'dot'), line(f.min_normal, '#d97706', 'dash'),
      line(f.max, '#7c3aed', 'solid')];
  }

  recompute() {
    const v = this.view;
    const d = this.doublings;
    this.output.textContent = d === 0 ? '×1' : `×${powerText(2, d)}`;
    if (!v || v.step === null || v.min_exp === null || v.max_exp === null) return;
    const { min_exp: minExp, max_exp: maxExp } = v;
    const base = this.baseScale(v);
    const scale = base * 2 ** d;
    this.rows = v.layers.map((name, i) => ({ name, ...sharesAt(v.counts[i], minExp, maxExp, scale, v.format) }));
    // First to overflow first; layers without a finite non-zero value last; then model order.
    const order = this.rows.map((r, i) => [r.overflowDoublings ?? Infinity, i]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    this.body.replaceChildren(...order.map(([, i]) => this.row(this.rows[i])));
    const over = this.rows.filter((r) => r.overflow > 0).length;
    this.note.textContent = `sampled step ${v.step} · scale ${numberText(base)} × ${d === 0 ? 1 : powerText(2, d)} = ${numberText(scale)}`
      + ` · ${over} layer${over === 1 ? '' : 's'} would overflow · lines: flush to 0 (red, dotted), min normal (amber), max (purple)`;
    if (this.chart.data) Plotly.relayout(this.chart, { shapes: this.shapes(v.format, scale) });
  }

  /** @param {Shares & {name: string}} r */
  row(r) {
    const tr = el('tr');
    tr.dataset.layer = r.name;
    // No finite non-zero value: all zero (nothing can overflow), or NaN/inf (already did).
    const none = r.nonfinite > 0 ? 'already NaN/inf (no finite value)' : 'never (all zero)';
    const first = r.overflowDoublings === null ? none
      : (r.overflowDoublings <= 0 ? 'overflows now' : `at ×${powerText(2, r.overflowDoublings)}`);
    const cells = [
      el('td', 'layer-cell', r.name),
      el('td', 'num', pct(r.zero, r.total)),
      el('td', `num${r.flushed ? ' warn' : ''}`, pct(r.flushed, r.total)),
      el('td', 'num', pct(r.subnormal, r.total)),
      el('td', `num${r.overflow ? ' bad' : ''}`, pct(r.overflow, r.total)),
      el('td', 'num', pct(r.nonfinite, r.total)),
      el('td', 'num', first),
    ];
    cells[0].title = r.name;
    tr.append(...cells);
    return tr;
  }
}
