// @ts-check
// Per-optimizer view (wire v4 `optimizers`, sent only by runs with several optimizers or
// parameter groups): for each optimizer a line saying how many steps it skipped and which, and a
// chart of its groups' lr over the steps ("optimizer 0, group 1"), its skipped steps as red ✕
// along the top edge and any NaN/inf lr as a red tick along the bottom (a gap in the line, never
// dropped). Loaded from /optimizers, then carried on from the live steps' `optimizers`. Runs
// without the block show nothing. Text only (textContent).

import { getOptimizers } from './api.js';
import { PALETTE } from './colors.js';
import { el, numberText } from './format.js';
import { COLORS, CONFIG, LogTicks, Plotly, finiteOrNull, themedLayout } from './plot.js';

/** @import { OptimizerEntryOf, OptimizerTrack, SeriesPoint, Step } from './codec.js' */
/** @typedef {OptimizerEntryOf<number>} OptimizerEntry  one optimizer's part of a live step */
/** @typedef {Step & {optimizers: OptimizerEntry[]}} StepWithOptimizers */

const MAX_POINTS = 100000;
const LISTED = 8; // skipped steps named one by one; past that, "and N more"
// Trace indices; group i's line is trace GROUPS + its position among the charted groups.
const SKIPPED = 0;
const NONFINITE = 1;
const GROUPS = 2;

/**
 * @param {number} optimizer
 * @param {number} group
 */
export function groupLabel(optimizer, group) {
  return `optimizer ${optimizer}, group ${group}`;
}

/**
 * "optimizer 1 · 2 parameter groups · skipped 3 of 20 steps: 5, 9, 13".
 * @param {OptimizerTrack} track
 */
export function optimizerText(track) {
  const groups = `${track.groups} parameter ${track.groups === 1 ? 'group' : 'groups'}`;
  const steps = `${track.steps} ${track.steps === 1 ? 'step' : 'steps'}`;
  let skips = `no step skipped of ${steps}`;
  if (track.skipped > 0) {
    const listed = track.skipped_steps.slice(0, LISTED).join(', ');
    const more = track.skipped > LISTED ? ` and ${track.skipped - LISTED} more` : '';
    skips = `skipped ${track.skipped} of ${steps}: ${listed}${more}`;
  }
  const unknown = track.unknown > 0 ? ` · ${track.unknown} did not say whether skipped` : '';
  return `optimizer ${track.optimizer} · ${groups} · ${skips}${unknown}`;
}

/** @param {OptimizerTrack} track */
function lrValues(track) {
  return track.lr.flatMap((g) => g.points.flatMap((p) => [p.min, p.max, p.last]));
}

/** One optimizer: its line of text and its chart. */
class OptimizerBlock {
  /**
   * @param {HTMLElement} parent
   * @param {OptimizerTrack} track  from /optimizers (or an empty one for live steps)
   * @param {string} runId
   */
  constructor(parent, track, runId) {
    this.track = { ...track, skipped_steps: [...track.skipped_steps] };
    this.note = el('p', 'optimizer-note');
    this.note.dataset.optimizer = String(track.optimizer);
    this.div = /** @type {PlotDiv} plotly.js draws into it (init) */ (el('div', 'chart optimizer-chart'));
    this.div.dataset.optimizer = String(track.optimizer);
    parent.append(this.note, this.div);
    this.runId = runId;
    this.ticks = new LogTicks('yaxis', 10);
    this.log = lrValues(track).every((v) => typeof v !== 'number' || !Number.isFinite(v) || v > 0);
    /** @type {Map<number, number>} group → trace index */
    this.traceOf = new Map();
  }

  /**
   * A group's lr line.
   * @param {number} optimizer
   * @param {number} group
   * @param {SeriesPoint[]} points
   */
  lineTrace(optimizer, group, points) {
    const label = groupLabel(optimizer, group);
    return {
      x: points.map((p) => p.step), y: points.map((p) => finiteOrNull(p.last)),
      customdata: points.map((p) => numberText(p.last)), type: 'scatter', mode: 'lines',
      name: label, line: { color: PALETTE[group % PALETTE.length], width: 1.5, shape: 'hv' },
      connectgaps: false, hovertemplate: `${label}: lr %{customdata}<extra></extra>`,
    };
  }

