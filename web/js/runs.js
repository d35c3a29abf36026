// @ts-check
// Runs list: filter (words or a regex), sort, select runs to compare, page by page. The server
// sorts and filters (GET /api/runs, a keyset cursor: "load more" and infinite scroll fetch the
// next page of the same order and filter); the page re-sorts and re-filters only what it has
// loaded, at once, while the server's answer is on its way. Kept current by the runs socket
// (WS /api/runs/live: a snapshot of the first page and the active runs on every connect, then
// the runs that changed), so a new run or step shows without a reload and without polling;
// with the default order and no filter the first page is the socket's snapshot itself.

import { listRunsPage, showError } from './api.js';
import { findingCell } from './findings.js';
import { agoText, el, numberText, percentText, ranksText, scaleNode, statusBadge, toDate } from './format.js';
import { LiveState } from './live.js';
import { RunsStream } from './runs_live.js';
import { ConfigColumns } from './runs_columns.js';
import { RunGroups } from './runs_groups.js';
import { compareValues, TableSort } from './table_sort.js';

/** @import { Run, WorstLayer } from './codec.js' */
/** @import { RunsMessage } from './runs_live.js' */
/** @import { SortValue } from './table_sort.js' */

/** @type {Readonly<Record<string, number>>} */
const STATUS_ORDER = { active: 0, crashed: 1, finished: 2 };

/** @param {string} id */
const $ = (id) => /** @type {HTMLElement} index.html has each one */ (document.getElementById(id));
const body = $('runs-body');
const filter = /** @type {HTMLInputElement} */ ($('filter'));
const regexToggle = /** @type {HTMLInputElement} */ ($('filter-regex'));
const filterError = $('filter-error');
const compareButton = /** @type {HTMLButtonElement} */ ($('compare'));
const selectAll = /** @type {HTMLInputElement} */ ($('select-all'));
const loadMoreRow = $('load-more-row');
const loadMoreButton = $('load-more');
const table = /** @type {HTMLTableElement} */ ($('runs'));
const tableHead = /** @type {HTMLTableSectionElement} index.html's table has one */ (table.tHead);

const PAGE = 100; // runs per page (GET /api/runs?limit=)
const FILTER_DEBOUNCE_MS = 250; // the server is asked once typing pauses

/** @type {Run[]} the loaded runs of the current order and filter: a prefix of the server's list */
let runs = [];
let loaded = false;
/** @type {string | null} the path of the next page, null when every matching run is loaded */
let nextPage = null;
/** @type {number | null} how many runs the viewer has (the server's count, unfiltered) */
let total = null;
let pagesLoaded = 0;
let generation = 0; // answers to an order or filter since replaced are dropped
let loadingMore = false;
/** @type {number | null} */
let filterTimer = null;
/** @type {string} */
let liveState = LiveState.CONNECTING;
/** @type {Date | null} */
let updatedAt = null;
/** @type {string[]} run ids in the order they were picked: the first is the reference */
const selected = [];

/**
 * The filter as a predicate over a run, or an Error for an invalid regular expression.
 * @returns {((run: Run) => boolean) | Error}
 */
function matcher() {
  const query = filter.value.trim();
  if (!query) return () => true;
  /** @param {Run} run */
  const fields = (run) => [run.name, run.project, run.id, run.status, ...(run.tags ?? [])].map((f) => String(f ?? ''));
  if (regexToggle.checked) {
    let re;
    try {
      re = new RegExp(query, 'i');
    } catch (err) {
      // The browser's message already says "Invalid regular expression: /…/i: why".
      const { message } = /** @type {SyntaxError} */ (err);
      return new Error(message.startsWith('Invalid regular expression')
        ? message : `Invalid regular expression: ${message}`);
    }
    return (run) => fields(run).some((f) => re.test(f));
  }
  const words = query.toLowerCase().split(/\s+/);
  return (run) => {
    const hay = fields(run).join(' ').toLowerCase();
    return words.every((word) => hay.includes(word));
  };
}

/**
 * @param {Run} run
 * @param {string} key  a column's data-sort
 * @returns {SortValue}
 */
function sortValue(run, key) {
  switch (key) {
    case 'name': return (run.name || run.id).toLowerCase();
    case 'project': return run.project.toLowerCase();
    case 'status': return STATUS_ORDER[run.status] ?? 3;
    case 'steps': return run.num_steps;
    case 'scale': return run.last_scale;
    case 'skip_rate': return run.skip_rate;
    case 'underflow': return run.worst_underflow ? run.worst_underflow.value : null;
    case 'headroom': return run.worst_headroom ? run.worst_headroom.value : null;
    case 'started': return run.created_at;
    case 'updated': return run.updated_at;
    default: return null;
  }
}

