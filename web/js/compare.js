// @ts-check
// Compare page: 2+ runs overlaid by step (loss scale, loss, grad norm), each run in its own stable
// colour, the first step where a run departs from the reference, and per-layer differences
// (GET /api/compare). User text (run and layer names) goes through textContent or plotText.
// Runs still training keep streaming in (compare_live.js); the comparison itself is recomputed
// at most every COMPARE_REFRESH_MS while they do.

import * as api from './api.js';
import { runColors } from './colors.js';
import { axisToggle } from './axis_scale.js';
import { CHARTS, CompareChart } from './compare_charts.js';
import { CompareLive } from './compare_live.js';
import { CompareFormats } from './compare_formats.js';
import { LiveState } from './live.js';
import { el, numberText, scaleText, statusBadge } from './format.js';
import { Plotly } from './plot.js';
import { TableSort } from './table_sort.js';
import { alignMargins, followZoom, linkZoom } from './zoom.js';

/** @import { Compare, LayerDiff, RunStatus } from './codec.js' */
/** @import { SortValue } from './table_sort.js' */
/** A row of the layer table: a layer of the pair shown, and its place in /api/compare's order. @typedef {LayerDiff & {order: number}} LayerRow */

/**
 * The page's element `id` (compare.html has each one this module asks for).
 * @param {string} id
 */
const $ = (id) => /** @type {HTMLElement} */ (document.getElementById(id));
const COMPARE_REFRESH_MS = 5000;

/**
 * A percent field's value as a fraction, or `fallback` when it is not a number ≥ 0.
 * @param {HTMLInputElement} input
 * @param {number} fallback
 */
function percentInput(input, fallback) {
  const v = Number(input.value);
  return Number.isFinite(v) && v >= 0 ? v / 100 : fallback;
}

/** @param {number | null | undefined} v */
function fraction(v) {
  return v === null || v === undefined ? '—' : `${numberText(100 * v, 3)}%`;
}

/** @param {string | undefined} color  a run's (runColors: every run of the page has one) */
function swatch(color) {
  const node = el('span', 'swatch');
  node.style.background = color ?? ''; // CSSOM, not an inline style attribute: allowed by the CSP
  return node;
}

class ComparePage {
  /** @param {string[]} ids  the runs, the reference first */
  constructor(ids) {
    this.ids = ids;
    this.colors = runColors(ids);
    /** @type {Compare | null} the comparison shown */
    this.body = null;
    this.pair = 0;
    this.request = 0;
    this.ready = false;
    this.charts = CHARTS.map((spec) => new CompareChart(spec, {
      colors: this.colors, runName: (id) => this.runName(id) }));
    /** @type {CompareLive | null} */
    this.live = null;
    /** @type {number | null} */
    this.refreshTimer = null;
    /** @type {string | null} the sockets' LiveState */
    this.liveState = null;
    const params = new URLSearchParams(location.search);
    const tolerance = /** @type {HTMLInputElement} */ ($('tolerance'));
    const threshold = /** @type {HTMLInputElement} */ ($('threshold'));
    if (params.has('tolerance')) tolerance.value = String(100 * Number(params.get('tolerance')));
    if (params.has('underflow_threshold')) threshold.value = String(100 * Number(params.get('underflow_threshold')));
    /** @type {(i: number) => {title: HTMLElement, chart: PlotDiv, empty: HTMLElement}} */
    const side = (i) => ({ title: $(`formats-title-${i}`), chart: /** @type {PlotDiv} */ ($(`formats-matrix-${i}`)),
      empty: $(`formats-empty-${i}`) });
    this.formats = new CompareFormats({
      panel: $('formats-panel'), operand: /** @type {HTMLSelectElement} */ ($('formats-operand')),
      stat: /** @type {HTMLSelectElement} */ ($('formats-stat')), note: $('formats-note'), help: $('formats-help'),
      head: $('formats-verdicts-head'), body: $('formats-verdicts-body'), sides: [side(0), side(1)],
      legend: { node: $('formats-legend'), bar: $('formats-legend-bar'), min: $('formats-legend-min'),
        max: $('formats-legend-max'), notMeasured: $('formats-legend-nan'), absent: $('formats-legend-absent') },
    }, { runName: (id) => this.runName(id), swatch: (id) => swatch(this.colors.get(id)) });
    const layers = /** @type {HTMLTableElement} */ ($('layers'));
    this.sort = new TableSort(/** @type {HTMLTableSectionElement} it has one */ (layers.tHead),
      { key: 'order', direction: 'asc' }, () => this.renderLayers());
  }

