// @ts-check
// The compare page's step charts (loss scale, loss, grad norm): each run in its own colour, with
// what the run page shows for one run: a failing run stays visible. Non-finite steps are ticks
// along the top edge (one row per run), a finite point between NaN/inf gaps gets a marker (a
// line through one point draws nothing), a scale that reached 0 sits on the log axis's floor,
// and loss and grad norm carry an EMA smoothing (the raw line kept faint under it).

import { logFloor, onLogAxis } from './axis_scale.js';
import { CONFIG, LogTicks, Plotly, finiteOrNull, plotText, themedLayout } from './plot.js';
import { scaleText } from './format.js';
import { ema } from './smoothing.js';

/** @import { RunEvent, Series, Step } from './codec.js' */
/** @import { Ema } from './smoothing.js' */
/** @import { StepRange } from './zoom.js' */

/**
 * One of the page's charts: its div's id, the /series it draws, its y axis.
 * @typedef {{id: string, series: 'scale' | 'loss' | 'grad_norm', label: string, height: number,
 *   base: number, log: boolean}} ChartSpec
 */

/**
 * A run's data on the page: its three series and the skipped steps of its first page of events.
 * @typedef {{id: string, scale: Series, loss: Series, grad_norm: Series, skipped: RunEvent[]}} RunSeries
 */

/**
 * A run's traces on a chart (their indices) and what its live points carry on from.
 * @typedef {object} Slot
 * @property {number} line
 * @property {number} bad  the non-finite ticks
 * @property {number} [smooth]  the smoothed line (loss and grad norm)
 * @property {number} [skipped]  the skip markers (the scale)
 * @property {number} lastStep
 * @property {number[]} xs  the line's steps and values (the smoothing's input)
 * @property {(number | null)[]} values
 * @property {Ema} ema
 * @property {number} row  the run's row of non-finite ticks
 * @property {boolean} lastFinite
 */

/**
 * Collects a live point of trace `index` (compare_live.js); `extra`: the line's marker size and
 * hover text, or a skip marker's text.
 * @typedef {(index: number, x: number, y: number | null, extra?: {size?: number, text: string}) => void} AddPoint
 */

/** @type {ReadonlyArray<ChartSpec>} */
export const CHARTS = Object.freeze([
  { id: 'scale-chart', series: 'scale', label: 'loss scale', height: 300, base: 2, log: true },
  { id: 'loss-chart', series: 'loss', label: 'loss', height: 280, base: 10, log: false },
  { id: 'gradnorm-chart', series: 'grad_norm', label: 'grad norm', height: 280, base: 10, log: true },
]);
const ISOLATED_PX = 6; // marker size of a finite point without finite neighbours
const TICK_ROW = 0.05; // paper height between two runs' rows of non-finite ticks

/** @param {unknown} v */
const isBad = (v) => typeof v === 'number' && !Number.isFinite(v);

/**
 * Marker sizes: ISOLATED_PX where a finite value has no finite neighbour, else 0.
 * @param {(number | null)[]} values
 * @returns {number[]}
 */
export function isolatedSizes(values) {
  const finite = values.map((v) => typeof v === 'number' && Number.isFinite(v));
  return finite.map((f, i) => (f && !finite[i - 1] && !finite[i + 1] ? ISOLATED_PX : 0));
}

export class CompareChart {
  /**
   * @param {ChartSpec} spec  one of CHARTS
   * @param {{colors: Map<string, string>, runName: (id: string) => string}} page
   */
  constructor(spec, page) {
    this.spec = spec;
    this.page = page;
    this.div = /** @type {PlotDiv} compare.html has each chart's div */ (document.getElementById(spec.id));
    this.ticks = new LogTicks('yaxis', spec.base);
    /** @type {Map<string, Slot>} run id → its slot */
    this.slots = new Map();
    this.floor = logFloor(this.ticks); // the log axis's floor, from the data (draw)
    this.weight = 0;
    this.log = spec.log;
  }

  get smoothed() { return this.spec.series !== 'scale'; }

  /**
   * y for a value on this chart: the scale's zeros on the floor, non-finite values as gaps.
   * @param {number | null} v
   */
  y(v) {
    return this.spec.series === 'scale' ? onLogAxis(v, this.floor) : finiteOrNull(v);
  }

