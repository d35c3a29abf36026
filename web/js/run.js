// @ts-check
// Run page: loads the run through the read API, then follows it over the live socket.

import * as api from './api.js';
import { agoText, el, numberText, percentText, scaleNode, statusBadge } from './format.js';
import { renderConfig } from './config_table.js';
import { announceRun } from './run_loaded.js';
import { EventLog } from './events.js';
import { LayerHeatmap, STATS } from './heatmap.js';
import { LayerLines } from './layer_lines.js';
import { COLUMNS, LayerTable } from './layer_table.js';
import { LineChart } from './line_chart.js';
import { LiveState, LiveStream } from './live.js';
import { COLORS, Plotly, fitStepMargins, plotlyLoaded, setStepSpan } from './plot.js';
import { ScaleChart } from './scale_chart.js';
import { SkipRateChart } from './skip_rate.js';
import { alignMargins, followZoom, linkZoom, xRangeOf } from './zoom.js';
import { axisToggle } from './axis_scale.js';
import { readViewState, writeViewState } from './view_state.js';
import { FindingsPanel } from './findings.js';
import { WhatIf } from './whatif.js';
import { FormatsView } from './formats_view.js';
import { RankNote } from './ranks.js';
import { OptimizerPanel } from './optimizers.js';

/** @import { LayerStats, RunDetail, RunEvent, RunStatus, Step, StepWithLayers } from './codec.js' */
/** @import { Finding, LayerLoss } from './findings.js' */

const RECENT_STEPS = 2000; // live steps kept to refill the heatmap after a statistic change
const EVENTS_REFETCH_MS = 5000; // live steps carry no misuse: /events is re-read at most this often
const PREFILL_LAYERS = 3; // the per-layer range starts with this many of the cited layers
const EVENT_PAGE_STEPS = 1000; // event steps a page of /events holds (the table shows 300 rows)
const LAYER_TABLE_STEPS = 32; // the layer table looks for its step among the last this many first
const TICK_MS = 1000; // relative times ("started 28s ago") are redrawn this often

// What each AMP misuse means, for the banner (the hook's kinds, docs/contracts.md "Wire v2").
/** @type {Readonly<Record<string, string>>} */
const MISUSE_HELP = Object.freeze({
  step_bypassed_scaler: 'optimizer.step() was called directly: the gradients were still scaled and an overflow step was not skipped',
  clip_before_unscale: 'gradients were clipped while still scaled: call scaler.unscale_(optimizer) before clipping',
  unscale_twice: 'scaler.unscale_(optimizer) was called twice in one step',
});

/** @param {string} id */
const $ = (id) => /** @type {HTMLElement} run.html has each one */ (document.getElementById(id));
/** @param {string} id  a chart's */
const $chart = (id) => /** @type {PlotDiv} */ ($(id));

/**
 * The highest step among `events` (or `since` when higher, or none).
 * @param {RunEvent[]} events
 * @param {number | null} since
 */
function lastEventStep(events, since) {
  let last = since;
  for (const e of events) if (last === null || e.step > last) last = e.step;
  return last;
}

/**
 * Resolves in a task of its own: the browser paints and handles input before it.
 * @returns {Promise<void>}
 */
function nextTask() {
  return new Promise((resolve) => { setTimeout(resolve, 0); });
}

function runIdFromUrl() {
  const match = location.pathname.match(/^\/runs\/([^/]+)\/?$/);
  if (match) return decodeURIComponent(match[1]);
  return new URLSearchParams(location.search).get('id');
}

