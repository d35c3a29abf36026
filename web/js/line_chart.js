// A per-step scalar (loss, grad norm) as a line. Non-finite values are gaps in the line and red
// ticks along the top edge, so a NaN loss is seen rather than silently dropped.

import { COLORS, CONFIG, LogTicks, Plotly, finiteOrNull, themedLayout } from './plot.js';

const MAX_POINTS = 100000;
const LINE = 0;
const NONFINITE = 1;

export class LineChart {
  /**
   * @param {HTMLElement} div
   * @param {{runId: string, field: string, label: string, color: string, log?: boolean}} opts
   */
  constructor(div, { runId, field, label, color, log = false }) {
    this.div = div;
    this.runId = runId;
    this.field = field;
    this.label = label;
    this.color = color;
    this.log = log;
    this.lastStep = -Infinity;
    this.ticks = log ? new LogTicks('yaxis', 10) : null;
  }

  /** series: /series/{field}; a bucket's `last` is drawn, and any non-finite min/max is flagged. */
  async init(series) {
    const pts = series.points;
    const bad = pts.filter((p) => [p.min, p.max, p.last].some((v) => typeof v === 'number' && !Number.isFinite(v)));
    this.lastStep = pts.length ? pts[pts.length - 1].step : -Infinity;
    const traces = [
      { x: pts.map((p) => p.step), y: pts.map((p) => finiteOrNull(p.last)), type: 'scatter', mode: 'lines',
        name: this.label, line: { color: this.color, width: 1.5 }, connectgaps: false,
        hovertemplate: `step %{x}<br>${this.label} %{y:.4g}<extra></extra>` },
      { x: bad.map((p) => p.step), y: bad.map(() => 1),
        type: 'scatter', mode: 'markers', yaxis: 'y2', name: 'non-finite',
        marker: { color: COLORS.skipped, symbol: 'line-ns-open', size: 10, line: { width: 2, color: COLORS.skipped } },
        hovertemplate: `step %{x}: ${this.label} not finite (NaN or inf)<extra></extra>` },
    ];
    const layout = themedLayout(`${this.field}-${this.runId}`, {
      height: 260,
      yaxis: { type: this.log ? 'log' : 'linear', title: { text: this.label, standoff: 6 },
        ...(this.ticks ? this.ticks.widen(pts.flatMap((p) => [p.min, p.max])).attributes() : {}) },
      yaxis2: { overlaying: 'y', range: [0, 1.05], visible: false, fixedrange: true },
    });
    this.div.style.height = `${layout.height}px`; // responsive plots fill their div: size the div
    await Plotly.newPlot(this.div, traces, layout, CONFIG);
  }

  append(steps) {
    const fresh = steps.filter((s) => s.step > this.lastStep && s[this.field] !== null && s[this.field] !== undefined);
    if (!fresh.length) return;
    this.lastStep = fresh[fresh.length - 1].step;
    const bad = fresh.filter((s) => !Number.isFinite(s[this.field]));
    Plotly.extendTraces(this.div, {
      x: [fresh.map((s) => s.step), bad.map((s) => s.step)],
      y: [fresh.map((s) => finiteOrNull(s[this.field])), bad.map(() => 1)],
    }, [LINE, NONFINITE], MAX_POINTS);
    const relayout = this.ticks && this.ticks.widen(fresh.map((s) => s[this.field])).update();
    if (relayout) Plotly.relayout(this.div, relayout);
  }

  /** Steps flagged non-finite (what the browser test reads). */
  get nonFinite() {
    return this.div.data ? this.div.data[NONFINITE].x.length : 0;
  }
}
