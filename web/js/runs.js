// Runs list (GET /api/runs), refreshed every 2 s; each run links to its page.

import { listRuns, showError } from './api.js';
import { agoText, el, percentText, scaleNode, statusBadge, toDate } from './format.js';

const REFRESH_MS = 2000;

const body = document.getElementById('runs-body');
const table = document.getElementById('runs');
const empty = document.getElementById('empty');
const filter = document.getElementById('filter');
const note = document.getElementById('refresh-note');
let runs = [];

function matches(run, query) {
  if (!query) return true;
  const hay = [run.name, run.project, ...(run.tags ?? [])].join(' ').toLowerCase();
  return query.toLowerCase().split(/\s+/).every((word) => hay.includes(word));
}

function row(run) {
  const tr = el('tr');
  tr.dataset.runId = run.id;

  const name = el('td', 'run-name');
  const link = el('a', null, run.name || run.id);
  link.href = `/runs/${encodeURIComponent(run.id)}`;
  name.append(link, el('div', 'run-id', run.id.slice(0, 8)));

  const tags = el('td', 'tags');
  for (const tag of run.tags ?? []) tags.append(el('span', 'tag', tag));

  const status = el('td');
  status.append(statusBadge(run.status));

  const scale = el('td', 'num');
  scale.append(scaleNode(run.last_scale));

  const skipped = el('td', 'num');
  skipped.append(String(run.skipped_steps ?? 0));
  if (run.num_steps) skipped.append(el('span', 'muted', ` ${percentText(run.skipped_steps ?? 0, run.num_steps)}`));
  if (run.skipped_steps) skipped.classList.add('warn');

  const updated = el('td', 'num muted', agoText(run.updated_at));
  const when = toDate(run.updated_at);
  if (when) updated.title = when.toLocaleString();

  tr.append(name, el('td', null, run.project ?? ''), tags, status,
    el('td', 'num', String(run.num_steps ?? 0)), scale, skipped, updated);
  tr.addEventListener('click', (event) => {
    if (event.target.closest('a')) return;
    location.href = link.href;
  });
  return tr;
}

function render() {
  const shown = runs.filter((run) => matches(run, filter.value.trim()));
  body.replaceChildren(...shown.map(row));
  empty.hidden = runs.length > 0;
  table.hidden = runs.length === 0;
}

async function refresh() {
  try {
    runs = await listRuns();
    showError(null);
    note.textContent = `updated ${new Date().toLocaleTimeString()}`;
    render();
  } catch (err) {
    showError(err.message);
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

document.getElementById('server-url').textContent = location.origin;
filter.addEventListener('input', render);
refresh();