  get tolerance() { return percentInput(/** @type {HTMLInputElement} */ ($('tolerance')), 0.05); }

  get threshold() { return Math.min(1, percentInput(/** @type {HTMLInputElement} */ ($('threshold')), 0.01)); }

  /** @param {string} id */
  runName(id) {
    const run = this.body && this.body.runs.find((r) => r.id === id);
    return run ? (run.name || run.id) : id;
  }

  async load() {
    // The comparison (its run summaries carry each run's last step id) before the series: a
    // step stored in between is then in both the charts and the sockets' backfill (dropped by
    // step when drawn), never in neither.
    await this.fetchComparison();
    const body = /** @type {Compare} the first request: none came after it */ (this.body);
    const lastIds = new Map(body.runs.map((r) => [r.id, r.last_id ?? 0]));
    const width = $('scale-chart').clientWidth || 1200;
    const maxPoints = Math.max(200, Math.round(2 * width));
    const perRun = await Promise.all(this.ids.map(async (id) => {
      // The skip markers of the first page of events (api.getEvents): a long run's every page
      // would cost each load a download that grows with the run.
      const [scale, loss, gradNorm, events] = await Promise.all([
        api.getSeries(id, 'scale', maxPoints), api.getSeries(id, 'loss', maxPoints),
        api.getSeries(id, 'grad_norm', maxPoints), api.getEvents(id),
      ]);
      return { id, scale, loss, grad_norm: gradNorm,
        skipped: events.events.filter((e) => e.kind === 'skipped') };
    }));
    const weight = Number(/** @type {HTMLInputElement} */ ($('smoothing')).value);
    await Promise.all(this.charts.map((chart) => chart.draw(perRun, this.divergenceShapes(), weight)));
    const divs = this.charts.map((chart) => chart.div);
    await alignMargins(divs);
    this.zoom = linkZoom(divs);
    // Zoom fetches detail: every run's points of the visible steps, per chart.
    this.zoomDetail = this.charts.map((chart) => followZoom(chart.div,
      (range, maxPoints) => Promise.all(this.ids.map((id) => api.getSeries(id, chart.spec.series, maxPoints, range))),
      (range, bodies) => chart.replaceRange(range, this.ids, bodies), (err) => api.showError(err.message)));
    this.initControls();
    this.live = new CompareLive(this, lastIds).start();
    this.ready = true;
    window.ampscope = { compare: this }; // for the console and the browser tests

    $('tolerance').addEventListener('change', () => this.refreshComparison());
    $('threshold').addEventListener('change', () => this.refreshComparison());
    $('pair-select').addEventListener('change', () => {
      this.pair = Number(/** @type {HTMLSelectElement} */ ($('pair-select')).value);
      this.renderLayers();
      this.showFormats();
    });
  }

  async fetchComparison() {
    const request = ++this.request;
    const body = await api.getCompare(this.ids, this.tolerance, this.threshold);
    if (request !== this.request) return false; // a newer request is on its way
    this.body = body;
    this.pair = Math.min(this.pair, body.comparisons.length - 1);
    const query = new URLSearchParams({ runs: this.ids.join(','), tolerance: String(body.tolerance),
      underflow_threshold: String(body.underflow_threshold) });
    history.replaceState(null, '', `/compare?${query}`);
    document.title = `${body.runs.map((r) => r.name || r.id).join(' vs ')} · ampscope`;
    this.renderRuns();
    this.renderDivergences();
    this.renderPairSelect();
    this.renderLayers();
    this.showFormats();
    $('compare-note').textContent = `${body.runs.length} runs`;
    return true;
  }

