// @ts-check
// Rolling skip rate: the share of skipped steps among the last WINDOW steps. On load from the
// server (/skip-rate: bucket maxima, so a burst of skips is never averaged away, and the last
// window's steps; past 10,000 steps the maxima come from the rollups' skip counts, in blocks of
// at most WINDOW steps, and the tail is still the exact last window), then computed here from
// live steps' `skipped` flags, continuing the server's window exactly, and appended with
// Plotly.extendTraces.

import { COLORS, CONFIG, Plotly, themedLayout } from './plot.js';

/** @import { SkipRate } from './api.js' */
/** @import { Step } from './codec.js' */

export const WINDOW = 100;
const MAX_POINTS = 100000;

export class SkipRateChart {
  /**
   * @param {PlotDiv} div
   * @param {string} runId
   * @param {number} [window]  steps the rate is taken over
   */
  constructor(div, runId, window = WINDOW) {
    this.div = div;
    this.runId = runId;
    this.window = window;
    /** @type {[number, boolean][]} [step, skipped] of the current window, oldest first */
    this.recent = [];
    this.skippedInWindow = 0;
    this.lastStep = -Infinity;
  }

  /**
   * The rate after adding one step (steps in increasing order; repeats ignored by the caller).
   * @param {number} step
   * @param {boolean} skipped
   * @returns {number}
   */
  push(step, skipped) {
    this.recent.push([step, skipped]);
    if (skipped) this.skippedInWindow += 1;
    while (this.recent.length && this.recent[0][0] <= step - this.window) {
      const [, wasSkipped] = /** @type {[number, boolean]} (the loop tested there is one) */ (this.recent.shift());
      if (wasSkipped) this.skippedInWindow -= 1;
    }
    this.lastStep = step;
    return this.skippedInWindow / this.recent.length;
  }

  /**
   * The rolling rate after each step newer than the last one seen: {x: steps, y: rates}.
   * @param {Step[]} steps
   */
  rates(steps) {
    const x = [];
    const y = [];
    for (const s of steps) {
      if (s.step <= this.lastStep) continue;
      x.push(s.step);
      y.push(this.push(s.step, !!s.skipped));
    }
    return { x, y };
  }

  /**
   * body: /skip-rate (bucket maxima and the last window's [step, skipped], oldest first).
   * @param {SkipRate} body
   */
  async init(body) {
    for (const [step, skipped] of body.tail) this.push(step, skipped);
    const bx = body.points.map((p) => p.step);
    const by = body.points.map((p) => p.rate);
    const trace = {
      x: bx, y: by, type: 'scatter', mode: 'lines', name: `skip rate (last ${this.window} steps)`,
      line: { color: COLORS.skipped, width: 1.5, shape: 'hv' }, fill: 'tozeroy', fillcolor: 'rgba(220, 38, 38, 0.08)',
      hovertemplate: 'step %{x}<br>skip rate %{y:.1%}<extra></extra>',
    };
    const layout = themedLayout(`skiprate-${this.runId}`, {
      height: 180, showlegend: false,
      yaxis: { title: { text: 'skip rate', standoff: 6 }, tickformat: '.0%', rangemode: 'tozero' },
    });
    this.div.style.height = `${layout.height}px`;
    await Plotly.newPlot(this.div, [trace], layout, CONFIG);
  }

  /** @param {Step[]} steps  live steps, in order */
  append(steps) {
    const { x, y } = this.rates(steps);
    if (x.length) Plotly.extendTraces(this.div, { x: [x], y: [y] }, [0], MAX_POINTS);
  }

  /** The newest rate shown (what the browser test reads). */
  get current() {
    const y = this.div.data ? this.div.data[0].y : [];
    return y.length ? y[y.length - 1] : null;
  }
}