class RunPage {
  /** @param {string} runId */
  constructor(runId) {
    this.runId = runId;
    // What load() makes, before anything reads it (the live socket starts last):
    /** @type {RunDetail} */
    this.run;
    /** @type {RankNote | undefined} a distributed run's */
    this.rankNote;
    /** @type {ScaleChart} */
    this.scale;
    /** @type {LayerHeatmap} */
    this.heatmap;
    /** @type {LineChart} */
    this.loss;
    /** @type {LineChart} */
    this.gradNorm;
    /** @type {EventLog} */
    this.events;
    /** @type {SkipRateChart} */
    this.skipRate;
    /** @type {LayerLines} */
    this.layerLines;
    /** @type {LayerTable} */
    this.layerTable;
    /** @type {OptimizerPanel} */
    this.optimizers;
    /** @type {FindingsPanel} */
    this.findings;
    /** @type {WhatIf} */
    this.whatIf;
    /** @type {FormatsView} */
    this.formats;
    /** @type {LiveStream} */
    this.live;
    /** @type {string[]} */
    this.layerNames = [];
    /** @type {string[]} the model's own names (layer_table.js) */
    this.rawNames = [];
    /** @type {Step | null} the newest StepScalars seen */
    this.lastStep = null;
    this.counted = -1;    // highest step number counted into numSteps/skipped
    this.skipped = 0;
    this.numSteps = 0;
    /** @type {StepWithLayers[]} */
    this.recent = [];
    this.statRequest = 0;
    this.source = 'param';
    this.eventsRefetched = 0;
    /** @type {string} */
    this.liveState = LiveState.CONNECTING;
    /** @type {string | undefined} */
    this.liveDetail = undefined;
    /** @type {number | null} the newest step /events gave: a live refetch starts there */
    this.eventsFrom = null;
    this.statusMessages = 0; // the socket's status messages so far
    /** @type {Record<string, unknown>} zoom.js's states (linkZoom, followZoom), for the tests */
    this.zoom = {};
    this.layerLinesPicked = false;    // the user toggled a layer: no more pre-filling
    this.layerLinesPrefilled = false;
    this.prefill = Promise.resolve(); // settles once the pre-filled layer lines are drawn
    this.view = readViewState(); // the view the address asks for (view_state.js)
    if (this.view.layers !== null) this.layerLinesPicked = true; // the link's layers, not the findings'
  }

