// @ts-check
// HTTP read API (docs/contracts.md): fetch helpers that decode floats and fail with clear messages.

import {
  decodeCompare, decodeEvents, decodeFormatTrend, decodeFormats, decodeLayerStats, decodeOptimizers, decodeRanks,
  decodeRun, decodeSeries, decodeStep,
} from './codec.js';

/**
 * @import { CompareOf, FormatTrendOf, FormatsOf, LayerStatsOf, OptimizersOf, RanksOf, Run, RunDetailOf, RunEvent,
 *   RunEventOf, RunOf, SeriesOf, Step, StepOf, Tagged } from './codec.js'
 */

/**
 * A row of a run's layer table (GET /api/runs/{id}/layers), in model order.
 * @typedef {{index: number, name: string, raw_name?: string | null, shape: number[], dtype: string,
 *   numel: number, module_type: string}} LayerInfo
 */

/**
 * /skip-rate: the rolling skip rate's bucket maxima, and the last window's [step, skipped].
 * @typedef {{window: number, downsampled: boolean, points: {step: number, rate: number}[],
 *   tail: [number, boolean][]}} SkipRate
 */

export class ApiError extends Error {
  /**
   * @param {string} message
   * @param {number} status  the HTTP status; 0 when the server was not reached
   * @param {string | null} [detail]
   */
  constructor(message, status, detail = null) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.detail = detail; // the server's own words (its `detail`), when it gave some
  }
}

/**
 * GET `path`; on failure throw an ApiError naming the URL, the status and the detail.
 * @param {string} path
 * @returns {Promise<Response>}
 */