  async refreshComparison() {
    try {
      if (await this.fetchComparison()) {
        for (const chart of this.charts) Plotly.relayout(chart.div, { shapes: this.divergenceShapes() });
      }
      api.showError(null);
    } catch (err) {
      api.showError(/** @type {Error} */ (err).message);
    }
  }

  /**
   * A run's status changed (live socket): its card says so.
   * @param {string} runId
   * @param {RunStatus} status
   */
  onStatus(runId, status) {
    const run = this.body && this.body.runs.find((r) => r.id === runId);
    if (!run || run.status === status) return;
    run.status = status;
    this.renderRuns();
    if (this.liveState) this.onState(this.liveState);
    if (status !== 'active') this.refreshComparison(); // its last steps are in: compare them now
  }

  /**
   * The sockets' state; "connected" rather than "live" once no compared run is still active.
   * @param {string} state  a LiveState
   */
  onState(state) {
    this.liveState = state;
    const ended = this.body && this.body.runs.every((r) => r.status !== 'active');
    const shown = ended && state === LiveState.OPEN ? 'connected' : state;
    $('live').dataset.state = shown;
    $('live-text').textContent = shown;
  }

  /** Live steps were drawn: recompute the comparison soon (not per frame). */
  onDrawn() {
    if (this.refreshTimer !== null) return;
    this.refreshTimer = setTimeout(() => {
      this.refreshTimer = null;
      this.refreshComparison();
    }, COMPARE_REFRESH_MS);
  }

  /**
   * Make `id` the reference: reorder, keep the colours, recompute.
   * @param {string} id
   */
  async makeReference(id) {
    this.ids = [id, ...this.ids.filter((x) => x !== id)];
    this.pair = 0;
    await this.refreshComparison();
  }

  renderRuns() {
    if (!this.body) return;
    const items = this.body.runs.map((run, index) => {
      const li = el('li', 'compare-run');
      li.dataset.runId = run.id;
      const link = el('a', 'compare-run-name', run.name || run.id);
      link.href = `/runs/${encodeURIComponent(run.id)}`;
      const head = el('div', 'compare-run-head');
      head.append(swatch(this.colors.get(run.id)), link);
      const meta = el('div', 'compare-run-meta');
      meta.append(statusBadge(run.status), el('span', 'muted', `${run.num_steps} steps`),
        el('span', 'muted', `scale ${scaleText(run.last_scale)}`), el('span', 'run-id', run.id.slice(0, 8)));
      li.append(head, meta);
      // The run's root-cause finding, as its run page lists it first (refreshed with the
      // comparison while the run is live).
      const finding = el('div', 'compare-run-finding');
      if (run.top_finding) {
        finding.dataset.kind = run.top_finding.kind;
        finding.append(el('span', `severity severity-${run.top_finding.severity}`, run.top_finding.severity),
          ' ', el('span', 'finding-brief', run.top_finding.title));
        finding.title = run.top_finding.title;
      } else finding.append(el('span', 'muted', 'no findings'));
      li.append(finding);
      if (index === 0) li.append(el('span', 'reference-tag', 'reference'));
      else {
        const button = el('button', 'button button-small', 'make reference');
        button.type = 'button';
        button.addEventListener('click', () => this.makeReference(run.id));
        li.append(button);
      }
      return li;
    });
    $('compare-runs').replaceChildren(...items);
  }