  async load() {
    // The layer table beside the run detail: its names size every step chart's left margin
    // (fitStepMargins) before the first chart is drawn, so none is laid out twice.
    const layersP = api.getLayers(this.runId);
    layersP.catch(() => {}); // awaited below
    this.run = await api.getRun(this.runId);
    this.renderHeader();
    if (this.run.world_size > 1) {
      this.rankNote = new RankNote($('rank-note'), this.runId, this.run.world_size);
      this.rankNote.refresh().catch((err) => api.showError(err.message));
    }

    // The last step id (the run detail's) first, then the charts: a step ingested in between
    // is then in both the charts and the socket's backfill (the charts drop repeats by step),
    // never in neither. That step's scalars (for the cards) are read beside the charts.
    const lastId = this.lastStepId();
    const lastStepRead = this.readLastStep(lastId);
    lastStepRead.catch(() => {}); // awaited below (as the two guards after the fetches)
    const width = $('scale-chart').clientWidth || 1200;
    const maxPoints = Math.max(200, Math.round(2 * width));
    // The scale chart (the first thing to read) is drawn as soon as its series is in. That
    // series is asked for alone: the server answers the page's requests side by side, and the
    // six others (the heatmap's, the events page) would slow it down. They leave once it is in,
    // and the server works on them while the scale chart is drawn; its event markers follow
    // with the first page of /events (a long run's later pages on request).
    const scaleSeries = await api.getSeries(this.runId, 'scale', maxPoints);
    const eventsP = api.getEvents(this.runId, { limit: EVENT_PAGE_STEPS });
    eventsP.catch(() => {}); // awaited below
    const restP = Promise.all([
      layersP,
      api.getLayerStats(this.runId, 'lost_frac'),
      api.getSeries(this.runId, 'loss', maxPoints),
      api.getSeries(this.runId, 'grad_norm', maxPoints),
      api.getSkipRate(this.runId, maxPoints),
    ]);
    restP.catch(() => {}); // awaited below; a failure there must not go unhandled meanwhile
    this.scale = new ScaleChart($chart('scale-chart'), this.runId);
    fitStepMargins((await layersP).map((l) => l.name));
    // An ended run's step charts span its steps exactly (one x range on every chart); a live
    // run's start at its first step alike and grow with it, each by plotly's own autorange.
    if (scaleSeries.points.length) {
      setStepSpan(scaleSeries.points[0].step, this.run.status === 'active' ? null : this.run.last_step);
    }
    await plotlyLoaded();
    const scaleDrawn = this.scale.init(scaleSeries);
    scaleDrawn.catch(() => {}); // likewise: awaited with the other charts
    const firstPage = await eventsP;
    const events = firstPage.events;
    scaleDrawn.then(() => this.scale.addEvents(events)).catch(() => {});
    const [layers, stats, loss, gradNorm, skipRate] = await restP;
    await lastStepRead;
    this.counted = this.lastStep ? this.lastStep.step : -1;
    // A live refetch reads from here on (one page at a time): the newest step at load, or the
    // newest event the first page gave when later (the older pages are read on request, never
    // by the refetch, and a run without events is not read from its start every few seconds).
    const atLoad = this.counted >= 0 ? this.counted : null;
    this.eventsFrom = firstPage.next_start === null
      ? lastEventStep(events, atLoad)
      : Math.max(firstPage.next_start, this.counted);
    this.layerNames = layers.map((l) => l.name);
    this.rawNames = layers.map((l) => l.raw_name ?? l.name);

    const legend = { bar: $('legend-bar'), min: $('legend-min'), max: $('legend-max') };
    this.heatmap = new LayerHeatmap($chart('heatmap'), legend, this.runId,
      this.run.target_format_limits.max);
    this.loss = new LineChart($chart('loss-chart'), { runId: this.runId, field: 'loss', label: 'loss', color: COLORS.loss,
      log: this.view.lossAxis === 'log' });
    this.gradNorm = new LineChart($chart('gradnorm-chart'), { runId: this.runId, field: 'grad_norm', label: 'grad norm',
      color: COLORS.gradNorm, log: this.view.gradNormAxis !== 'linear' });
    // Live: one page of events from the newest step /events gave (that step again: repeats
    // are merged by the log), never the whole list again; a page that was cut goes on from its
    // next_start at the next refetch.
    this.events = new EventLog($('events-body'), $('event-counts'), async () => {
      const page = await api.getEvents(this.runId, { start: this.eventsFrom, limit: EVENT_PAGE_STEPS });
      this.eventsFrom = page.next_start ?? lastEventStep(page.events, this.eventsFrom);
      setTimeout(() => this.renderMisuse(this.events.events), 0); // once the log holds them
      return page.events;
    }, {
      button: /** @type {HTMLButtonElement} */ ($('events-more')),
      fetchPage: (start) => api.getEvents(this.runId, { start, limit: EVENT_PAGE_STEPS }),
      onPage: (page) => {
        this.scale.addEvents(page.events);
        this.renderMisuse(this.events.events);
      },
      onError: (err) => api.showError(err.message),
    });
    this.skipRate = new SkipRateChart($chart('skiprate-chart'), this.runId);
    this.layerLines = new LayerLines($chart('layer-lines'), $('layer-lines-note'), {
      runId: this.runId, layerNames: this.layerNames,
      fetchStat: (stat, layer) => api.getLayerStats(this.runId, stat,
        { max_points: maxPoints, layers: layer }),
    });
    this.layerTable = new LayerTable(/** @type {HTMLTableSectionElement} */ ($('layer-head')),
      /** @type {HTMLTableSectionElement} */ ($('layer-body')), $('layer-step'),
      { layerNames: this.layerNames, rawNames: this.rawNames,
        formatMax: this.run.target_format_limits.max });
    const smoothingInput = /** @type {HTMLInputElement} */ ($('smoothing'));
    if (this.view.smoothing !== null) {
      smoothingInput.value = String(this.view.smoothing);
      $('smoothing-value').textContent = this.view.smoothing.toFixed(2);
    }
    const smoothing = Number(smoothingInput.value);
    // One chart per task, top of the page first: each is shown (and the page answers input)
    // as soon as it is drawn, rather than all at the end of one long task (~1 s here for a
    // 500-layer heatmap and four line charts).
    const drawn = [scaleDrawn];
    // Per-optimizer skips and lr: shown only when the run's steps carry them (wire v4).
    this.optimizers = new OptimizerPanel($('optimizers-panel'), $('optimizers'), this.runId);
    drawn.push(this.optimizers.load(maxPoints));
    for (const draw of [() => this.loss.init(loss, smoothing),
      () => this.gradNorm.init(gradNorm, smoothing), () => this.skipRate.init(skipRate),
      () => this.heatmap.show(stats), () => this.layerLines.init()]) {
      await nextTask();
      drawn.push(draw());
    }
    await Promise.all(drawn);
    $('loss-empty').hidden = loss.points.length > 0 || !this.numSteps;
    $('scale-empty').hidden = scaleSeries.points.length > 0 || !this.numSteps;
    $('heatmap-empty').hidden = stats.steps.length > 0;
    this.events.addPage(firstPage);
    this.renderMisuse(events);
    await this.loadLayerTable(stats);
    this.initSmoothing();
    this.initLayerPicking();
    this.initAxisToggles();
    this.initZoom();
    await this.align();
    await this.zoomFromUrl();
    await this.layersFromUrl();
    this.initStatSelect();
    this.renderCards();
    window.ampscope = this; // for the console and the browser tests
    this.findings = new FindingsPanel(this);
    this.findings.onUpdate = (body) => {
      this.renderWorst(body.worst_loss);
      this.prefillLayerLines(body.findings);
    };
    this.findings.wanted = this.lastStep ? this.lastStep.step : -1;
    this.findings.refresh().catch((err) => api.showError(err.message));
    setInterval(() => this.tick(), TICK_MS);
    this.whatIf = new WhatIf(this.runId, {
      panel: $('whatif-panel'), chart: $chart('whatif-chart'), body: $('whatif-body'),
      slider: /** @type {HTMLInputElement} */ ($('whatif-k')), output: $('whatif-k-value'),
      select: /** @type {HTMLSelectElement} */ ($('whatif-step')), note: $('whatif-note'), empty: $('whatif-empty'),
    });
    this.whatIf.load().catch((err) => this.whatIf.fail(err));
    this.formats = new FormatsView(this.runId, {
      panel: $('formats-panel'), body: $('formats-body'), empty: $('formats-empty'), note: $('formats-note'),
      operand: /** @type {HTMLSelectElement} */ ($('formats-operand')),
      stat: /** @type {HTMLSelectElement} */ ($('formats-stat')),
      step: /** @type {HTMLSelectElement} */ ($('formats-step')), help: $('formats-help'),
      verdicts: $('formats-verdicts'), matrix: $chart('formats-matrix'),
      legend: { node: $('formats-legend'), bar: $('formats-legend-bar'), min: $('formats-legend-min'),
        max: $('formats-legend-max'), notMeasured: $('formats-legend-nan') },
      trend: $('formats-trend'), trendNote: $('formats-trend-note'),
      trendStats: $chart('formats-trend-stats'), trendOperand: $chart('formats-trend-operand'),
      trendScales: $chart('formats-trend-scales'), trendScalesNone: $('formats-trend-scales-none'),
    });
    this.formats.observe();

    this.live = new LiveStream(this.runId, lastId, {
      onSteps: (steps) => this.onSteps(steps),
      onStatus: (status) => this.onStatus(status),
      onState: (state, detail) => this.onLiveState(state, detail),
    }).start();
  }

