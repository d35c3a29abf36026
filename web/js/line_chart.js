// @ts-check
// A per-step scalar (loss, grad norm) as a line. Non-finite values are gaps in the line and red
// ticks along the top edge, so a NaN loss is seen rather than silently dropped. An EMA smoothing
// (TensorBoard style: debiased, the raw line kept faint under the bold smoothed one) is drawn on
// top; live steps extend both lines, the smoothing carrying on from its last state.

import { COLORS, CONFIG, LogTicks, Plotly, finiteOrNull, themedLayout } from './plot.js';
import { ema } from './smoothing.js';

/** @import { Series, Step } from './codec.js' */

const MAX_POINTS = 100000;
// Trace indices (the raw line and the non-finite ticks keep the indices they always had).
const LINE = 0;
const NONFINITE = 1;
const SMOOTH = 2;

export class LineChart {
  /**
   * @param {PlotDiv} div
   * @param {{runId: string, field: 'loss' | 'grad_norm', label: string, color: string, log?: boolean}} opts
   */
  constructor(div, { runId, field, label, color, log = false }) {
    this.div = div;
    this.runId = runId;
    this.field = field;
    this.label = label;
    this.color = color;
    this.log = log;
    this.lastStep = -Infinity;
    this.ticks = new LogTicks('yaxis', 10); // fed on either axis: a log/linear toggle may need it
    this.weight = 0;
    /** @type {number[]} the raw line's steps and values, non-finite included (the smoothing input) */
    this.xs = [];
    /** @type {(number | null)[]} */
    this.values = [];
    this.ema = ema(0);
  }

  /**
   * series: /series/{field}; a bucket's `last` is drawn, and any non-finite min/max is flagged.
   * @param {Series} series
   * @param {number} [weight]  the smoothing's
   */
  async init(series, weight = 0) {
    const pts = series.points;
    this.weight = weight;
    this.xs = pts.map((p) => p.step);
    this.values = pts.map((p) => p.last);
    const bad = pts.filter((p) => [p.min, p.max, p.last].some((v) => typeof v === 'number' && !Number.isFinite(v)));
    this.ticks.widen(pts.flatMap((p) => [p.min, p.max]));
    this.lastStep = pts.length ? pts[pts.length - 1].step : -Infinity;
    this.ema = ema(weight);
    const smooth = this.values.map((v) => this.ema.push(v));
    const traces = [
      { x: this.xs.slice(), y: this.values.map(finiteOrNull), type: 'scatter', mode: 'lines',
        name: `${this.label} (raw)`, line: { color: this.color, width: 1 }, opacity: this.rawOpacity(),
        connectgaps: false, hovertemplate: `raw %{y:.4g}<extra></extra>` },
      { x: bad.map((p) => p.step), y: bad.map(() => 1),
        type: 'scatter', mode: 'markers', yaxis: 'y2', name: 'non-finite',
        marker: { color: COLORS.skipped, symbol: 'line-ns-open', size: 10, line: { width: 2, color: COLORS.skipped } },
        hovertemplate: `${this.label} not finite (NaN or inf)<extra></extra>` },
      { x: this.xs.slice(), y: smooth, type: 'scatter', mode: 'lines', name: `${this.label} (smoothed)`,
        line: { color: this.color, width: 2.25 }, connectgaps: true, visible: weight > 0,
        hovertemplate: `smoothed %{y:.4g}<extra></extra>` },
    ];
    const layout = themedLayout(`${this.field}-${this.runId}`, {
      height: 260,
      hovermode: 'x unified',
      yaxis: { type: this.log ? 'log' : 'linear', title: { text: this.label, standoff: 6 },
        ...(this.log ? this.ticks.widen(pts.flatMap((p) => [p.min, p.max])).attributes() : {}) },
      yaxis2: { overlaying: 'y', range: [0, 1.05], visible: false, fixedrange: true },
    });
    this.div.style.height = `${layout.height}px`; // responsive plots fill their div: size the div
    await Plotly.newPlot(this.div, traces, layout, CONFIG);
  }