  renderDivergences() {
    if (!this.body) return;
    const tol = `${numberText(100 * this.body.tolerance, 3)}%`;
    const cards = this.body.comparisons.map((c) => {
      const card = el('div', 'divergence card');
      card.dataset.runId = c.run;
      const title = el('div', 'card-label');
      title.append(swatch(this.colors.get(c.run)), el('span', 'divergence-run', this.runName(c.run)),
        el('span', null, ' vs '), swatch(this.colors.get(c.reference)), el('span', 'divergence-run', this.runName(c.reference)));
      const d = c.divergence;
      const value = el('div', 'card-value divergence-value');
      const detail = el('div', 'divergence-detail muted');
      if (d) {
        value.append('diverges at step ', el('span', 'divergence-step', String(d.step)));
        value.classList.add('warn');
        const label = d.metric === 'loss' ? 'loss' : 'grad norm';
        const rel = Number.isFinite(d.relative) ? `${numberText(100 * d.relative, 3)}% apart` : 'one is not finite';
        detail.textContent = `${label} ${numberText(d.reference_value)} → ${numberText(d.value)} (${rel}; tolerance ${tol})`;
      } else {
        value.textContent = 'no divergence';
        value.classList.add('ok');
        detail.textContent = `loss and grad norm within ${tol} over ${c.common_steps} common steps`;
      }
      if (c.divergence_exact === false) {
        detail.textContent += ' · long runs: searched where their rollups part, not step by step';
      }
      card.append(title, value, detail);
      return card;
    });
    $('divergences').replaceChildren(...cards);
  }

  divergenceShapes() {
    if (!this.body) return [];
    return this.body.comparisons.flatMap((c) => (c.divergence ? [{
      type: 'line', xref: 'x', yref: 'paper', x0: c.divergence.step, x1: c.divergence.step, y0: 0, y1: 1,
      line: { color: this.colors.get(c.run), width: 1.5, dash: 'dot' },
    }] : []));
  }

  /** The smoothing slider and the log/linear toggles of the loss and grad-norm charts. */
  initControls() {
    const input = /** @type {HTMLInputElement} */ ($('smoothing'));
    input.addEventListener('input', () => {
      const weight = Number(input.value);
      $('smoothing-value').textContent = weight.toFixed(2);
      for (const chart of this.charts) chart.setSmoothing(weight);
    });
    for (const chart of this.charts.filter((c) => c.spec.series !== 'scale')) {
      const group = $(`${chart.spec.id}-axis`);
      const toggle = axisToggle(group, () => [chart.div], () => chart.ticks, (log) => { chart.log = log; });
      toggle.show(chart.log);
    }
  }

  /** The Formats panel lines up the reference and the run of the pair shown. */
  showFormats() {
    const c = this.body && this.body.comparisons[this.pair];
    if (c) this.formats.show(c.reference, c.run);
  }

  renderPairSelect() {
    if (!this.body) return;
    const comparisons = this.body.comparisons;
    $('pair-label').hidden = comparisons.length < 2;
    const options = comparisons.map((c, i) => {
      const option = el('option', null, `${this.runName(c.run)} vs ${this.runName(c.reference)}`);
      option.value = String(i);
      return option;
    });
    const select = /** @type {HTMLSelectElement} */ ($('pair-select'));
    select.replaceChildren(...options);
    select.value = String(this.pair);
  }

