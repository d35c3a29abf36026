// @ts-check
// Loss-scale chart: the scale in effect at each step on a log2 axis, skipped (overflow) steps as
// red markers, growth steps as green ones. Loaded once, then appended with Plotly.extendTraces.
// A scale of 0 (an exploding run backed off until it underflowed) is drawn on the axis's floor
// (axis_scale.js), so the line and every later skip marker stay visible.

import { logFloor, onLogAxis } from './axis_scale.js';
import { COLORS, CONFIG, LogTicks, Plotly, themedLayout } from './plot.js';
import { scaleText } from './format.js';

/** @import { RunEvent, Series, SeriesPoint, Step } from './codec.js' */

const MAX_POINTS = 100000;
// Trace indices.
const LOW = 0;
const HIGH = 1;
const LINE = 2;
const SKIPPED = 3;
const GROWTH = 4;

export class ScaleChart {
  /**
   * @param {PlotDiv} div
   * @param {string} runId
   */
  constructor(div, runId) {
    this.div = div;
    this.runId = runId;
    this.lastStep = -Infinity;
    this.ticks = new LogTicks('yaxis', 2);
    this.banded = false;
    /** @type {{skipped: Set<number>, growth: Set<number>}} steps that have their marker */
    this.marked = { skipped: new Set(), growth: new Set() };
    this.floor = 0.5;
  }

  /**
   * y on the log axis: zeros on the floor, non-finite values as gaps.
   * @param {number | null} v
   */
  y(v) {
    return onLogAxis(v, this.floor);
  }

  /** Lower the floor below any positive value seen so far (points drawn keep theirs). */
  lowerFloor() {
    this.floor = Math.min(this.floor, logFloor(this.ticks));
  }

  /**
   * The events not marked yet, by kind, now marked.
   * @param {RunEvent[]} events
   */
  unmarked(events) {
    /** @type {{skipped: RunEvent[], growth: RunEvent[]}} */
    const out = { skipped: [], growth: [] };
    for (const e of events) {
      if (e.kind !== 'skipped' && e.kind !== 'growth') continue; // the kinds with a marker
      const seen = this.marked[e.kind];
      if (seen.has(e.step)) continue;
      seen.add(e.step);
      out[e.kind].push(e);
    }
    return out;
  }

  /**
   * series: /series/scale (min/max/last per bucket); events: /events (may come later, through
   * addEvents: the chart is drawn as soon as its series is in).
   * @param {Series} series
   * @param {RunEvent[]} [events]
   */
  async init(series, events = []) {
    const pts = series.points;
    this.banded = series.downsampled;
    const x = pts.map((p) => p.step);
    for (const p of pts) this.ticks.widen([p.min, p.max]);
    for (const e of events) this.ticks.widen([e.scale_before, e.scale_after]);
    this.floor = logFloor(this.ticks);
    const { skipped, growth } = this.unmarked(events);
    const hover = 'step %{x}<br>scale %{customdata}<extra></extra>';
    /** @param {'min' | 'max'} key */
    const band = (key) => ({ x: this.banded ? x : [], y: this.banded ? pts.map((p) => this.y(p[key])) : [],
      customdata: this.banded ? pts.map((p) => scaleText(p[key])) : [] });
    const traces = [
      { ...band('min'), type: 'scatter', mode: 'lines', line: { width: 0, shape: 'hv' }, hoverinfo: 'skip',
        showlegend: false },
      { ...band('max'), type: 'scatter', mode: 'lines', line: { width: 0, shape: 'hv' }, fill: 'tonexty',
        fillcolor: COLORS.band, hoverinfo: 'skip', name: 'min–max per bucket', showlegend: this.banded },
      { x, y: pts.map((p) => this.y(p.last)), customdata: pts.map((p) => scaleText(p.last)),
        type: 'scatter', mode: 'lines', name: 'loss scale', line: { color: COLORS.scale, width: 2, shape: 'hv' },
        hovertemplate: hover },
      { x: skipped.map((e) => e.step), y: skipped.map((e) => this.y(e.scale_before)),
        customdata: skipped.map((e) => scaleText(e.scale_before)),
        type: 'scatter', mode: 'markers', name: 'skipped step (overflow)',
        marker: { color: COLORS.skipped, symbol: 'x-thin-open', size: 9, line: { width: 2, color: COLORS.skipped } },
        hovertemplate: 'step %{x} skipped<br>scale %{customdata}<extra></extra>' },
      { x: growth.map((e) => e.step), y: growth.map((e) => this.y(e.scale_after)),
        customdata: growth.map((e) => scaleText(e.scale_after)),
        type: 'scatter', mode: 'markers', name: 'growth',
        marker: { color: COLORS.growth, symbol: 'triangle-up', size: 7 },
        hovertemplate: 'step %{x}: scale grew to %{customdata}<extra></extra>' },
    ];
    this.lastStep = x.length ? x[x.length - 1] : -Infinity;
    const layout = themedLayout(`scale-${this.runId}`, {
      height: 300,
      yaxis: { type: 'log', title: { text: 'loss scale', standoff: 6 }, ...this.ticks.attributes() },
    });
    this.div.style.height = `${layout.height}px`; // responsive plots fill their div: size the div
    await Plotly.newPlot(this.div, traces, layout, CONFIG);
  }