  /**
   * @param {RunSeries[]} perRun
   * @param {object[]} shapes  the divergence lines
   * @param {number} weight  the smoothing's
   */
  async draw(perRun, shapes, weight) {
    this.weight = weight;
    for (const run of perRun) this.ticks.widen(run[this.spec.series].points.flatMap((p) => [p.min, p.max, p.last]));
    this.floor = logFloor(this.ticks);
    /** @type {object[]} */
    const traces = [];
    perRun.forEach((run, row) => traces.push(...this.runTraces(run, row, traces.length)));
    const layout = themedLayout(`compare-${this.spec.series}`, {
      height: this.spec.height,
      hovermode: 'x unified',
      shapes,
      yaxis: { type: this.log ? 'log' : 'linear', title: { text: this.spec.label, standoff: 6 },
        ...(this.log ? this.ticks.attributes() : {}) },
      yaxis2: { overlaying: 'y', range: [0, 1.05], visible: false, fixedrange: true },
    });
    this.div.style.height = `${layout.height}px`; // responsive plots fill their div: size the div
    await Plotly.newPlot(this.div, traces, layout, CONFIG);
  }

  /**
   * A run's traces, the first at index `first`; its slot is kept.
   * @param {RunSeries} run
   * @param {number} row  its position among the runs
   * @param {number} first
   * @returns {object[]}
   */
  runTraces(run, row, first) {
    const color = this.page.colors.get(run.id);
    const name = plotText(this.page.runName(run.id));
    const pts = run[this.spec.series].points;
    const xs = pts.map((p) => p.step);
    const values = pts.map((p) => p.last);
    const scale = this.spec.series === 'scale';
    /** @type {Slot} */
    const slot = { line: first, bad: first + 1, lastStep: xs.length ? xs[xs.length - 1] : -Infinity,
      xs: xs.slice(), values: values.slice(), ema: ema(this.weight), row,
      lastFinite: values.length ? Number.isFinite(values[values.length - 1]) : false };
    const badSteps = pts.filter((p) => [p.min, p.max, p.last].some(isBad)).map((p) => p.step);
    /** @type {object[]} */
    const traces = [
      { x: xs, y: values.map((v) => this.y(v)), type: 'scatter', mode: 'lines+markers', name,
        legendgroup: run.id, meta: run.id, connectgaps: false,
        line: { color, width: this.smoothed ? 1.2 : 1.8, shape: scale ? 'hv' : 'linear' },
        marker: { color, size: isolatedSizes(values) }, opacity: this.rawOpacity(),
        customdata: values.map((v) => (scale ? scaleText(v) : String(v))),
        hovertemplate: scale ? '%{customdata}' : '%{y:.4g}' },
      { x: badSteps, y: badSteps.map(() => 1 - TICK_ROW * row), type: 'scatter', mode: 'markers', yaxis: 'y2',
        name: `${name} not finite`, legendgroup: run.id, meta: run.id, showlegend: false,
        marker: { color, symbol: 'line-ns-open', size: 10, line: { width: 2, color } },
        hovertemplate: `${name}: not finite (NaN or inf)<extra></extra>` },
    ];
    if (this.smoothed) {
      slot.smooth = first + traces.length;
      traces.push({ x: xs.slice(), y: values.map((v) => slot.ema.push(v)), type: 'scatter', mode: 'lines',
        name: `${name} (smoothed)`, legendgroup: run.id, meta: run.id, showlegend: false, connectgaps: true,
        visible: this.weight > 0, line: { color, width: 2.25 }, hovertemplate: 'smoothed %{y:.4g}' });
    }
    if (scale) {
      slot.skipped = first + traces.length;
      traces.push({
        x: run.skipped.map((e) => e.step), y: run.skipped.map((e) => this.y(e.scale_before)),
        customdata: run.skipped.map((e) => scaleText(e.scale_before)),
        type: 'scatter', mode: 'markers', name: `${name} skipped`, legendgroup: run.id, meta: run.id,
        showlegend: false, marker: { color, symbol: 'x-thin-open', size: 9, line: { width: 2, color } },
        hovertemplate: 'skipped (overflow) at scale %{customdata}',
      });
    }
    this.slots.set(run.id, slot);
    return traces;
  }

  rawOpacity() {
    return this.smoothed && this.weight > 0 ? 0.35 : 1;
  }

  /**
   * A new smoothing weight in [0, 1): each run's smoothed line is recomputed once.
   * @param {number} weight
   */
  setSmoothing(weight) {
    if (!this.smoothed || !this.div.data) return;
    this.weight = weight;
    /** @type {(number | null)[][]} */
    const smooth = [];
    /** @type {number[][]} */
    const x = [];
    /** @type {number[]} */
    const indices = [];
    /** @type {number[]} */
    const lines = [];
    for (const slot of this.slots.values()) {
      slot.ema = ema(weight);
      smooth.push(slot.values.map((v) => slot.ema.push(v)));
      x.push(slot.xs.slice());
      indices.push(/** @type {number} a smoothed chart's slots have one */ (slot.smooth));
      lines.push(slot.line);
    }
    Plotly.restyle(this.div, { x, y: smooth, visible: weight > 0 }, indices);
    Plotly.restyle(this.div, { opacity: this.rawOpacity() }, lines);
  }