  renderLayers() {
    if (!this.body || !this.body.comparisons.length) return;
    const c = this.body.comparisons[this.pair];
    $('lost-ref-head').textContent = `Lost · ${this.runName(c.reference)}`;
    $('lost-head').textContent = `Lost · ${this.runName(c.run)}`;
    $('lost-ref-head').title = 'Median share of exact zeros plus values flushed to zero over the common steps: an upper bound on what the format loses (exact zeros include structural ones such as dead ReLU units; the run page counts those apart, docs/findings.md)';
    $('lost-head').title = $('lost-ref-head').title;
    /** @type {LayerRow[]} */
    const rows = c.layers.map((layer, order) => ({ ...layer, order }));
    /** @type {(row: LayerRow, key: string) => SortValue} */
    const valueOf = (row, key) => /** @type {Record<string, SortValue>} */ ({
      order: row.order, ratio: row.l2_ratio, steps: row.steps, lost_reference: row.lost_frac_reference,
      lost: row.lost_frac, only: row.underflow_only_in ? this.runName(row.underflow_only_in) : null,
      nonfinite: row.nonfinite_steps,
    })[key];
    const flagged = rows.filter((r) => r.underflow_only_in).length;
    const far = rows.filter((r) => r.l2_ratio !== null && Math.abs(Math.log2(r.l2_ratio)) >= 1).length;
    const nonfinite = rows.filter((r) => r.nonfinite_steps > 0).length;
    const over = c.layer_bucket_width > 1
      ? `${c.layer_steps} common buckets of ${c.layer_bucket_width} steps (each bucket's largest norm and loss)`
      : `${c.layer_steps} common steps with layer statistics`;
    $('layers-note').textContent = `${rows.length} layers in both runs · ${over}`
      + ` · ${far} with norms 2× apart or more · ${flagged} underflowing in one run only`
      + (nonfinite ? ` · ${nonfinite} with NaN/inf steps (left out of the ratio and the lost shares)` : '');
    $('layers-empty').hidden = rows.length > 0;
    $('layers').hidden = rows.length === 0;
    $('layers-body').replaceChildren(...this.sort.sorted(rows, valueOf).map((row) => this.layerRow(row)));
  }

  /** @param {LayerRow} row */
  layerRow(row) {
    const threshold = /** @type {Compare} renderLayers' */ (this.body).underflow_threshold;
    const tr = el('tr');
    const name = el('td', 'layer-cell', row.layer);
    name.title = row.layer;
    const ratio = el('td', 'num');
    if (row.l2_ratio === null) {
      ratio.append(el('span', 'muted', '—'));
      ratio.title = row.nonfinite_steps > 0
        ? `No common step where both norms are known and finite: NaN/inf in ${row.nonfinite_steps} of ${row.steps}`
        : 'No common step where both norms are known (and the reference\'s is not 0)';
    } else {
      const dev = row.l2_ratio > 0 ? Math.abs(Math.log2(row.l2_ratio)) : Infinity;
      const r = row.l2_ratio;
      ratio.textContent = r === 0 ? '0× (no gradient)' : `${r >= 0.01 && r < 1000 ? r.toFixed(2) : numberText(r, 3)}×`;
      if (dev >= 4) ratio.classList.add('bad');
      else if (dev >= 1) ratio.classList.add('warn');
    }
    /** @param {number | null} v */
    const lostCell = (v) => {
      const td = el('td', 'num', fraction(v));
      if (v !== null && v > threshold) td.classList.add('warn');
      return td;
    };
    const only = el('td');
    if (row.underflow_only_in) {
      only.append(swatch(this.colors.get(row.underflow_only_in)), el('span', 'only-in', this.runName(row.underflow_only_in)));
    } else only.append(el('span', 'muted', '—'));
    const bad = el('td', 'num', String(row.nonfinite_steps));
    bad.classList.add(row.nonfinite_steps > 0 ? 'bad' : 'muted');
    tr.append(name, ratio, el('td', 'num muted', `${row.ratio_steps}/${row.steps}`), bad,
      lostCell(row.lost_frac_reference), lostCell(row.lost_frac), only);
    return tr;
  }
}

function runIdsFromUrl() {
  const raw = new URLSearchParams(location.search).get('runs') ?? '';
  return [...new Set(raw.split(',').map((s) => s.trim()).filter(Boolean))];
}

async function main() {
  const ids = runIdsFromUrl();
  if (ids.length < 2) {
    api.showError('Pick two or more runs on the runs list to compare them (this page needs ?runs=id1,id2).');
    return;
  }
  try {
    await new ComparePage(ids).load();
  } catch (err) {
    if (err instanceof api.ApiError && err.status === 404) {
      api.showNotFound(`Nothing to compare: ${err.detail ?? 'a run is unknown'} (the runs of this page come from its address, ?runs=…).`);
    } else {
      api.showError(/** @type {Error} */ (err).message);
    }
    // Nothing is streamed: the indicator must not say "connecting" for ever.
    $('live').dataset.state = 'closed';
    $('live-text').textContent = 'not connected';
  }
}

main();