const sort = new TableSort(tableHead, { key: 'started', direction: 'desc' }, () => {
  render(); // the loaded runs at once; then the server's first page of the new order
  reload();
});

const TICK_MS = 5000; // relative times ("3m ago") are redrawn this often without new data
const UNDERFLOW_WARN = 0.25; // the underflow finding's threshold (findings/thresholds.py)

/** @param {number} seconds  since the epoch */
function timeCell(seconds) {
  const td = el('td', 'num muted', agoText(seconds));
  td.dataset.ago = String(seconds);
  const when = toDate(seconds);
  if (when) td.title = when.toLocaleString();
  return td;
}

function tick() {
  const nodes = /** @type {NodeListOf<HTMLElement>} */ (body.querySelectorAll('[data-ago]'));
  for (const node of nodes) node.textContent = agoText(Number(node.dataset.ago));
}

/**
 * A layer name plus its value, or a dash: user text, so textContent only.
 * @param {WorstLayer | null} worst
 * @param {string} valueText
 * @param {string} level  the value's class
 */
function layerCell(worst, valueText, level) {
  const td = el('td', 'worst');
  if (!worst) {
    td.append(el('span', 'muted', '—'));
    return td;
  }
  const name = el('span', 'layer-name', worst.layer);
  name.title = worst.layer;
  const value = el('div', `worst-value ${level}`, valueText);
  td.append(value, name);
  return td;
}

// Lost to the format as the findings count it: structural zeros (dead ReLU units) not included.
/** @param {number} v */
function underflowLevel(v) {
  if (!(v > 0)) return 'muted';
  return v >= UNDERFLOW_WARN ? 'warn' : '';
}

// Dynamic loss scaling grows the scale until the next overflow, so 0–2 bits of headroom is the
// scaler working as designed: never a warning; below 0 the step overflowed.
/** @param {number | null | undefined} bits */
function headroomLevel(bits) {
  if (bits === null || bits === undefined || Number.isNaN(bits)) return 'muted';
  return bits < 0 ? 'bad' : '';
}

/** @param {number} bits */
function headroomText(bits) {
  if (bits === Infinity) return '∞ (all zero)';
  return `${numberText(bits, 3)} bits`;
}

/**
 * @param {Run} run
 * @returns {HTMLTableRowElement}
 */
function row(run) {
  const tr = el('tr');
  tr.dataset.runId = run.id;
  const isSelected = selected.includes(run.id);
  tr.classList.toggle('selected', isSelected);

  const checkCell = el('td', 'check');
  const box = el('input');
  box.type = 'checkbox';
  box.checked = isSelected;
  box.setAttribute('aria-label', `Select ${run.name || run.id} for comparison`);
  box.addEventListener('change', () => toggle(run.id, box.checked));
  checkCell.append(box);

  const name = el('td', 'run-name');
  const link = breakable(el('a'), run.name || run.id);
  link.href = `/runs/${encodeURIComponent(run.id)}`;
  name.append(link);
  const ranks = ranksText(run.world_size);
  if (ranks) {
    const badge = el('span', 'ranks-badge', ranks);
    badge.title = `A distributed job of ${run.world_size} processes (torch.distributed world size)`;
    name.append(' ', badge);
  }
  name.append(el('div', 'run-id', run.id.slice(0, 8)));

  const tags = el('td', 'tags');
  for (const tag of run.tags ?? []) {
    tags.append(breakable(el('span', 'tag'), tag)); // wraps between its parts, never cut
  }

  const status = el('td');
  status.append(statusBadge(run.status));

  const scale = el('td', 'num');
  scale.append(scaleNode(run.last_scale));

  const skip = el('td', 'num');
  if (run.skip_rate === null || run.skip_rate === undefined) skip.append(el('span', 'muted', '—'));
  else {
    skip.append(percentText(run.skipped_steps, run.num_steps));
    skip.append(el('div', 'cell-sub', `${run.skipped_steps} / ${run.num_steps}`));
    skip.title = `${run.skipped_steps} of ${run.num_steps} steps skipped`;
    if (run.skipped_steps) skip.classList.add('warn');
  }

  // A worst underflow of 0 % is no underflow: no layer to name (it was "0% · 0.weight").
  const under = run.worst_underflow && run.worst_underflow.value > 0 ? run.worst_underflow : null;
  const head = run.worst_headroom;
  tr.append(checkCell, name, el('td', null, run.project ?? ''), tags, status, findingCell(run.top_finding),
    el('td', 'num', String(run.num_steps ?? 0)), scale, skip,
    layerCell(under, under ? `${numberText(100 * under.value, 3)}%` : '', under ? underflowLevel(under.value) : ''),
    layerCell(head, head ? headroomText(head.value) : '', head ? headroomLevel(head.value) : ''),
    timeCell(run.created_at), timeCell(run.updated_at), ...columns.cells(run));
  tr.addEventListener('click', (event) => {
    if (/** @type {Element} */ (event.target).closest('a, input, label, .check')) return;
    location.href = link.href;
  });
  return tr;
}