  async init() {
    const t = this.track;
    /** @type {{step: number, text: string}[]} */
    const bad = [];
    for (const g of t.lr) {
      for (const p of g.points) {
        const value = [p.last, p.min, p.max].find((v) => typeof v === 'number' && !Number.isFinite(v));
        if (value !== undefined) bad.push({ step: p.step, text: `${groupLabel(t.optimizer, g.group)}: lr ${numberText(value)}` });
      }
    }
    /** @type {object[]} */
    const traces = [
      { x: [...t.skipped_steps], y: t.skipped_steps.map(() => 1), customdata: t.skipped_steps.map(() => null),
        type: 'scatter', mode: 'markers',
        yaxis: 'y2', name: `optimizer ${t.optimizer} skipped step`,
        marker: { color: COLORS.skipped, symbol: 'x-thin-open', size: 9, line: { width: 2, color: COLORS.skipped } },
        hovertemplate: `step %{x}: optimizer ${t.optimizer} skipped<extra></extra>` },
      { x: bad.map((b) => b.step), y: bad.map(() => 0), customdata: bad.map((b) => b.text),
        type: 'scatter', mode: 'markers', yaxis: 'y2', name: 'lr not finite (NaN or inf)',
        marker: { color: COLORS.skipped, symbol: 'line-ns-open', size: 10, line: { width: 2, color: COLORS.skipped } },
        hovertemplate: 'step %{x}: %{customdata}<extra></extra>' },
    ];
    t.lr.forEach((g, i) => {
      this.traceOf.set(g.group, GROUPS + i);
      traces.push(this.lineTrace(t.optimizer, g.group, g.points));
    });
    this.ticks.widen(lrValues(t));
    const layout = themedLayout(`optimizer-${t.optimizer}-${this.runId}`, {
      height: 220,
      hovermode: 'x unified',
      yaxis: { type: this.log ? 'log' : 'linear', title: { text: 'lr', standoff: 6 },
        ...(this.log ? this.ticks.attributes() : {}) },
      yaxis2: { overlaying: 'y', range: [-0.05, 1.05], visible: false, fixedrange: true },
    });
    this.div.style.height = `${layout.height}px`; // responsive plots fill their div: size the div
    this.render();
    await Plotly.newPlot(this.div, traces, layout, CONFIG);
  }

  render() {
    this.note.textContent = optimizerText(this.track);
    this.note.classList.toggle('warn', this.track.skipped > 0);
  }

  /**
   * [step, that step's entry for this optimizer] pairs, in step order, not drawn yet.
   * @param {[number, OptimizerEntry][]} entries
   */
  async append(entries) {
    const t = this.track;
    /** @type {number[]} */
    const skipped = [];
    /** @type {{step: number, text: string}[]} */
    const bad = [];
    /** @type {Map<number, [number, number][]>} group → [step, lr] */
    const byGroup = new Map();
    for (const [step, o] of entries) {
      t.steps += 1;
      if (o.skipped === null || o.skipped === undefined) t.unknown += 1;
      else if (o.skipped) {
        t.skipped += 1;
        t.skipped_steps.push(step);
        skipped.push(step);
      }
      t.groups = Math.max(t.groups, o.lr.length);
      o.lr.forEach((lr, group) => {
        if (lr === null) return;
        let points = byGroup.get(group);
        if (!points) {
          points = [];
          byGroup.set(group, points);
        }
        points.push([step, lr]);
        if (!Number.isFinite(lr)) bad.push({ step, text: `${groupLabel(t.optimizer, group)}: lr ${numberText(lr)}` });
      });
    }
    this.render();
    const values = [...byGroup.values()].flat().map(([, lr]) => lr);
    if (this.log && values.some((v) => Number.isFinite(v) && v <= 0)) {
      this.log = false; // a zero lr (warm-up, a frozen group) has no place on a log axis
      await Plotly.relayout(this.div, { 'yaxis.type': 'linear', 'yaxis.tickmode': 'auto' });
    }
    const fresh = [...byGroup.keys()].filter((g) => !this.traceOf.has(g)).sort((a, b) => a - b);
    if (fresh.length) {
      for (const g of fresh) this.traceOf.set(g, this.div.data.length + fresh.indexOf(g));
      await Plotly.addTraces(this.div, fresh.map((g) => this.lineTrace(t.optimizer, g, [])));
    }
    /** @type {{x: unknown[][], y: unknown[][], customdata: unknown[][]}} */
    const update = { x: [skipped, bad.map((b) => b.step)], y: [skipped.map(() => 1), bad.map(() => 0)],
      customdata: [skipped.map(() => null), bad.map((b) => b.text)] };
    const indices = [SKIPPED, NONFINITE];
    for (const [group, points] of byGroup) {
      update.x.push(points.map(([step]) => step));
      update.y.push(points.map(([, lr]) => finiteOrNull(lr)));
      update.customdata.push(points.map(([, lr]) => numberText(lr)));
      indices.push(/** @type {number} every group has its trace by now */ (this.traceOf.get(group)));
    }
    await Plotly.extendTraces(this.div, update, indices, MAX_POINTS);
    const relayout = this.log && this.ticks.widen(values).update();
    if (relayout) await Plotly.relayout(this.div, relayout);
  }
}