  /**
   * The newest step id, and the step and skip counts, from the run's counters (the run
   * detail): nothing of the run's steps is read for them.
   */
  lastStepId() {
    this.numSteps = this.run.num_steps ?? 0;
    this.skipped = this.run.skipped_steps ?? 0;
    return typeof this.run.last_id === 'number' ? this.run.last_id : 0;
  }

  /**
   * The newest step's scalars (for the cards): that one step is read.
   * @param {number} lastId  its id (0: the run has no step)
   */
  async readLastStep(lastId) {
    if (!lastId) return;
    const page = await api.getSteps(this.runId, lastId - 1, 1);
    if (page.steps.length) this.lastStep = page.steps[page.steps.length - 1];
  }

  renderHeader() {
    const run = this.run;
    document.title = `${run.name || run.id} · ampscope`;
    $('run-name').textContent = run.name || run.id;
    $('crumb-run').textContent = run.name || run.id;
    this.renderStatus(run.status);
    const meta = $('run-meta');
    /** @type {[string, string | number | null | undefined][]} */
    const items = [
      ['project', run.project], ['format', run.target_format], ['host', run.host],
      ['rank', run.rank], ['world size', run.world_size > 1 ? run.world_size : null], ['layers', run.num_layers], ['attempts', run.attempts ? run.attempts.length : null],
      ['started', agoText(run.created_at)], ['id', run.id],
    ];
    const nodes = [];
    for (const [label, value] of items) {
      if (value === null || value === undefined || value === '') continue;
      const item = el('span', 'meta-item');
      const shown = el('span', 'meta-value', String(value));
      if (label === 'started') {
        shown.dataset.ago = String(run.created_at);
        shown.title = new Date(run.created_at * 1000).toLocaleString();
      }
      item.append(el('span', 'meta-label', label), shown);
      if (label === 'format' && run.target_format_reason) {
        // Why this format (given, or inferred from the model by the hook: #30), as text.
        item.append(el('span', 'meta-why', `(${run.target_format_reason})`));
      }
      nodes.push(item);
    }
    for (const tag of run.tags ?? []) nodes.push(el('span', 'tag', tag));
    meta.replaceChildren(...nodes);
    renderConfig($('config-body'), $('config-note'), run.config);
    /** @param {string} format */
    const exportUrl = (format) => `/api/runs/${encodeURIComponent(run.id)}/export?format=${format}`;
    for (const [id, format] of [['export-report', 'html'], ['export-json', 'json'], ['export-csv', 'csv'],
      ['export-csv-wide', 'csv_wide']]) {
      const link = /** @type {HTMLAnchorElement} */ ($(id));
      link.href = exportUrl(format);
      link.setAttribute('download', '');
    }
    $('run-actions').hidden = false;
    announceRun(run); // run_admin.js and run_notes.js: the run exists
  }

