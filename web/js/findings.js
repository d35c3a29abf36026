// Findings (GET /api/runs/{id}/findings): the diagnosis at the top of the run page, most severe
// first, each linking to the steps and layers it cites; and a run's most severe finding in the
// runs list (`top_finding` of the summary). Text reaches the page through textContent only.

import { getJSON, showError } from './api.js';
import { el, numberText } from './format.js';

const TAGS = { nan: NaN, inf: Infinity, '-inf': -Infinity };
const num = (v) => (typeof v === 'string' && v in TAGS ? TAGS[v] : v);
const PAD = 0.1; // the zoomed range shows a tenth of the cited range on each side (at least 5 steps)

/** A finding's severity as a small coloured label. */
function severityBadge(severity) {
  return el('span', `severity severity-${severity}`, severity);
}

function stepsText(f) {
  if (f.step_start === null || f.step_start === undefined) return '';
  return f.step_end !== f.step_start ? `steps ${f.step_start}–${f.step_end}` : `step ${f.step_start}`;
}

/** The x range that shows the finding's steps with some context, or null when it cites none. */
export function rangeOf(finding) {
  if (finding.step_start === null || finding.step_start === undefined) return null;
  const end = finding.step_end ?? finding.step_start;
  const pad = Math.max(5, Math.round(PAD * (end - finding.step_start)));
  return [Math.max(0, finding.step_start - pad), end + pad];
}

/**
 * Show the cited range on the scale chart (its zoom handler then fetches the detail) and the
 * cited layers' lines. `page` is run.js's RunPage: its `scale.div`, `layerNames`, `layerLines`.
 */
export async function focusFinding(page, finding) {
  const range = rangeOf(finding);
  if (range) await Plotly.relayout(page.scale.div, { 'xaxis.range': range });
  const indices = finding.layers.map((name) => page.layerNames.indexOf(name)).filter((i) => i >= 0);
  for (const index of indices) {
    if (!page.layerLines.shown.includes(index)) await page.layerLines.toggle(index);
  }
  page.scale.div.scrollIntoView({ block: 'center' });
}

function findingItem(page, f) {
  const item = el('li', `finding finding-${f.severity}`);
  item.dataset.kind = f.kind;
  const head = el('div', 'finding-head');
  const title = el('button', 'finding-title', f.title);
  title.type = 'button';
  title.title = 'Show these steps on the loss-scale chart and these layers\' lines';
  title.addEventListener('click', () => focusFinding(page, f).catch((err) => showError(err.message)));
  head.append(severityBadge(f.severity), title, el('span', 'muted', stepsText(f)));
  item.append(head, el('p', 'finding-text', f.explanation));
  if (f.layers.length) item.append(el('p', 'finding-layers', `Layers, most responsible first: ${f.layers.join(', ')}`));
  const evidence = Object.entries(f.evidence).map(([k, v]) => `${k} ${numberText(num(v))}`).join(' · ');
  if (evidence) item.append(el('p', 'finding-evidence', evidence));
  item.append(el('p', 'finding-advice', `→ ${f.recommendation}`));
  return item;
}

/** Fetch and render the run's findings into #findings (the run page calls this once loaded). */
export async function showFindings(page) {
  const panel = document.getElementById('findings');
  if (!panel) return;
  const body = await getJSON(`/api/runs/${encodeURIComponent(page.runId)}/findings`);
  const list = el('ol', 'findings');
  for (const f of body.findings) list.append(findingItem(page, f));
  const counts = { error: 0, warning: 0, info: 0 };
  for (const f of body.findings) counts[f.severity] += 1;
  const note = body.findings.length
    ? `${counts.error} error · ${counts.warning} warning · ${counts.info} info`
    : 'nothing found: no overflow, underflow or misuse worth reporting';
  const head = el('div', 'panel-head');
  head.append(el('h2', null, 'Findings'), el('span', 'panel-note', note));
  panel.replaceChildren(head, list);
  panel.hidden = false;
}

/** The runs list's cell for a summary's `top_finding` (null: none). */
export function findingCell(top) {
  const td = el('td', 'finding-cell');
  if (!top) {
    td.append(el('span', 'muted', '—'));
    return td;
  }
  td.append(severityBadge(top.severity), el('div', 'finding-brief', top.title));
  td.title = top.title;
  return td;
}