export class OptimizerPanel {
  /**
   * @param {HTMLElement} panel  the section, hidden until some step carries optimizers
   * @param {HTMLElement} body   where each optimizer's line and chart go
   * @param {string} runId
   */
  constructor(panel, body, runId) {
    this.panel = panel;
    this.body = body;
    this.runId = runId;
    /** @type {OptimizerBlock[]} by optimizer */
    this.blocks = [];
    this.lastStep = -Infinity;
    this.queue = Promise.resolve(); // loads and live appends, one after another
  }

  /** @param {number} maxPoints */
  load(maxPoints) {
    return this.enqueue(async () => {
      const body = await getOptimizers(this.runId, maxPoints);
      if (body.last_step !== null) this.lastStep = Math.max(this.lastStep, body.last_step);
      for (const track of body.optimizers) await this.block(track);
    });
  }

  /**
   * Live steps (decoded, in order): those after the last step drawn that carry optimizers.
   * @param {Step[]} steps
   */
  append(steps) {
    /** @type {StepWithOptimizers[]} */
    const fresh = [];
    /** @type {(s: Step) => s is StepWithOptimizers} */
    const withOptimizers = (s) => Array.isArray(s.optimizers);
    for (const s of steps) {
      if (!withOptimizers(s) || s.step <= this.lastStep) continue;
      this.lastStep = s.step;
      fresh.push(s);
    }
    if (!fresh.length) return this.queue;
    return this.enqueue(async () => {
      const count = Math.max(...fresh.map((s) => s.optimizers.length));
      for (let i = 0; i < count; i += 1) {
        const block = this.blocks[i] ?? await this.block({ optimizer: i, steps: 0, skipped: 0,
          unknown: 0, skipped_steps: [], groups: 0, lr: [] });
        /** @type {[number, OptimizerEntry][]} */
        const entries = fresh.filter((s) => i < s.optimizers.length).map((s) => [s.step, s.optimizers[i]]);
        if (entries.length) await block.append(entries);
      }
    });
  }

  /**
   * Run `work` after what is queued, whether that failed or not (its caller was told).
   * @param {() => Promise<void>} work
   */
  enqueue(work) {
    this.queue = this.queue.catch(() => {}).then(work);
    return this.queue;
  }

  /**
   * A block for an optimizer, drawn.
   * @param {OptimizerTrack} track
   */
  async block(track) {
    const block = new OptimizerBlock(this.body, track, this.runId);
    this.blocks[track.optimizer] = block;
    this.panel.hidden = false;
    await block.init();
    return block;
  }

  /** What the page shows, for the browser tests: each optimizer's line and chart traces. */
  get shown() {
    return this.blocks.map((b) => ({
      text: b.note.textContent,
      traces: b.div.data.map((trace) => ({ name: trace.name, x: [...trace.x], y: [...trace.y] })),
    }));
  }
}
