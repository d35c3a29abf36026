// @ts-check
// Distributed runs: which rank went non-finite first, as one line in the run header. Read once
// from GET /api/runs/{id}/ranks (one index probe on the server), then carried on from the live
// steps' own `ranks` (the same rule as the server's: the earliest step, a rank's own NaN/inf
// loss first), never by asking again. Text only (textContent): nothing here is user input, but
// the page keeps to one way of writing.

import { getRanks } from './api.js';
import { numberText } from './format.js';

/** @import { FirstNonfinite, Ranks, Step } from './codec.js' */

const LISTED = 8; // ranks named one by one; past that, "and N more"

/**
 * "ranks 0, 2, 3" / "rank 1" / "ranks 0, 1, …, 7 and 56 more".
 * @param {number[]} ranks
 */
function rankList(ranks) {
  const shown = ranks.slice(0, LISTED).join(', ');
  const more = ranks.length > LISTED ? ` and ${ranks.length - LISTED} more` : '';
  return `${ranks.length === 1 ? 'rank' : 'ranks'} ${shown}${more}`;
}

/**
 * @param {FirstNonfinite} first
 * @param {number} r  a rank
 */
function nonfiniteLoss(first, r) {
  const loss = first.loss[r];
  return typeof loss === 'number' && !Number.isFinite(loss);
}

/** @param {number | null} layers  how many (null: unknown) */
function layersText(layers) {
  return `${layers} ${layers === 1 ? 'layer' : 'layers'} with NaN/inf gradients`;
}

/** The line's text for a /ranks answer (null: nothing to say, a single-process run).
 *  `first.ranks` is where the step went bad: the ranks whose own loss was non-finite when any
 *  (their gradients are after the all-reduce, so one rank's NaN reaches every rank's), else
 *  the ranks whose gradients held NaN/inf with every loss finite (FSDP shards: no origin).
 * @param {Ranks} body
 * @returns {string | null} */
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

/** A step's ranks as /ranks's `first_nonfinite` when some rank went non-finite there, else
 *  null: the ranks whose own loss was NaN/inf when any, else those whose gradients held one
 *  (`rank_packing.origin_ranks` on the server).
 * @param {Step} step
 * @returns {FirstNonfinite | null} */
export function nonfiniteAt(step) {
  const ranks = step.ranks;
  if (!ranks) return null;
  /** @param {number | null} x */
  const badLoss = (x) => typeof x === 'number' && !Number.isFinite(x);
  let bad = ranks.loss.map((x, r) => (badLoss(x) ? r : -1)).filter((r) => r >= 0);
  if (!bad.length) bad = ranks.nonfinite.map((n, r) => (n !== null && n > 0 ? r : -1)).filter((r) => r >= 0);
  return bad.length ? { step: step.step, ranks: bad, loss: ranks.loss, nonfinite: ranks.nonfinite } : null;
}

export class RankNote {
  /**
   * @param {HTMLElement} node  the line
   * @param {string} runId
   * @param {number} worldSize
   */
  constructor(node, runId, worldSize) {
    this.node = node;
    this.runId = runId;
    this.worldSize = worldSize;
    /** @type {FirstNonfinite | null} the earliest non-finite step known */
    this.first = null;
    this.answered = false;  // /ranks has answered: until then live steps are only remembered
  }

  async refresh() {
    const body = await getRanks(this.runId);
    this.worldSize = body.world_size;
    this.answered = true;
    this.offer(body.first_nonfinite, true);
    this.render();
  }

  /** Keep the earliest step: a later step number never replaces it, and at the same step the
   *  server's answer (the first ingested there) wins over a live one.
   * @param {FirstNonfinite | null} first
   * @param {boolean} fromServer */
  offer(first, fromServer) {
    if (!first) return;
    if (this.first === null || first.step < this.first.step || (fromServer && first.step === this.first.step)) {
      this.first = first;
    }
  }

  render() {
    const text = rankNoteText({ world_size: this.worldSize, first_nonfinite: this.first });
    this.node.hidden = text === null;
    this.node.textContent = text ?? '';
    const found = this.first !== null;
    this.node.classList.toggle('bad', found);
    this.node.classList.toggle('muted', !found);
  }

  /**
   * Live steps came in (decoded, in ingest order): their own ranks, no request.
   * @param {Step[]} steps
   */
  stepsArrived(steps) {
    for (const s of steps) this.offer(nonfiniteAt(s), false);
    if (this.answered) this.render();
  }
}
