// Live updates of the compare page: one live socket per compared run (WS /api/runs/{id}/live,
// reconnecting with backoff and backfilling after the last id seen); the steps of every run are
// coalesced into at most `MAX_RATE` redraws a second for the whole page, each one
// Plotly.extendTraces call per chart (never a rebuilt chart).

import { LiveState, LiveStream } from './live.js';
import { Plotly, finiteOrNull } from './plot.js';

const MAX_RATE = 10;
const MAX_POINTS = 200000; // per trace: a live run keeps at most this many points drawn

/** The value a chart draws for a step (null: none). */
function valueOf(step, series) {
  const v = series === 'scale' ? step.scale_before : step[series];
  return v === null || v === undefined ? null : v;
}

export class CompareLive {
  /**
   * @param {{charts: object[], traces: Map<string, Map<string, {line: number, skipped?: number, lastStep: number}>>,
   *          ticks: Map<string, object>, onStatus: (runId: string, status: string) => void,
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
      const div = document.getElementById(chart.id);
      const byTrace = new Map(); // trace index → {x, y}
      const add = (index, x, y) => {
        if (!byTrace.has(index)) byTrace.set(index, { x: [], y: [] });
        byTrace.get(index).x.push(x);
        byTrace.get(index).y.push(y);
      };
      const ticks = this.page.ticks.get(chart.id);
      for (const [runId, steps] of batches) {
        const trace = this.page.traces.get(chart.id).get(runId);
        if (!trace) continue;
        for (const s of steps) {
          if (s.step <= trace.lastStep) continue; // already drawn (from /series or a backfill)
          const v = valueOf(s, chart.series);
          if (v === null) continue;
          trace.lastStep = s.step;
          add(trace.line, s.step, finiteOrNull(v));
          if (ticks) ticks.widen([v]);
          if (trace.skipped !== undefined && s.skipped) add(trace.skipped, s.step, finiteOrNull(s.scale_before));
        }
      }
      if (!byTrace.size) continue;
      const indices = [...byTrace.keys()];
      Plotly.extendTraces(div, { x: indices.map((i) => byTrace.get(i).x), y: indices.map((i) => byTrace.get(i).y) },
        indices, MAX_POINTS);
      const relayout = ticks && ticks.update();
      if (relayout) Plotly.relayout(div, relayout);
    }
    this.flushes += 1;
    this.page.onDrawn();
  }
}