  /** @param {RunStatus} status */
  renderStatus(status) {
    this.run.status = status;
    $('run-status').replaceChildren(statusBadge(status));
  }

  renderCards() {
    const s = this.lastStep;
    $('card-step').textContent = s ? String(s.step) : '—';
    $('card-scale').replaceChildren(scaleNode(s ? s.scale_after : this.run.last_scale));
    const skipped = $('card-skipped');
    skipped.replaceChildren(String(this.skipped), el('span', 'card-sub', ` ${percentText(this.skipped, this.numSteps)}`));
    skipped.classList.toggle('warn', this.skipped > 0);
    const loss = $('card-loss');
    loss.textContent = s ? numberText(s.loss) : '—';
    loss.classList.toggle('bad', !!s && typeof s.loss === 'number' && !Number.isFinite(s.loss));
    const norm = $('card-gradnorm');
    norm.textContent = s ? numberText(s.grad_norm) : '—';
    norm.classList.toggle('bad', !!s && typeof s.grad_norm === 'number' && !Number.isFinite(s.grad_norm));
  }

  /**
   * Before the user picks layers, the per-layer range shows the layers the first finding that
   * cites any names (most responsible first, at most PREFILL_LAYERS); once the user toggles a
   * layer, the choice is theirs.
   * @param {Finding[]} findings
   */
  prefillLayerLines(findings) {
    if (this.layerLinesPicked || this.layerLinesPrefilled) return;
    const cited = findings.find((f) => f.layers.some((name) => this.layerNames.includes(name)));
    if (!cited) return;
    this.layerLinesPrefilled = true;
    const indices = cited.layers.map((name) => this.layerNames.indexOf(name)).filter((i) => i >= 0)
      .slice(0, PREFILL_LAYERS);
    this.prefill = (async () => {
      for (const index of indices) {
        if (!this.layerLines.shown.includes(index)) await this.layerLines.toggle(index);
      }
      await this.align();
    })().catch((err) => api.showError(err.message));
  }

