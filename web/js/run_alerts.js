// @ts-check
// The run page's alert history (the run id comes from the address, /runs/{id}): fetched on load
// and every REFRESH_MS while the page is open, so an alert decided during a live run shows up.
// While the page's live socket is not open (the server restarting) it waits: a fetch to a
// server that is away would only log a failed request. Open is "live" while the run trains
// and "connected" once it ended: the history refreshes in both (an alert decided during a live
// run used to wait for the run's end).

import { getJSON } from './api.js';
import { drawAlerts } from './alerts_table.js';

/** @import { AlertsPage } from './alerts_table.js' */

const REFRESH_MS = 5000;

/**
 * Draw the run's newest alerts; false when they could not be read.
 * @param {string} runId
 * @param {HTMLElement} body
 * @param {HTMLElement} note
 * @returns {Promise<boolean>}
 */
async function refresh(runId, body, note) {
  try {
    const page = /** @type {AlertsPage} */ (await getJSON(`/api/runs/${encodeURIComponent(runId)}/alerts?limit=50`));
    drawAlerts(body, page.alerts);
    note.textContent = page.next_before === null ? '' : 'the 50 newest';
  } catch (err) {
    const error = /** @type {Error & {status?: number}} getJSON's ApiError, or another */ (err);
    note.textContent = error.status === 404 ? '' : `could not load alerts (${error.message})`;
    return false;
  }
  return true;
}

async function main() {
  const body = document.getElementById('alerts-body');
  const note = document.getElementById('alerts-note');
  if (!body || !note) return;
  const runId = decodeURIComponent(window.location.pathname.split('/').pop() ?? '');
  if (!(await refresh(runId, body, note))) return;
  const OPEN = new Set(['live', 'connected']);
  const connected = () => OPEN.has(document.getElementById('live')?.dataset.state ?? '');
  setInterval(() => {
    if (connected()) refresh(runId, body, note);
  }, REFRESH_MS);
}

main();
