// @ts-check
// Findings (GET /api/runs/{id}/findings): the diagnosis at the top of the run page, root causes
// first with their consequences under them, each linking to the steps and layers it cites; and a
// run's root-cause finding in the runs list (`top_finding` of the summary). Live: the panel fetches
// again when new steps arrived (at most every REFETCH_MS, once more after the last change) and
// updates each finding in place by its identity, so nothing blinks. Text reaches the page through
// textContent only.

import { getJSON, showError } from './api.js';
import { num } from './codec.js';
import { el, numberText } from './format.js';

/** @import { FindingBrief, Severity, Tagged } from './codec.js' */
/** @import { LayerLines } from './layer_lines.js' */

/**
 * A finding of GET /api/runs/{id}/findings (docs/findings.md).
 * @typedef {object} Finding
 * @property {string} kind
 * @property {Severity} severity
 * @property {string} title
 * @property {string} explanation
 * @property {string} recommendation
 * @property {number | null} step_start  the steps it cites (null: none)
 * @property {number | null} step_end
 * @property {string[]} layers  the layers it cites, most responsible first
 * @property {Record<string, Tagged>} evidence
 * @property {string} identity  stable across analyses: the panel updates it in place
 * @property {string | null} cause  the identity of the root cause it follows from
 * @property {number | null} held_since  the last step an analysis raised it (null: the latest did)
 */

/**
 * The layer losing most to the format (median over its recent layer-stat steps).
 * @typedef {{layer: string, lost_frac: Tagged, structural_zero_frac: Tagged, steps: number}} LayerLoss
 */

/**
 * @typedef {object} FindingsBody
 * @property {Finding[]} findings  root causes first, each followed by its consequences
 * @property {number | null} [step]  the newest step the analysis saw
 * @property {LayerLoss | null} [worst_loss]
 */

/**
 * What the panel uses of the run page (run.js's RunPage).
 * @typedef {{runId: string, scale: {div: PlotDiv}, layerNames: string[], layerLines: LayerLines}} FindingsPage
 */

const PAD = 0.1; // the zoomed range shows a tenth of the cited range on each side (at least 5 steps)
export const REFETCH_MS = 3000; // the server analyses a changing run at most every 2 s

/**
 * A finding's severity as a small coloured label.
 * @param {Severity} severity
 */
function severityBadge(severity) {
  return el('span', `severity severity-${severity}`, severity);
}

/** @param {Finding} f */
function stepsText(f) {
  if (f.step_start === null || f.step_start === undefined) return '';
  return f.step_end !== f.step_start ? `steps ${f.step_start}–${f.step_end}` : `step ${f.step_start}`;
}

/**
 * The x range that shows the finding's steps with some context, or null when it cites none.
 * @param {Finding} finding
 * @returns {[number, number] | null}
 */
export function rangeOf(finding) {
  if (finding.step_start === null || finding.step_start === undefined) return null;
  const end = finding.step_end ?? finding.step_start;
  const pad = Math.max(5, Math.round(PAD * (end - finding.step_start)));
  return [Math.max(0, finding.step_start - pad), end + pad];
}

/**
 * Show the cited range on the scale chart (its zoom handler then fetches the detail) and the
 * cited layers' lines. `page` is run.js's RunPage: its `scale.div`, `layerNames`, `layerLines`.
 * @param {FindingsPage} page
 * @param {Finding} finding
 */
export async function focusFinding(page, finding) {
  const range = rangeOf(finding);
  // plotly.js's global: the run page has drawn its charts before a finding can be clicked. (Not
  // plot.js's: the runs list uses this module too, without plotly.js.)
  const plotly = /** @type {PlotlyStatic} */ (window.Plotly);
  if (range) await plotly.relayout(page.scale.div, { 'xaxis.range': range });
  const indices = finding.layers.map((name) => page.layerNames.indexOf(name)).filter((i) => i >= 0);
  for (const index of indices) {
    if (!page.layerLines.shown.includes(index)) await page.layerLines.toggle(index);
  }
  page.scale.div.scrollIntoView({ block: 'center' });
}

/**
 * Fill `item` (an <li>, kept across updates) with finding `f`.
 * @param {HTMLLIElement} item
 * @param {FindingsPage} page
 * @param {Finding} f
 * @param {string | undefined} causeTitle  the title of the finding it follows from
 */
