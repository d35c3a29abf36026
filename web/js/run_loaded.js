// @ts-check
// The run page's run, once run.js has it: one promise the page's other scripts (run_admin.js,
// run_notes.js) wait on, whatever order the scripts ran in (an event dispatched before a later
// script listened would be missed when the network is slow).

/** @import { RunDetail } from './codec.js' */

/** @type {(run: RunDetail) => void} */
let announce;
/** Resolves with the run detail (GET /api/runs/{id}); never, for an unknown run.
 * @type {Promise<RunDetail>} */
export const runLoaded = new Promise((resolve) => { announce = resolve; });

/**
 * run.js: the run exists.
 * @param {RunDetail} run
 */
export function announceRun(run) {
  announce(run);
}