async function fetchOk(path) {
  let response;
  try {
    response = await fetch(path, { headers: { Accept: 'application/json' } });
  } catch (err) {
    throw new ApiError(`GET ${path} failed: the server is not reachable (${/** @type {Error} */ (err).message})`, 0);
  }
  if (!response.ok) {
    let detail = response.statusText;
    try {
      const body = /** @type {{detail?: unknown} | null} an error body, when JSON */ (await response.json());
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

/**
 * GET a JSON document (see fetchOk for failures). Its shape is the caller's to name: the API's
 * contract (docs/contracts.md), not checked here.
 * @param {string} path
 * @returns {Promise<unknown>}
 */
export async function getJSON(path) {
  return (await fetchOk(path)).json();
}

/** @param {string} id */
const runPath = (id) => `/api/runs/${encodeURIComponent(id)}`;

/**
 * One page of the runs list: `query` = {sort, order, q, regex, limit} for the first page, or the
 * `next` path a page gave. Resolves to {runs, next (path of the next page or null), total}.
 * @param {Record<string, string> | string} query
 * @returns {Promise<{runs: Run[], next: string | null, total: number | null}>}
 */
export async function listRunsPage(query) {
  const path = typeof query === 'string' ? query : `/api/runs?${new URLSearchParams(query)}`;
  const response = await fetchOk(path);
  const link = /<([^>]+)>;\s*rel="next"/.exec(response.headers.get('Link') ?? '');
  const total = response.headers.get('X-Total-Count');
  return {
    runs: /** @type {RunOf<Tagged>[]} */ (await response.json()).map(decodeRun),
    next: link ? link[1] : null,
    total: total === null ? null : Number(total),
  };
}

/**
 * GET /api/runs/{id}: the run's detail.
 * @param {string} id
 */
export async function getRun(id) {
  return decodeRun(/** @type {RunDetailOf<Tagged>} */ (await getJSON(runPath(id))));
}

/**
 * The run's layer table.
 * @param {string} id
 * @returns {Promise<LayerInfo[]>}
 */
export function getLayers(id) {
  return /** @type {Promise<LayerInfo[]>} */ (getJSON(`${runPath(id)}/layers`));
}

/**
 * One page of step scalars after `afterId`: {steps, last_id}.
 * @param {string} id
 * @param {number} afterId
 * @param {number} [limit]
 * @returns {Promise<{steps: Step[], last_id: number}>}
 */
export async function getSteps(id, afterId, limit = 10000) {
  const body = /** @type {{steps: StepOf<Tagged>[], last_id: number}} */ (
    await getJSON(`${runPath(id)}/steps?after_id=${afterId}&limit=${limit}`));
  return { steps: body.steps.map(decodeStep), last_id: body.last_id };
}

/**
 * /ranks: the run's world size and the first step where a rank went non-finite (or null).
 * @param {string} id
 */
export async function getRanks(id) {
  return decodeRanks(/** @type {RanksOf<Tagged>} */ (await getJSON(`${runPath(id)}/ranks`)));
}

/**
 * /series/{name}; `range` = {start, end} (steps, inclusive) for the detail of a zoomed range.
 * @param {string} id
 * @param {string} name  'scale', 'loss', 'grad_norm', ...
 * @param {number} maxPoints
 * @param {{start: number, end: number} | null} [range]
 */
export async function getSeries(id, name, maxPoints, range = null) {
  const query = new URLSearchParams({ max_points: String(maxPoints) });
  if (range) {
    query.set('start', String(Math.floor(range.start)));
    query.set('end', String(Math.ceil(range.end)));
  }
  return decodeSeries(/** @type {SeriesOf<Tagged>} */ (await getJSON(`${runPath(id)}/series/${name}?${query}`)));
}

/**
 * One page of /events: at most `limit` event steps from `start` (within `end`), as
 * {events, next_start}; next_start (a step) when more follow, for the next page. The page asks
 * for what the screen shows (the first page, the zoomed range, the steps after those it holds),
 * never the whole list.
 * @param {string} id
 * @param {{start?: number | null, end?: number | null, limit?: number | null}} [page]
 * @returns {Promise<{events: RunEvent[], next_start: number | null}>}
 */
export async function getEvents(id, { start = null, end = null, limit = null } = {}) {
  const query = new URLSearchParams();
  if (start !== null) query.set('start', String(Math.max(0, Math.floor(start))));
  if (end !== null) query.set('end', String(Math.max(0, Math.ceil(end))));
  if (limit !== null) query.set('limit', String(limit));
  const text = query.toString();
  const body = /** @type {{events: RunEventOf<Tagged>[], next_start?: number | null}} */ (
    await getJSON(`${runPath(id)}/events${text ? `?${text}` : ''}`));
  return { events: decodeEvents(body), next_start: body.next_start ?? null };
}

/**
 * /skip-rate: bucket maxima of the rolling rate, and the last window's steps to go on live.
 * @param {string} id
 * @param {number} maxPoints
 * @returns {Promise<SkipRate>}
 */
export function getSkipRate(id, maxPoints) {
  return /** @type {Promise<SkipRate>} */ (getJSON(`${runPath(id)}/skip-rate?max_points=${maxPoints}`));
}

/**
 * /optimizers: each watched optimizer's skipped steps and its groups' lr (empty: none sent).
 * @param {string} id
 * @param {number} maxPoints
 */
export async function getOptimizers(id, maxPoints) {
  return decodeOptimizers(/** @type {OptimizersOf<Tagged>} */ (
    await getJSON(`${runPath(id)}/optimizers?max_points=${maxPoints}`)));
}

/**
 * /layer-stats; `options` may hold start, end, max_points, layers (one layer's index) and source.
 * @param {string} id
 * @param {string} stat
 * @param {Record<string, string | number | null | undefined>} [options]
 */
export async function getLayerStats(id, stat, options = {}) {
  const query = new URLSearchParams({ stat });
  for (const [key, value] of Object.entries(options)) {
    if (value !== null && value !== undefined) query.set(key, String(value));
  }
  return decodeLayerStats(/** @type {LayerStatsOf<Tagged>} */ (
    await getJSON(`${runPath(id)}/layer-stats?${query}`)));
}

/**
 * /formats: the run's sampled steps, the matrix of the sampled step at or before `step` (null:
 * the last) and each recipe's verdict as of it.
 * @param {string} id
 * @param {number | null} [step]
 */
export async function getFormats(id, step = null) {
  const query = step === null ? '' : `?step=${encodeURIComponent(String(step))}`;
  return decodeFormats(/** @type {FormatsOf<Tagged>} */ (await getJSON(`${runPath(id)}/formats${query}`)));
}

/**
 * /formats/trend: one layer's operand under one recipe over the sampled steps.
 * @param {string} id
 * @param {{layer: number, operand: string, recipe: string}} cell  `layer`: the layer table's row
 */
export async function getFormatTrend(id, { layer, operand, recipe }) {
  const query = new URLSearchParams({ layer: String(layer), operand, recipe });
  return decodeFormatTrend(/** @type {FormatTrendOf<Tagged>} */ (
    await getJSON(`${runPath(id)}/formats/trend?${query}`)));
}

/**
 * GET /api/compare: the first id is the reference.
 * @param {string[]} ids
 * @param {number} tolerance
 * @param {number} underflowThreshold
 */
export async function getCompare(ids, tolerance, underflowThreshold) {
  const query = new URLSearchParams({ runs: ids.join(','), tolerance: String(tolerance),
    underflow_threshold: String(underflowThreshold) });
  return decodeCompare(/** @type {CompareOf<Tagged>} */ (await getJSON(`/api/compare?${query}`)));
}

/**
 * Show (or, with null, clear) the page's error banner. Text only: messages may quote user input.
 * @param {string | null} message
 */
export function showError(message) {
  const banner = document.getElementById('error');
  if (!banner) return;
  banner.textContent = message ?? '';
  banner.hidden = !message;
}

/**
 * A friendly "not found" state in the error banner: what is missing, in the server's words, and
 * a way back to the runs list. Text only (the message may quote an id from the address).
 * @param {string} message
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