  rawOpacity() {
    return this.weight > 0 ? 0.3 : 1;
  }

  /**
   * A new smoothing weight in [0, 1): the smoothed line is recomputed once, the raw one untouched.
   * @param {number} weight
   */
  setSmoothing(weight) {
    this.weight = weight;
    this.ema = ema(weight);
    const smooth = this.values.map((v) => this.ema.push(v));
    Plotly.restyle(this.div, { y: [smooth], x: [this.xs.slice()], visible: [weight > 0] }, [SMOOTH]);
    Plotly.restyle(this.div, { opacity: [this.rawOpacity()] }, [LINE]);
  }

  /** @param {Step[]} steps  live steps, in order */
  append(steps) {
    const fresh = steps.filter((s) => s.step > this.lastStep && s[this.field] !== null && s[this.field] !== undefined);
    if (!fresh.length) return;
    this.lastStep = fresh[fresh.length - 1].step;
    const bad = fresh.filter((s) => !Number.isFinite(s[this.field]));
    const x = fresh.map((s) => s.step);
    const v = fresh.map((s) => s[this.field]);
    this.xs.push(...x);
    this.values.push(...v);
    Plotly.extendTraces(this.div, {
      x: [x, bad.map((s) => s.step), x],
      y: [v.map(finiteOrNull), bad.map(() => 1), v.map((value) => this.ema.push(value))],
    }, [LINE, NONFINITE, SMOOTH], MAX_POINTS);
    this.ticks.widen(v);
    const relayout = this.log && this.ticks.update();
    if (relayout) Plotly.relayout(this.div, relayout);
  }

  /**
   * Replace the points inside [start, end] with a finer /series answer (zoom detail). Points
   * outside the range, live ones included, are kept; the smoothed line is recomputed.
   * @param {number} start
   * @param {number} end
   * @param {Series} series
   */
  replaceRange(start, end, series) {
    /** @type {number[]} */
    const keepBefore = [];
    /** @type {number[]} */
    const keepAfter = [];
    this.xs.forEach((x, i) => {
      if (x < start) keepBefore.push(i);
      else if (x > end) keepAfter.push(i);
    });
    const inside = series.points.filter((p) => p.step >= start && p.step <= end);
    /** @type {<T>(idx: number[], arr: T[]) => T[]} */
    const pick = (idx, arr) => idx.map((i) => arr[i]);
    this.xs = [...pick(keepBefore, this.xs), ...inside.map((p) => p.step), ...pick(keepAfter, this.xs)];
    this.values = [...pick(keepBefore, this.values), ...inside.map((p) => p.last), ...pick(keepAfter, this.values)];
    this.ema = ema(this.weight);
    const smooth = this.values.map((v) => this.ema.push(v));
    const bad = this.xs.filter((_, i) => typeof this.values[i] === 'number' && !Number.isFinite(this.values[i]));
    // The non-finite ticks: those outside the range stay, those inside come from min/max/last.
    const badInside = inside.filter((p) => [p.min, p.max, p.last].some((v) => typeof v === 'number' && !Number.isFinite(v)))
      .map((p) => p.step);
    const oldBad = this.div.data[NONFINITE].x.filter((x) => x < start || x > end);
    const ticks = [...new Set([...oldBad, ...badInside, ...bad])].sort((a, b) => a - b);
    Plotly.restyle(this.div, {
      x: [this.xs.slice(), ticks, this.xs.slice()],
      y: [this.values.map(finiteOrNull), ticks.map(() => 1), smooth],
    }, [LINE, NONFINITE, SMOOTH]);
  }

  /** Steps flagged non-finite (what the browser test reads). */
  get nonFinite() {
    return this.div.data ? this.div.data[NONFINITE].x.length : 0;
  }
}