  /** Relative times ("28s ago") move on without new data. */
  tick() {
    for (const node of /** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll('[data-ago]'))) {
      node.textContent = agoText(Number(node.dataset.ago));
    }
  }

  /**
   * The card of the layer losing most to the format: the findings' own numbers (median over the
   * recent layer-stat steps, structural zeros apart), so the card and the underflow finding agree.
   * @param {LayerLoss | null | undefined} worst
   */
  renderWorst(worst) {
    const node = $('card-worst');
    const label = $('card-worst-label');
    if (!worst) {
      node.replaceChildren(el('span', 'muted', 'no layer statistics yet'));
      return;
    }
    const lost = typeof worst.lost_frac === 'number' ? worst.lost_frac : NaN;
    const structural = typeof worst.structural_zero_frac === 'number' ? worst.structural_zero_frac : NaN;
    label.textContent = `Most lost to ${this.run.target_format} · median, last ${worst.steps} layer-stat steps`;
    const parts = [el('span', 'card-layer', worst.layer), el('span', 'card-sub', ` ${numberText(100 * lost, 3)}% lost`)];
    if (structural > 0) parts.push(el('span', 'card-sub card-structural', ` · ${numberText(100 * structural, 3)}% structural zeros (not lost)`));
    node.replaceChildren(...parts);
    node.title = 'Lost: values that flush to zero at this scale, and exact zeros where the layer\'s values press on the format\'s floor. '
      + 'Structural zeros (dead ReLU units, unused rows) are shown apart. Same definition as the underflow finding (docs/findings.md).';
    node.classList.toggle('warn', lost >= 0.25);
  }

  /** @param {Step[]} steps  live ones, in order */
  onSteps(steps) {
    for (const s of steps) {
      if (s.step <= this.counted) continue; // already in the run's counters
      this.counted = s.step;
      this.numSteps += 1;
      if (s.skipped) this.skipped += 1;
    }
    this.lastStep = steps[steps.length - 1];
    this.scale.append(steps);
    this.loss.append(steps);
    this.gradNorm.append(steps);
    this.skipRate.append(steps);
    this.events.addFromSteps(steps);
    if (performance.now() - this.eventsRefetched > EVENTS_REFETCH_MS) {
      this.eventsRefetched = performance.now();
      this.events.scheduleRefetch(); // misuse events (not derivable from the steps) arrive too
    }
    if (steps.some((s) => typeof s.loss === 'number')) $('loss-empty').hidden = true;
    if (steps.some((s) => s.scale_before != null)) $('scale-empty').hidden = true;
    const withLayers = steps.filter(/** @type {(s: Step) => s is StepWithLayers} */ ((s) => !!s.layers));
    if (withLayers.length) {
      $('heatmap-empty').hidden = true;
      this.heatmap.append(withLayers);
      this.layerLines.append(withLayers);
      this.layerTable.append(withLayers);
      this.recent.push(...withLayers);
      if (this.recent.length > RECENT_STEPS) this.recent.splice(0, this.recent.length - RECENT_STEPS);
    }
    if (this.findings) this.findings.stepsArrived(this.lastStep.step);
    if (this.whatIf) this.whatIf.stepsArrived();
    if (this.formats) this.formats.stepsArrived();
    if (this.rankNote) this.rankNote.stepsArrived(steps);
    this.optimizers.append(steps).catch((err) => api.showError(err.message));
    this.renderCards();
  }

  /** @param {RunStatus} status */
  onStatus(status) {
    this.statusMessages += 1; // the browser tests wait for the findings refetch this schedules
    this.renderStatus(status);
    this.renderLive();
    if (this.findings) this.findings.stepsArrived(this.lastStep ? this.lastStep.step : -1);
  }

  /**
   * @param {string} state  a LiveState
   * @param {string} [detail]
   */
  onLiveState(state, detail) {
    this.liveState = state;
    this.liveDetail = detail;
    this.renderLive();
  }

  /** The socket indicator: "live" only while the run is; an ended run's open socket is "connected". */
  renderLive() {
    const node = $('live');
    const ended = this.run && this.run.status !== 'active';
    const state = ended && this.liveState === LiveState.OPEN ? 'connected' : this.liveState;
    node.dataset.state = state;
    $('live-text').textContent = this.liveDetail ? `${state} · ${this.liveDetail}` : state;
  }

  /**
   * The layer table at the last step with layer statistics (one /layer-stats per statistic).
   * @param {LayerStats} stats  the heatmap's (its steps)
   */
  async loadLayerTable(stats) {
    if (!stats.steps.length) {
      this.layerTable.render();
      return;
    }
    const start = stats.steps[stats.steps.length - 1];
    const end = Math.max(start, this.lastStep ? this.lastStep.step : start);
    /** @param {number} from */
    const read = (from) => Promise.all(COLUMNS.map(([stat]) => api.getLayerStats(this.runId, stat,
      { start: from, end, max_points: 10000 })));
    // The last LAYER_TABLE_STEPS steps first: the heatmap's last column starts a whole bucket
    // back (4096 steps on a 1M-step run), and reading each of its raw steps for one step's
    // values would grow with the run. The whole column only when they hold no layer statistics.
    let bodies = await read(Math.max(start, end - LAYER_TABLE_STEPS + 1));
    if (!bodies[0].steps.length && end - LAYER_TABLE_STEPS + 1 > start) bodies = await read(start);
    /** @type {Record<string, LayerStats>} */
    const named = {};
    COLUMNS.forEach(([stat], i) => { named[stat] = bodies[i]; });
    const body = bodies[0];
    const step = body.steps.length ? body.steps[body.steps.length - 1] : start;
    if (this.layerTable.step === null) this.layerTable.load(step, named);
  }

  initSmoothing() {
    const input = /** @type {HTMLInputElement} */ ($('smoothing'));
    const output = $('smoothing-value');
    input.addEventListener('input', () => {
      const weight = Number(input.value);
      output.textContent = weight.toFixed(2);
      this.loss.setSmoothing(weight);
      this.gradNorm.setSmoothing(weight);
      writeViewState({ smoothing: weight });
    });
  }

  /** The log/linear buttons of the loss and grad-norm charts (the choice goes in the address). */
  initAxisToggles() {
    for (const [chart, key] of /** @type {const} */ ([[this.loss, 'lossAxis'], [this.gradNorm, 'gradNormAxis']])) {
      const toggle = axisToggle($(`${chart.div.id}-axis`), () => [chart.div], () => chart.ticks, (log) => {
        chart.log = log;
        writeViewState({ [key]: log ? 'log' : 'linear' });
      });
      toggle.show(chart.log);
    }
  }

  /** `?layers=a,b` (a shared link): those layers' lines, in that order. */
  async layersFromUrl() {
    if (this.view.layers === null) return;
    for (const name of this.view.layers) {
      const index = this.layerNames.indexOf(name);
      if (index >= 0 && !this.layerLines.shown.includes(index)) await this.layerLines.toggle(index);
    }
    await this.align();
  }

  /**
   * AMP misuse seen in the run: a banner naming each kind, how often, from which step.
   * @param {RunEvent[]} events
   */
  renderMisuse(events) {
    /** @type {Map<string, {count: number, first: number, detail: string}>} */
    const byKind = new Map();
    for (const e of events) {
      if (e.kind !== 'misuse') continue;
      const seen = byKind.get(e.misuse_kind) ?? { count: 0, first: e.step, detail: e.detail };
      seen.count += 1;
      byKind.set(e.misuse_kind, seen);
    }
    const banner = $('misuse');
    banner.hidden = byKind.size === 0;
    if (!byKind.size) return;
    const list = el('ul');
    for (const [kind, seen] of byKind) {
      const li = el('li');
      li.dataset.kind = kind;
      li.append(el('span', 'misuse-kind', kind),
        ` ${seen.count} ${seen.count === 1 ? 'time' : 'times'}, first at step ${seen.first}: ${MISUSE_HELP[kind] ?? seen.detail ?? ''}`);
      list.append(li);
    }
    banner.replaceChildren(el('strong', null, 'AMP misuse detected'),
      ' — the loss-scale numbers below may not mean what they usually do (details under Events).', list);
  }

  /** A click on a heatmap row adds (or removes) that layer's lines. */
  initLayerPicking() {
    this.heatmap.div.on('plotly_click', (event) => {
      if (this.heatmap.source !== 'param') return; // rows are modules, not the layers the lines show
      const point = event && event.points && event.points[0];
      if (!point) return;
      const index = this.heatmap.div.data[0].y.indexOf(point.y);
      if (index < 0) return;
      this.layerLinesPicked = true;
      this.layerLines.toggle(index).then(() => {
        writeViewState({ layers: this.layerLines.shown.map((i) => this.layerNames[i]) });
        return this.align();
      }).catch((err) => api.showError(err.message));
    });
  }

  /** The step charts, top to bottom: one step axis, lined up (zoom.js). */
  stepCharts() {
    return [this.scale.div, this.loss.div, this.gradNorm.div, this.skipRate.div, this.heatmap.div,
      this.layerLines.div];
  }

  /** `?start=A&end=B` (an alert's link) opens the page zoomed to those steps: every step chart
   * follows (linkZoom) and fetches the range in detail. */
  async zoomFromUrl() {
    const { start, end } = this.view;
    if (start === null) return;
    await Plotly.relayout(this.scale.div, { 'xaxis.range': [start, end] });
  }

  /** Line the step charts' plot areas up (after any of them re-drew its axes). */
  align() {
    return alignMargins(this.stepCharts()).catch((err) => api.showError(err.message));
  }

  /**
   * Zooming any step chart zooms them all (linkZoom); the scale, loss and grad-norm charts then
   * fetch the visible range in detail.
   */
  initZoom() {
    this.zoom.linked = linkZoom(this.stepCharts());
    // Every zoom reaches the scale chart (linkZoom): the address follows it.
    this.scale.div.on('plotly_relayout', (event) => {
      const range = xRangeOf(event);
      if (range) writeViewState({ start: range.start, end: range.end });
      else if (event && event['xaxis.autorange'] === true) writeViewState({ start: null, end: null });
    });
    /** @param {Error} err */
    const onError = (err) => api.showError(err.message);
    this.zoom.scale = followZoom(this.scale.div,
      (range, maxPoints) => api.getSeries(this.runId, 'scale', maxPoints, range),
      (range, series) => this.scale.replaceRange(range.start, range.end, series), onError);
    for (const [key, chart] of /** @type {const} */ ([['loss', this.loss], ['grad_norm', this.gradNorm]])) {
      this.zoom[key] = followZoom(chart.div,
        (range, maxPoints) => api.getSeries(this.runId, key, maxPoints, range),
        (range, series) => chart.replaceRange(range.start, range.end, series), onError);
    }
    // The zoomed range's events (its first page), for the markers and the table.
    this.zoom.events = followZoom(this.scale.div,
      (range) => api.getEvents(this.runId, { start: range.start, end: range.end, limit: EVENT_PAGE_STEPS }),
      (range, page) => {
        this.events.add(page.events);
        this.scale.addEvents(page.events);
        this.renderMisuse(this.events.events);
      }, onError);
  }

  initStatSelect() {
    const select = /** @type {HTMLSelectElement} */ ($('stat-select'));
    for (const [stat, spec] of Object.entries(STATS)) {
      const option = el('option', null, spec.label);
      option.value = stat;
      select.append(option);
    }
    select.value = this.heatmap.stat;
    $('stat-help').textContent = STATS[select.value].help;
    select.addEventListener('change', () => this.changeStat(select.value));
    const source = /** @type {HTMLSelectElement} */ ($('source-select'));
    source.value = this.source;
    source.addEventListener('change', () => {
      this.source = source.value;
      this.changeStat(select.value);
    });
  }

  /** @param {string} stat */
  async changeStat(stat) {
    const request = ++this.statRequest;
    $('stat-help').textContent = STATS[stat].help;
    try {
      const body = await api.getLayerStats(this.runId, stat, { source: this.source });
      if (request !== this.statRequest) return; // a newer choice is on its way
      await this.heatmap.show(body);
      this.heatmap.append(this.recent); // steps that arrived while we fetched (param only)
      await this.align();
      const note = $('source-note');
      note.hidden = this.source === 'param';
      note.textContent = body.layers.length === 0
        ? 'This run has no activation statistics (the hook samples them every activation_every steps; 0 turns them off).'
        : `Each row is a module's grad_output as it flowed in low precision, sampled on ${body.steps.length} steps;`
          + ' reload to see samples taken since (the live socket carries parameter statistics only).';
      api.showError(null);
    } catch (err) {
      api.showError(/** @type {Error} */ (err).message);
    }
  }
}

async function main() {
  const runId = runIdFromUrl();
  if (!runId) {
    api.showError('No run id in the address: open a run from the runs list.');
    return;
  }
  try {
    await new RunPage(runId).load();
  } catch (err) {
    if (err instanceof api.ApiError && err.status === 404) {
      api.showNotFound(`This server has no run “${runId}”: it may have been deleted, or the address is mistyped.`);
      document.title = 'Run not found · ampscope';
      $('run-name').textContent = 'Run not found';
      $('crumb-run').textContent = 'not found';
    } else {
      api.showError(/** @type {Error} */ (err).message);
    }
    $('live').dataset.state = 'closed';
    $('live-text').textContent = 'not connected';
  }
}

main();