function fillItem(item, page, f, causeTitle) {
  const held = typeof f.held_since === 'number';
  item.className = `finding finding-${f.severity}${f.cause ? ' finding-consequence' : ''}${held ? ' finding-held' : ''}`;
  item.dataset.kind = f.kind;
  item.dataset.identity = f.identity;
  item.dataset.severity = f.severity;
  const head = el('div', 'finding-head');
  const title = el('button', 'finding-title', f.title);
  title.type = 'button';
  title.title = 'Show these steps on the loss-scale chart and these layers\' lines';
  title.addEventListener('click', () => focusFinding(page, f).catch((err) => showError(err.message)));
  head.append(severityBadge(f.severity), title, el('span', 'muted', stepsText(f)));
  if (held) {
    head.append(el('span', 'finding-state', `not seen since step ${f.held_since}`));
  }
  const parts = [head];
  if (f.cause) parts.push(el('p', 'finding-cause', `Follows from: ${causeTitle ?? f.cause}`));
  parts.push(el('p', 'finding-text', f.explanation));
  if (f.layers.length) parts.push(el('p', 'finding-layers', `Layers, most responsible first: ${f.layers.join(', ')}`));
  const evidence = Object.entries(f.evidence).map(([k, v]) => `${k} ${numberText(num(v))}`).join(' · ');
  if (evidence) parts.push(el('p', 'finding-evidence', evidence));
  if (!f.cause) parts.push(el('p', 'finding-advice', `→ ${f.recommendation}`));
  item.replaceChildren(...parts);
}

/** The run page's findings panel (#findings): fetched on load, again when steps arrive. */
export class FindingsPanel {
  /**
   * @param {FindingsPage} page
   * @param {HTMLElement | null} [panel]
   */
  constructor(page, panel = document.getElementById('findings')) {
    this.page = page;
    this.panel = panel;
    /** @type {Map<string, HTMLLIElement>} identity → <li>, kept while the finding is shown */
    this.items = new Map();
    this.list = el('ol', 'findings');
    this.note = el('span', 'panel-note');
    /** @type {FindingsBody | null} */
    this.body = null;
    this.lastFetch = -Infinity;
    /** @type {number | null} */
    this.timer = null;
    /** @type {Promise<void> | null} */
    this.inFlight = null;
    this.wanted = -1; // the newest step the page holds; fetch until the analysis has seen it
    /** @type {(body: FindingsBody) => void} */
    this.onUpdate = () => {};
  }

  /**
   * Steps up to `step` arrived: fetch again (throttled) until the analysis covers them.
   * @param {number} step
   */
  stepsArrived(step) {
    this.wanted = Math.max(this.wanted, step);
    this.schedule();
  }

  schedule() {
    if (this.timer !== null || this.inFlight) return;
    const wait = Math.max(0, this.lastFetch + REFETCH_MS - performance.now());
    this.timer = setTimeout(() => {
      this.timer = null;
      this.refresh().catch((err) => showError(err.message));
    }, wait);
  }

  async refresh() {
    if (this.inFlight) return this.inFlight;
    this.lastFetch = performance.now();
    this.inFlight = getJSON(`/api/runs/${encodeURIComponent(this.page.runId)}/findings`)
      .then((body) => this.render(/** @type {FindingsBody} */ (body)))
      .finally(() => {
        this.inFlight = null;
        // The server's analysis is up to 2 s behind the newest steps: ask again until it has them.
        if (this.body && typeof this.body.step === 'number' && this.body.step < this.wanted) this.schedule();
      });
    return this.inFlight;
  }

  /** @param {FindingsBody} body */
  render(body) {
    this.body = body;
    const panel = this.panel;
    if (!panel) return;
    /** @type {Map<string | null, string>} a root cause's `cause` (null) has no title */
    const titles = new Map(body.findings.map((f) => [f.identity, f.title]));
    const keep = new Set();
    const ordered = [];
    for (const f of body.findings) {
      let item = this.items.get(f.identity);
      if (!item) {
        item = el('li');
        this.items.set(f.identity, item);
      }
      fillItem(item, this.page, f, titles.get(f.cause));
      keep.add(f.identity);
      ordered.push(item);
    }
    for (const [identity, item] of this.items) {
      if (!keep.has(identity)) {
        item.remove();
        this.items.delete(identity);
      }
    }
    this.list.append(...ordered); // moves kept nodes into the new order without recreating them
    const counts = { error: 0, warning: 0, info: 0 };
    for (const f of body.findings) counts[f.severity] += 1;
    const roots = body.findings.filter((f) => !f.cause).length;
    const at = typeof body.step === 'number' && body.step >= 0 ? ` · analysed at step ${body.step}` : '';
    this.note.textContent = body.findings.length
      ? `${counts.error} error · ${counts.warning} warning · ${counts.info} info · ${roots} root cause${roots === 1 ? '' : 's'}, read first${at}`
      : `nothing found: no overflow, underflow or misuse worth reporting${at}`;
    panel.dataset.step = String(body.step ?? '');
    if (!panel.firstChild) {
      const head = el('div', 'panel-head');
      head.append(el('h2', null, 'Findings'), this.note);
      panel.replaceChildren(head, this.list);
    }
    panel.hidden = false;
    this.onUpdate(body);
  }
}

/**
 * The runs list's cell for a summary's `top_finding` (null: none).
 * @param {FindingBrief | null | undefined} top
 */
export function findingCell(top) {
  const td = el('td', 'finding-cell');
  if (!top) {
    td.append(el('span', 'muted', '—'));
    return td;
  }
  td.append(severityBadge(top.severity), el('div', 'finding-brief', top.title));
  td.dataset.kind = top.kind;
  td.dataset.severity = top.severity;
  td.title = top.title;
  return td;
}
