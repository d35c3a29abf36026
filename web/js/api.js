// HTTP read API (docs/contracts.md): fetch helpers that decode floats and fail with clear messages.

import {
  decodeCompare, decodeEvents, decodeLayerStats, decodeOptimizers, decodeRanks, decodeRun, decodeSeries, decodeStep,
} from './codec.js';

export class ApiError extends Error {
  constructor(message, status, detail = null) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.detail = detail; // the server's own words (its `detail`), when it gave some
  }
}

/** GET `path`; on failure throw an ApiError naming the URL, the status and the detail. */
async function fetchOk(path) {
  let response;
  try {
    response = await fetch(path, { headers: { Accept: 'application/json' } });
  } catch (err) {
    throw new ApiError(`GET ${path} failed: the server is not reachable (${err.message})`, 0);
  }
  if (!response.ok) {
    let detail = response.statusText;
    try {
      const body = await response.json();
      if (body && body.detail !== undefined) {
        detail = typeof body.detail === 'string' ? body.detail : JSON.stringify(body.detail);
      }
    } catch {
      // not JSON: keep the status text
    }
    throw new ApiError(`GET ${path} → ${response.status}: ${detail}`, response.status, detail);
  }
  return response;
}

/** GET a JSON document (see fetchOk for failures). */
export async function getJSON(path) {
  return (await fetchOk(path)).json();
}

const runPath = (id) => `/api/runs/${encodeURIComponent(id)}`;

/**
 * One page of the runs list: `query` = {sort, order, q, regex, limit} for the first page, or the
 * `next` path a page gave. Resolves to {runs, next (path of the next page or null), total}.
 */
export async function listRunsPage(query) {
  const path = typeof query === 'string' ? query : `/api/runs?${new URLSearchParams(query)}`;
  const response = await fetchOk(path);
  const link = /<([^>]+)>;\s*rel="next"/.exec(response.headers.get('Link') ?? '');
  const total = response.headers.get('X-Total-Count');
  return {
    runs: (await response.json()).map(decodeRun),
    next: link ? link[1] : null,
    total: total === null ? null : Number(total),
  };
}

export async function getRun(id) {
  return decodeRun(await getJSON(runPath(id)));
}

export function getLayers(id) {
  return getJSON(`${runPath(id)}/layers`);
}

/** One page of step scalars after `afterId`: {steps, last_id}. */
export async function getSteps(id, afterId, limit = 10000) {
  const body = await getJSON(`${runPath(id)}/steps?after_id=${afterId}&limit=${limit}`);
  return { steps: body.steps.map(decodeStep), last_id: body.last_id };
}

/** /ranks: the run's world size and the first step where a rank went non-finite (or null). */
export async function getRanks(id) {
  return decodeRanks(await getJSON(`${runPath(id)}/ranks`));
}

/** /series/{name}; `range` = {start, end} (steps, inclusive) for the detail of a zoomed range. */
export async function getSeries(id, name, maxPoints, range = null) {
  const query = new URLSearchParams({ max_points: String(maxPoints) });
  if (range) {
    query.set('start', String(Math.floor(range.start)));
    query.set('end', String(Math.ceil(range.end)));
  }
  return decodeSeries(await getJSON(`${runPath(id)}/series/${name}?${query}`));
}

/**
 * One page of /events: at most `limit` event steps from `start` (within `end`), as
 * {events, next_start}; next_start (a step) when more follow, for the next page. The page asks
 * for what the screen shows (the first page, the zoomed range, the steps after those it holds),
 * never the whole list.
 */
export async function getEvents(id, { start = null, end = null, limit = null } = {}) {
  const query = new URLSearchParams();
  if (start !== null) query.set('start', String(Math.max(0, Math.floor(start))));
  if (end !== null) query.set('end', String(Math.max(0, Math.ceil(end))));
  if (limit !== null) query.set('limit', String(limit));
  const text = query.toString();
  const body = await getJSON(`${runPath(id)}/events${text ? `?${text}` : ''}`);
  return { events: decodeEvents(body), next_start: body.next_start ?? null };
}

/** /skip-rate: bucket maxima of the rolling rate, and the last window's steps to go on live. */
export function getSkipRate(id, maxPoints) {
  return getJSON(`${runPath(id)}/skip-rate?max_points=${maxPoints}`);
}

/** /optimizers: each watched optimizer's skipped steps and its groups' lr (empty: none sent). */
export async function getOptimizers(id, maxPoints) {
  return decodeOptimizers(await getJSON(`${runPath(id)}/optimizers?max_points=${maxPoints}`));
}

/** /layer-stats; `options` may hold start, end and max_points. */
export async function getLayerStats(id, stat, options = {}) {
  const query = new URLSearchParams({ stat });
  for (const [key, value] of Object.entries(options)) {
    if (value !== null && value !== undefined) query.set(key, String(value));
  }
  return decodeLayerStats(await getJSON(`${runPath(id)}/layer-stats?${query}`));
}

/** GET /api/compare: the first id is the reference. */
export async function getCompare(ids, tolerance, underflowThreshold) {
  const query = new URLSearchParams({ runs: ids.join(','), tolerance: String(tolerance),
    underflow_threshold: String(underflowThreshold) });
  return decodeCompare(await getJSON(`/api/compare?${query}`));
}

/** Show (or, with null, clear) the page's error banner. Text only: messages may quote user input. */
export function showError(message) {
  const banner = document.getElementById('error');
  if (!banner) return;
  banner.textContent = message ?? '';
  banner.hidden = !message;
}

/**
 * A friendly "not found" state in the error banner: what is missing, in the server's words, and
 * a way back to the runs list. Text only (the message may quote an id from the address).
 */
export function showNotFound(message) {
  const banner = document.getElementById('error');
  if (!banner) return;
  const back = document.createElement('a');
  back.href = '/';
  back.textContent = 'Back to the runs list';
  banner.replaceChildren(document.createTextNode(`${message} `), back);
  banner.classList.add('banner-not-found');
  banner.hidden = false;
}