/**
 * @param {string} id
 * @param {boolean} on
 */
function toggle(id, on) {
  const at = selected.indexOf(id);
  if (on && at < 0) selected.push(id);
  if (!on && at >= 0) selected.splice(at, 1);
  render();
}

/** @param {Run[]} shown */
function renderSelection(shown) {
  // A selection outlives the filter and the order: the run stays picked while it is not shown.
  compareButton.disabled = selected.length < 2;
  compareButton.textContent = selected.length ? `Compare ${selected.length} runs` : 'Compare';
  compareButton.title = selected.length < 2 ? 'Select two or more runs to compare them' : '';
  const shownSelected = shown.filter((r) => selected.includes(r.id)).length;
  selectAll.checked = shown.length > 0 && shownSelected === shown.length;
  selectAll.indeterminate = shownSelected > 0 && shownSelected < shown.length;
}

/**
 * The filter the server is asked for: empty while the regular expression is invalid.
 * @returns {{sort: string, order: string, q: string, regex: string, limit: string}}
 */
function serverQuery() {
  const q = filter.value.trim();
  return {
    sort: sort.key, order: sort.direction, q: matcher() instanceof Error ? '' : q,
    regex: regexToggle.checked ? 'true' : 'false', limit: String(PAGE),
  };
}

/** @param {{sort: string, order: string, q: string}} query */
const isDefault = (query) => query.sort === 'started' && query.order === 'desc' && !query.q;

function render() {
  const match = matcher();
  const invalid = match instanceof Error;
  const filtered = !invalid && filter.value.trim() !== '';
  filterError.hidden = !invalid;
  filterError.textContent = invalid ? `${match.message} — showing every run.` : '';
  filter.setAttribute('aria-invalid', String(invalid));
  const shown = sort.sorted(invalid ? runs : runs.filter(match), sortValue);
  columns.offer(runs);
  groups.offer(runs);
  body.replaceChildren(...groups.rows(shown, row, tableHead.rows[0].cells.length));
  $('empty').hidden = !loaded || filtered || runs.length > 0 || nextPage !== null;
  table.hidden = shown.length === 0;
  $('no-match').hidden = !loaded || !filtered || shown.length > 0 || nextPage !== null;
  loadMoreRow.hidden = nextPage === null;
  const known = total ?? runs.length;
  let count = '';
  if (filtered) count = `${shown.length} matching run${shown.length === 1 ? '' : 's'}${nextPage ? ' loaded, more below' : ''}`;
  else if (known) count = shown.length < known ? `${shown.length} of ${known} runs` : `${known} runs`;
  $('run-count').textContent = count;
  renderSelection(shown);
}

/** Merge summaries in by id: a known run is replaced; a new one joins when it matches the filter
 * and sorts within what is loaded (beyond it, it comes with a later page).
 * @param {Run[]} changed */
function merge(changed) {
  const byId = new Map(changed.map((r) => [r.id, r]));
  const known = new Set(runs.map((r) => r.id));
  const match = matcher();
  const ordered = sort.sorted(runs, sortValue);
  const last = ordered[ordered.length - 1];
  /** @param {Run} r */
  const fits = (r) => nextPage === null || !last
    || compareValues(sortValue(r, sort.key), sortValue(last, sort.key), sort.direction) <= 0;
  const added = changed.filter((r) => !known.has(r.id) && (match instanceof Error || match(r)) && fits(r));
  runs = [...added, ...runs.map((r) => byId.get(r.id) ?? r)];
}

/** The socket's summaries: its snapshot (`full`) is the first page of the default order, with
 * the older active runs apart (`active`: they update the runs loaded, never add to the page).
 * @param {Run[]} changed
 * @param {boolean} full
 * @param {RunsMessage} message */
