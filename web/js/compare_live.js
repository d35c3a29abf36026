// Live updates of the compare page: one live socket per compared run (WS /api/runs/{id}/live,
// reconnecting with backoff and backfilling after the last id seen); the steps of every run are
// coalesced into at most `MAX_RATE` redraws a second for the whole page, each one
// Plotly.extendTraces call per chart (never a rebuilt chart).

import { LiveState, LiveStream } from './live.js';
import { Plotly } from './plot.js';

const MAX_RATE = 10;
const MAX_POINTS = 200000; // per trace: a live run keeps at most this many points drawn

export class CompareLive {
  /**
   * @param {{charts: import('./compare_charts.js').CompareChart[], onStatus: (runId: string, status: string) => void,
   *          onState: (state: string) => void, onDrawn: () => void}} page
   * @param {Map<string, number>} lastIds  run id → the last step id already drawn
   */
  constructor(page, lastIds) {
    this.page = page;
    this.lastIds = lastIds;
    this.streams = new Map();
    this.states = new Map();
    this.pending = [];
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

  /** The page's indicator: the least healthy socket's state. */
  onState(runId, state) {
    this.states.set(runId, state);
    const order = [LiveState.CLOSED, LiveState.RETRYING, LiveState.CONNECTING, LiveState.OPEN];
    const worst = order.find((s) => [...this.states.values()].includes(s)) ?? LiveState.OPEN;
    this.page.onState(worst);
  }

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
      const groups = { plain: new Map(), line: new Map(), text: new Map() };
      const add = (index, x, y, extra) => {
        const group = extra === undefined ? groups.plain : (extra.size === undefined ? groups.text : groups.line);
        if (!group.has(index)) group.set(index, { x: [], y: [], 'marker.size': [], customdata: [] });
        const g = group.get(index);
        g.x.push(x);
        g.y.push(y);
        if (extra !== undefined) g.customdata.push(extra.text);
        if (extra !== undefined && extra.size !== undefined) g['marker.size'].push(extra.size);
      };
      for (const [runId, steps] of batches) chart.collect(runId, steps, add);
      const keys = { plain: ['x', 'y'], line: ['x', 'y', 'marker.size', 'customdata'], text: ['x', 'y', 'customdata'] };
      for (const [name, group] of Object.entries(groups)) {
        if (!group.size) continue;
        const indices = [...group.keys()];
        const update = {};
        for (const key of keys[name]) update[key] = indices.map((i) => group.get(i)[key]);
        Plotly.extendTraces(chart.div, update, indices, MAX_POINTS);
      }
      const relayout = chart.tickUpdate();
      if (relayout) Plotly.relayout(chart.div, relayout);
    }
    this.flushes += 1;
    this.page.onDrawn();
  }
}