  /**
   * Live steps of one run into per-trace arrays: `add(index, x, y, extra)` collects them for one
   * extendTraces per chart (compare_live.js).
   * @param {string} runId
   * @param {Step[]} steps
   * @param {AddPoint} add
   */
  collect(runId, steps, add) {
    const slot = this.slots.get(runId);
    if (!slot) return;
    for (const s of steps) {
      if (s.step <= slot.lastStep) continue; // already drawn (from /series or a backfill)
      const v = this.spec.series === 'scale' ? s.scale_before : s[this.spec.series];
      if (v === null || v === undefined) continue;
      slot.lastStep = s.step;
      slot.xs.push(s.step);
      slot.values.push(v);
      this.ticks.widen([v]);
      const finite = Number.isFinite(v);
      // The newest point has no right neighbour yet: marked when its left one is not finite.
      add(slot.line, s.step, this.y(v), { size: finite && !slot.lastFinite ? ISOLATED_PX : 0,
        text: this.spec.series === 'scale' ? scaleText(v) : String(v) });
      slot.lastFinite = finite;
      if (!finite) add(slot.bad, s.step, 1 - TICK_ROW * slot.row);
      if (slot.smooth !== undefined) add(slot.smooth, s.step, slot.ema.push(v));
      if (slot.skipped !== undefined && s.skipped) {
        add(slot.skipped, s.step, this.y(s.scale_before), { text: scaleText(s.scale_before) });
      }
    }
  }

  /**
   * Zoom detail: each run's points inside [start, end] replaced by a finer /series answer
   * (`bodies[i]` for `ids[i]`); points outside, live ones included, are kept; markers, ticks and
   * the smoothing are recomputed.
   * @param {StepRange} range
   * @param {string[]} ids
   * @param {Series[]} bodies
   */
  replaceRange({ start, end }, ids, bodies) {
    /** @type {{x: number[][], y: (number | null)[][], size: number[][], text: string[][], indices: number[]}} */
    const lines = { x: [], y: [], size: [], text: [], indices: [] };
    /** @type {{x: number[][], y: (number | null)[][], indices: number[]}} */
    const rest = { x: [], y: [], indices: [] };
    ids.forEach((id, i) => {
      const slot = this.slots.get(id);
      if (!slot) return;
      const inside = bodies[i].points.filter((p) => p.step >= start && p.step <= end);
      /** @type {(x: number, value: number | null) => [number, number | null]} */
      const point = (x, value) => [x, value];
      const keep = slot.xs.map((x, j) => point(x, slot.values[j])).filter(([x]) => x < start || x > end);
      const merged = [...keep.filter(([x]) => x < start), ...inside.map((p) => point(p.step, p.last)),
        ...keep.filter(([x]) => x > end)];
      slot.xs = merged.map(([x]) => x);
      slot.values = merged.map(([, v]) => v);
      const scale = this.spec.series === 'scale';
      lines.x.push(slot.xs.slice());
      lines.y.push(slot.values.map((v) => this.y(v)));
      lines.size.push(isolatedSizes(slot.values));
      lines.text.push(slot.values.map((v) => (scale ? scaleText(v) : String(v))));
      lines.indices.push(slot.line);
      const old = this.div.data[slot.bad].x.filter((x) => x < start || x > end);
      const fresh = inside.filter((p) => [p.min, p.max, p.last].some(isBad)).map((p) => p.step);
      const bad = [...new Set([...old, ...fresh])].sort((a, b) => a - b);
      rest.x.push(bad);
      rest.y.push(bad.map(() => 1 - TICK_ROW * slot.row));
      rest.indices.push(slot.bad);
      if (slot.smooth !== undefined) {
        slot.ema = ema(this.weight);
        rest.x.push(slot.xs.slice());
        rest.y.push(slot.values.map((v) => slot.ema.push(v)));
        rest.indices.push(slot.smooth);
      }
    });
    if (!lines.indices.length) return;
    Plotly.restyle(this.div, { x: lines.x, y: lines.y, 'marker.size': lines.size, customdata: lines.text },
      lines.indices);
    Plotly.restyle(this.div, { x: rest.x, y: rest.y }, rest.indices);
  }

  /**
   * A relayout for the log ticks once live values reached a new power, else null.
   * @returns {PlotUpdate | null}
   */
  tickUpdate() {
    return this.log ? this.ticks.update() : null;
  }
}