function onRuns(changed, full, message) {
  const query = serverQuery();
  if (full && isDefault(query) && pagesLoaded <= 1 && generation === 0) {
    runs = changed;
    nextPage = message.next_cursor ? `/api/runs?${new URLSearchParams({ cursor: message.next_cursor, limit: String(PAGE) })}` : null;
    pagesLoaded = 1;
  } else merge(changed);
  if (full && message.active) merge(message.active); // older active runs: updates of those loaded
  if (full && message.total !== null && message.total !== undefined) total = message.total;
  loaded = true;
  updatedAt = new Date();
  render();
  renderLive();
}

/** Ask the server for the first page of the current order and filter. */
async function reload() {
  generation += 1;
  const mine = generation;
  try {
    const page = await listRunsPage(serverQuery());
    if (mine !== generation) return;
    runs = page.runs;
    nextPage = page.next;
    if (page.total !== null) total = page.total;
    pagesLoaded = 1;
    loaded = true;
    showError(null);
    render();
  } catch (err) {
    if (mine === generation) showError(/** @type {Error} */ (err).message);
  }
}

/** The next page of the same order and filter (the button, or scrolling to it). */
async function loadMore() {
  if (nextPage === null || loadingMore) return;
  loadingMore = true;
  const mine = generation;
  try {
    const page = await listRunsPage(nextPage);
    if (mine !== generation) return;
    const byId = new Map(page.runs.map((r) => [r.id, r]));
    const fresh = page.runs.filter((r) => !runs.some((known) => known.id === r.id));
    runs = [...runs.map((r) => byId.get(r.id) ?? r), ...fresh];
    nextPage = page.next;
    pagesLoaded += 1;
    render();
  } catch (err) {
    if (mine === generation) showError(/** @type {Error} */ (err).message);
  } finally {
    loadingMore = false;
  }
}

function onFilter() {
  render(); // at once, over what is loaded
  clearTimeout(filterTimer);
  filterTimer = setTimeout(reload, FILTER_DEBOUNCE_MS);
}

/** @param {string} [detail] */
function renderLive(detail) {
  const note = $('refresh-note');
  $('live').dataset.state = liveState;
  const when = updatedAt ? ` · updated ${updatedAt.toLocaleTimeString()}` : '';
  note.textContent = `${liveState}${detail ? ` · ${detail}` : ''}${when}`;
}

/**
 * @param {string} state  a LiveState
 * @param {string} [detail]
 */
function onState(state, detail) {
  liveState = state;
  if (state === LiveState.RETRYING) showError('Lost the connection to the server: the list shows the last known state.');
  else if (state === LiveState.OPEN) showError(null);
  renderLive(detail);
}

const columns = new ConfigColumns(tableHead.rows[0], $('columns-list'), () => render());
const groups = new RunGroups(/** @type {HTMLSelectElement} */ ($('group-by')), () => render());
$('server-url').textContent = location.origin;
filter.addEventListener('input', onFilter);
regexToggle.addEventListener('change', onFilter);
loadMoreButton.addEventListener('click', loadMore);
new IntersectionObserver((entries) => {
  if (entries.some((entry) => entry.isIntersecting)) loadMore();
}).observe(loadMoreButton);
selectAll.addEventListener('change', () => {
  const match = matcher();
  const shown = match instanceof Error ? runs : runs.filter(match);
  for (const run of shown) {
    const at = selected.indexOf(run.id);
    if (selectAll.checked && at < 0) selected.push(run.id);
    if (!selectAll.checked && at >= 0) selected.splice(at, 1);
  }
  render();
});
compareButton.addEventListener('click', () => {
  if (selected.length < 2) return;
  location.href = `/compare?runs=${selected.map(encodeURIComponent).join(',')}`;
});
setInterval(tick, TICK_MS);
window.ampscope = { runs: new RunsStream({ onRuns, onState }).start() }; // for the console and the tests


/**
 * `text` in `node`, with a line-break opportunity (<wbr>) after each separator (`_ - . / :`):
 * a long run name wraps between its parts, never mid-word, and copies as it was written.
 * @template {HTMLElement} T
 * @param {T} node
 * @param {string} text
 * @returns {T}
 */
export function breakable(node, text) {
  for (const part of String(text).split(/(?<=[-_./:])/)) {
    node.append(part, document.createElement('wbr'));
  }
  node.lastChild?.remove();
  return node;
}
