// @ts-check
// Live updates of the compare page: one live socket per compared run (WS /api/runs/{id}/live,
// reconnecting with backoff and backfilling after the last id seen); the steps of every run are
// coalesced into at most `MAX_RATE` redraws a second for the whole page, each one
// Plotly.extendTraces call per chart (never a rebuilt chart).

import { LiveState, LiveStream } from './live.js';
import { Plotly } from './plot.js';

/** @import { AddPoint, CompareChart } from './compare_charts.js' */
/** @import { RunStatus, Step } from './codec.js' */

const MAX_RATE = 10;
const MAX_POINTS = 200000; // per trace: a live run keeps at most this many points drawn

/** A trace's new points, for one extendTraces. @typedef {{x: number[], y: (number | null)[], 'marker.size': number[], customdata: string[]}} Points */

export class CompareLive {
  /**
   * @param {{charts: CompareChart[], onStatus: (runId: string, status: RunStatus) => void,
   *          onState: (state: string) => void, onDrawn: () => void}} page
   * @param {Map<string, number>} lastIds  run id → the last step id already drawn
   */
  constructor(page, lastIds) {
    this.page = page;
    this.lastIds = lastIds;
    /** @type {Map<string, LiveStream>} */
    this.streams = new Map();
    /** @type {Map<string, string>} run id → its socket's LiveState */
    this.states = new Map();
    /** @type {[string, Step[]][]} [run id, steps] not drawn yet */
    this.pending = [];
    /** @type {number | null} */
    this.timer = null;
    this.lastFlush = 0;
    this.flushes = 0; // redraws so far (the browser test reads it)
  }

  start() {
    for (const [runId, lastId] of this.lastIds) {
      this.states.set(runId, LiveState.CONNECTING);
      this.streams.set(runId, new LiveStream(runId, lastId, {
        onSteps: (steps) => this.receive(runId, steps),
        onStatus: (status) => this.page.onStatus(runId, status),
        onState: (state) => this.onState(runId, state),
        maxRate: 1000, // this class coalesces across runs
      }).start());
    }
    return this;
  }

  stop() {
    for (const stream of this.streams.values()) stream.stop();
    clearTimeout(this.timer);
  }

  /**
   * The page's indicator: the least healthy socket's state.
   * @param {string} runId
   * @param {string} state
   */
  onState(runId, state) {
    this.states.set(runId, state);
    const order = [LiveState.CLOSED, LiveState.RETRYING, LiveState.CONNECTING, LiveState.OPEN];
    const worst = order.find((s) => [...this.states.values()].includes(s)) ?? LiveState.OPEN;
    this.page.onState(worst);
  }

  /**
   * @param {string} runId
   * @param {Step[]} steps
   */
  receive(runId, steps) {
    this.pending.push([runId, steps]);
    if (this.timer !== null) return;
    const wait = Math.max(0, this.lastFlush + 1000 / MAX_RATE - performance.now());
    this.timer = setTimeout(() => this.flush(), wait);
  }

  flush() {
    this.timer = null;
    const batches = this.pending;
    this.pending = [];
    if (!batches.length) return;
    this.lastFlush = performance.now();
    for (const chart of this.page.charts) {
      // One extendTraces per group of traces with the same attributes: x/y, plus the line's
      // marker sizes and hover text, plus the skip markers' hover text.
      /** @type {Record<'plain' | 'line' | 'text', Map<number, Points>>} trace index → its points */
      const groups = { plain: new Map(), line: new Map(), text: new Map() };
      /** @type {AddPoint} */
      const add = (index, x, y, extra) => {
        const group = extra === undefined ? groups.plain : (extra.size === undefined ? groups.text : groups.line);
        let g = group.get(index);
        if (!g) {
          g = { x: [], y: [], 'marker.size': [], customdata: [] };
          group.set(index, g);
        }
        g.x.push(x);
        g.y.push(y);
        if (extra !== undefined) g.customdata.push(extra.text);
        if (extra !== undefined && extra.size !== undefined) g['marker.size'].push(extra.size);
      };
      for (const [runId, steps] of batches) chart.collect(runId, steps, add);
      /** @type {Record<'plain' | 'line' | 'text', (keyof Points)[]>} */
      const keys = { plain: ['x', 'y'], line: ['x', 'y', 'marker.size', 'customdata'], text: ['x', 'y', 'customdata'] };
      for (const name of /** @type {const} */ (['plain', 'line', 'text'])) {
        const group = groups[name];
        if (!group.size) continue;
        const indices = [...group.keys()];
        /** @type {PlotExtension} */
        const update = {};
        for (const key of keys[name]) update[key] = indices.map((i) => /** @type {Points} */ (group.get(i))[key]);
        Plotly.extendTraces(chart.div, update, indices, MAX_POINTS);
      }
      const relayout = chart.tickUpdate();
      if (relayout) Plotly.relayout(chart.div, relayout);
    }
    this.flushes += 1;
    this.page.onDrawn();
  }
}
