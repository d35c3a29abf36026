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

function nonfiniteLoss(first, r) {
  const loss = first.loss[r];
  return typeof loss === 'number' && !Number.isFinite(loss);
}

function layersText(layers) {
  return `${layers} ${layers === 1 ? 'layer' : 'layers'} with NaN/inf gradients`;
}

/** The line's text for a /ranks answer (null: nothing to say, a single-process run).
 *  `first.ranks` is where the step went bad: the ranks whose own loss was non-finite when any
 *  (their gradients are after the all-reduce, so one rank's NaN reaches every rank's), else
 *  the ranks whose gradients held NaN/inf with every loss finite (FSDP shards: no origin). */
export function rankNoteText(body) {
  const size = body.world_size;
  if (!(size > 1)) return null;
  const first = body.first_nonfinite;
  if (!first) return `${size} ranks: no rank's loss or gradients have been NaN or inf.`;
  const bad = first.ranks;
  if (!bad.every((r) => nonfiniteLoss(first, r))) {
    const where = bad.slice(0, LISTED)
      .map((r) => `rank ${r}: ${layersText(first.nonfinite[r])}`).join('; ');
    return `First non-finite: gradients at step ${first.step} (${where}), every loss finite.`;
  }
  const details = bad.length === 1 ? `loss ${numberText(first.loss[bad[0]])}`
    : bad.slice(0, LISTED).map((r) => `rank ${r}: loss ${numberText(first.loss[r])}`).join('; ');
  const others = first.loss.filter((x) => typeof x === 'number' && Number.isFinite(x)).length;
  const rest = others > 0
    ? ` while ${others === 1 ? "1 other rank's loss was" : `${others} other ranks' losses were`} finite: inspect ${bad.length === 1 ? "that rank's batch" : "those ranks' batches"}`
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