  /**
   * Markers for events that arrived after the chart was drawn (a page of /events).
   * @param {RunEvent[]} events
   */
  addEvents(events) {
    const { skipped, growth } = this.unmarked(events);
    if (!skipped.length && !growth.length) return;
    for (const e of [...skipped, ...growth]) this.ticks.widen([e.scale_before, e.scale_after]);
    this.lowerFloor();
    Plotly.extendTraces(this.div, {
      x: [skipped.map((e) => e.step), growth.map((e) => e.step)],
      y: [skipped.map((e) => this.y(e.scale_before)), growth.map((e) => this.y(e.scale_after))],
      customdata: [skipped.map((e) => scaleText(e.scale_before)), growth.map((e) => scaleText(e.scale_after))],
    }, [SKIPPED, GROWTH], MAX_POINTS);
    const relayout = this.ticks.update();
    if (relayout) Plotly.relayout(this.div, relayout);
  }

  /**
   * Append live steps (already decoded, in order); steps at or before the last drawn are ignored.
   * @param {Step[]} steps
   */
  append(steps) {
    const fresh = steps.filter((s) => s.step > this.lastStep);
    if (!fresh.length) return;
    this.lastStep = fresh[fresh.length - 1].step;
    for (const s of fresh) this.ticks.widen([s.scale_before, s.scale_after]);
    this.lowerFloor();
    const x = fresh.map((s) => s.step);
    const y = fresh.map((s) => this.y(s.scale_before));
    const text = fresh.map((s) => scaleText(s.scale_before));
    const skipped = fresh.filter((s) => s.skipped && !this.marked.skipped.has(s.step));
    // Absent scales cannot be compared: no growth (the server's rule, series_math.scale_events).
    const growth = fresh.filter((s) => !s.skipped && s.scale_after !== null && s.scale_before !== null
      && s.scale_after > s.scale_before && !this.marked.growth.has(s.step));
    for (const s of skipped) this.marked.skipped.add(s.step);
    for (const s of growth) this.marked.growth.add(s.step);

    /** @type {{x: unknown[][], y: unknown[][], customdata: unknown[][]}} */
    const update = { x: [x, skipped.map((s) => s.step), growth.map((s) => s.step)],
      y: [y, skipped.map((s) => this.y(s.scale_before)), growth.map((s) => this.y(s.scale_after))],
      customdata: [text, skipped.map((s) => scaleText(s.scale_before)), growth.map((s) => scaleText(s.scale_after))] };
    const indices = [LINE, SKIPPED, GROWTH];
    if (this.banded) {
      update.x.push(x, x);
      update.y.push(y, y);
      update.customdata.push(text, text);
      indices.push(LOW, HIGH);
    }
    Plotly.extendTraces(this.div, update, indices, MAX_POINTS);

    const relayout = this.ticks.update();
    if (relayout) Plotly.relayout(this.div, relayout);
  }

  /**
   * Replace the points inside [start, end] with a finer /series/scale answer (zoom detail);
   * points outside the range, live ones included, are kept.
   * @param {number} start
   * @param {number} end
   * @param {Series} series
   */
  replaceRange(start, end, series) {
    const inside = series.points.filter((p) => p.step >= start && p.step <= end);
    /**
     * @param {PlotTrace} trace
     * @param {'x' | 'y' | 'customdata'} key  an attribute every trace of this chart has
     * @param {(p: SeriesPoint) => unknown} of
     */
    const merge = (trace, key, of) => {
      const xs = trace.x;
      const values = /** @type {unknown[]} */ (trace[key]);
      /** @type {number[]} */
      const before = [];
      /** @type {number[]} */
      const after = [];
      xs.forEach((x, i) => { if (x < start) before.push(i); else if (x > end) after.push(i); });
      return [...before.map((i) => values[i]), ...inside.map(of), ...after.map((i) => values[i])];
    };
    const indices = [LINE];
    const line = this.div.data[LINE];
    /** @type {{x: unknown[][], y: unknown[][], customdata: unknown[][]}} */
    const update = {
      x: [merge(line, 'x', (p) => p.step)],
      y: [merge(line, 'y', (p) => this.y(p.last))],
      customdata: [merge(line, 'customdata', (p) => scaleText(p.last))],
    };
    if (this.banded) {
      for (const [index, key] of /** @type {const} */ ([[LOW, 'min'], [HIGH, 'max']])) {
        const trace = this.div.data[index];
        update.x.push(merge(trace, 'x', (p) => p.step));
        update.y.push(merge(trace, 'y', (p) => this.y(p[key])));
        update.customdata.push(merge(trace, 'customdata', (p) => scaleText(p[key])));
        indices.push(index);
      }
    }
    Plotly.restyle(this.div, update, indices);
  }

  /** Points on the scale line (what the browser test reads). */
  get length() {
    return this.div.data ? this.div.data[LINE].x.length : 0;
  }
}
