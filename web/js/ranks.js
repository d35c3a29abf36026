// Distributed runs: which rank went non-finite first, as one line in the run header. Read from
// GET /api/runs/{id}/ranks (one index probe on the server), never from the run's steps. Text
// only (textContent): nothing here is user input, but the page keeps to one way of writing.

import { getRanks } from './api.js';
import { numberText } from './format.js';

const REFRESH_MS = 5000; // while no rank has gone non-finite, live steps re-ask at most this often
const LISTED = 8; // ranks named one by one; past that, "and N more"

/** "ranks 0, 2, 3" / "rank 1" / "ranks 0, 1, …, 7 and 56 more". */
function rankList(ranks) {
  const shown = ranks.slice(0, LISTED).join(', ');
  const more = ranks.length > LISTED ? ` and ${ranks.length - LISTED} more` : '';
  return `${ranks.length === 1 ? 'rank' : 'ranks'} ${shown}${more}`;
}

/** What rank `r` showed at the step: its loss if non-finite, its non-finite layers if any. */
function rankDetail(first, r) {
  const parts = [];
  const loss = first.loss[r];
  if (typeof loss === 'number' && !Number.isFinite(loss)) parts.push(`loss ${numberText(loss)}`);
  const layers = first.nonfinite[r];
  if (layers > 0) parts.push(`${layers} ${layers === 1 ? 'layer' : 'layers'} with NaN/inf gradients`);
  return parts.join(', ');
}

/** The line's text for a /ranks answer (null: nothing to say, a single-process run). */
export function rankNoteText(body) {
  const size = body.world_size;
  if (!(size > 1)) return null;
  const first = body.first_nonfinite;
  if (!first) return `${size} ranks: no rank's loss or gradients have been NaN or inf.`;
  const bad = first.ranks;
  const details = bad.length === 1 ? rankDetail(first, bad[0])
    : bad.slice(0, LISTED).map((r) => `rank ${r}: ${rankDetail(first, r)}`).join('; ');
  const others = size - bad.length;
  const rest = others > 0
    ? ` while the other ${others === 1 ? 'rank was' : `${others} ranks were`} finite: inspect ${bad.length === 1 ? "that rank's batch" : "those ranks' batches"}`
    : ': every rank at once';
  return `First non-finite: ${rankList(bad)} at step ${first.step} (${details})${rest}.`;
}

export class RankNote {
  constructor(node, runId) {
    this.node = node;
    this.runId = runId;
    this.found = false;
    this.asked = 0;
  }

  async refresh() {
    this.asked = performance.now();
    this.render(await getRanks(this.runId));
  }

  render(body) {
    const text = rankNoteText(body);
    this.node.hidden = text === null;
    this.node.textContent = text ?? '';
    this.found = !!body.first_nonfinite;
    this.node.classList.toggle('bad', this.found);
    this.node.classList.toggle('muted', !this.found);
  }

  /** Live steps came in: ask again (throttled) until a rank is found. */
  stepsArrived(onError) {
    if (this.found || performance.now() - this.asked < REFRESH_MS) return;
    this.refresh().catch(onError);
  }
}
