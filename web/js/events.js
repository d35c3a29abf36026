// @ts-check
// The events table: skipped steps, backoffs, growths, AMP misuse and, in a run without a scaler,
// non-finite steps the optimizer applied (never downsampled), newest first. A skipped or
// non-finite step opens (a <details> row, no script needed) to show the layers whose
// gradient went non-finite, first bad layer first (backward order), NaN vs inf, and whether the
// loss itself was finite (forward vs backward overflow). A misuse event shows its detail.
// The list holds what was asked for (the first page of /events, the zoomed range's, the steps
// after those it holds), never the whole run at once: "more events" asks for the next page.

import { el, scaleNode } from './format.js';

/** @import { RunEvent, Step } from './codec.js' */
/** An event of the log: from /events, or `derived` from a live step (its layers unknown yet). @typedef {RunEvent & {derived?: boolean}} LogEvent */
/** A page of /events. @typedef {{events: RunEvent[], next_start: number | null}} EventsPage */
/** An event whose row opens on more. @typedef {Extract<LogEvent, {kind: 'skipped' | 'nonfinite' | 'misuse'}>} DetailedEvent */

const MAX_ROWS = 300;
/** @type {Readonly<Record<string, string>>} */
const LABEL = { skipped: 'skipped', nonfinite: 'non-finite', backoff: 'backoff', growth: 'growth', misuse: 'misuse' };
const WITH_LAYERS = new Set(['skipped', 'nonfinite']); // events whose layers /events gives
/**
 * @param {LogEvent} e
 * @returns {e is DetailedEvent}
 */
const hasDetail = (e) => WITH_LAYERS.has(e.kind) || e.kind === 'misuse';
const REFETCH_MS = 1000; // live skipped steps carry no layers: ask /events for them, at most this often

/** @param {LogEvent} e */
const keyOf = (e) => (e.kind === 'misuse' ? `${e.step}:misuse:${e.misuse_kind}:${e.detail}` : `${e.step}:${e.kind}`);

/**
 * "forward overflow" / "backward overflow" from /events' loss_finite (null: unknown).
 * @param {boolean | null | undefined} lossFinite
 */
function overflowText(lossFinite) {
  if (lossFinite === false) return 'loss not finite: forward overflow (the loss itself is NaN/inf)';
  if (lossFinite === true) return 'loss finite: backward overflow (only gradients went non-finite)';
  return 'loss not reported';
}

export class EventLog {
  /**
   * @param {HTMLElement} tbody
   * @param {HTMLElement} countNode
   * @param {(() => Promise<RunEvent[]>) | null} [refetch]  /events again (for the layers of live skips)
   * @param {{button: HTMLButtonElement, fetchPage: (start: number) => Promise<EventsPage>,
   *   onPage: (page: EventsPage) => void, onError: (err: Error) => void} | null} [more]
   *   the next page of older events, on demand
   */
  constructor(tbody, countNode, refetch, more = null) {
    this.tbody = tbody;
    this.countNode = countNode;
    this.refetch = refetch;
    this.more = more;
    /** @type {number | null} the first step of the pages not loaded yet (null: none left) */
    this.nextStart = null;
    if (more) more.button.addEventListener('click', () => this.loadMore().catch((err) => more.onError(err)));
    /** @type {LogEvent[]} */
    this.events = [];
    /** @type {Map<string, LogEvent>} */
    this.byKey = new Map();
    /** @type {Set<string>} keys of the events the user opened: kept open across re-renders */
    this.open = new Set();
    /** @type {number | null} */
    this.refetchTimer = null;
  }

  /**
   * Add events; one already held is replaced when the new copy knows more (layers from /events).
   * @param {LogEvent[]} events
   */
  add(events) {
    let changed = false;
    for (const e of events) {
      const key = keyOf(e);
      const held = this.byKey.get(key);
      if (held) {
        if (held.derived && !e.derived) {
          Object.assign(held, e, { derived: false });
          changed = true;
        }
        continue;
      }
      const copy = { ...e };
      this.byKey.set(key, copy);
      this.events.push(copy);
      changed = true;
    }
    if (changed) this.events.sort((a, b) => a.step - b.step);
    if (changed || !this.events.length) this.render();
  }

  /**
   * A page of /events arrived: show its events; `next_start` says where the unread ones begin.
   * @param {EventsPage} page
   */
  addPage(page) {
    this.nextStart = page.next_start;
    this.add(page.events);
    this.render();
  }

  /** The next page of older events (the "more events" button). */
  async loadMore() {
    if (!this.more || this.nextStart === null) return;
    this.more.button.disabled = true;
    try {
      const page = await this.more.fetchPage(this.nextStart);
      this.addPage(page);
      this.more.onPage(page);
    } finally {
      this.more.button.disabled = false;
    }
  }

  /**
   * Events implied by live steps (the socket carries steps, not events).
   * @param {Step[]} steps
   */
  addFromSteps(steps) {
    /** @type {LogEvent[]} */
    const derived = [];
    for (const s of steps) {
      const base = { step: s.step, scale_before: s.scale_before, scale_after: s.scale_after, derived: true };
      const lossFinite = Number.isFinite(s.loss) ? true : (s.loss === null ? null : false);
      if (s.skipped) derived.push({ ...base, kind: 'skipped', loss_finite: lossFinite, layers: null });
      else if (s.found_inf) derived.push({ ...base, kind: 'nonfinite', loss_finite: lossFinite, layers: null });
      // Absent scales cannot be compared: no event (the server's rule, series_math.scale_events).
      if (s.scale_after === null || s.scale_before === null) continue;
      if (s.scale_after < s.scale_before) derived.push({ ...base, kind: 'backoff' });
      if (s.scale_after > s.scale_before) derived.push({ ...base, kind: 'growth' });
    }
    if (!derived.length) return;
    this.add(derived);
    if (this.refetch && derived.some((e) => WITH_LAYERS.has(e.kind))) this.scheduleRefetch();
  }

  scheduleRefetch() {
    const refetch = this.refetch;
    if (this.refetchTimer !== null || !refetch) return;
    this.refetchTimer = setTimeout(async () => {
      this.refetchTimer = null;
      try {
        this.add(await refetch());
      } catch {
        // the live rows stay; the next skipped step tries again
      }
    }, REFETCH_MS);
  }

  /**
   * The cell that opens on the layers of a skipped or non-finite step, or a misuse's detail.
   * @param {DetailedEvent} e
   * @param {string} key  its keyOf
   */
  detailCell(e, key) {
    const td = el('td', 'event-detail-cell');
    const details = el('details', 'event-detail');
    details.dataset.step = String(e.step);
    details.open = this.open.has(key);
    details.addEventListener('toggle', () => {
      if (details.open) this.open.add(key);
      else this.open.delete(key);
    });
    const summary = el('summary');
    if (e.kind === 'misuse') {
      summary.textContent = e.misuse_kind ?? 'misuse';
      details.append(summary, el('p', 'misuse-detail', e.detail ?? ''));
    } else {
      const layers = e.layers;
      details.dataset.lossFinite = String(e.loss_finite);
      const n = layers ? layers.length : null;
      summary.append(el('span', e.loss_finite === false ? 'overflow-forward' : 'overflow-backward',
        e.loss_finite === false ? 'forward overflow' : (e.loss_finite === true ? 'backward overflow' : 'overflow')),
      el('span', 'muted', n === null ? ' · layers loading…' : ` · ${n} non-finite layer${n === 1 ? '' : 's'}`));
      details.append(summary, el('p', 'overflow-loss', overflowText(e.loss_finite)));
      if (e.kind === 'nonfinite') {
        details.append(el('p', 'muted', 'applied: without a GradScaler nothing skips this step, so the NaN/inf reached the optimizer'));
      }
      if (layers && layers.length) {
        const list = el('ol', 'bad-layers');
        for (const layer of layers) {
          const li = el('li');
          li.dataset.index = String(layer.index);
          li.append(el('span', `nonfinite nonfinite-${layer.kind === 'nan' ? 'nan' : 'inf'}`, layer.kind === 'nan' ? 'NaN' : 'inf'),
            el('span', 'bad-layer-name', layer.name || `layer ${layer.index}`),
            el('span', 'muted', ` #${layer.index}`));
          list.append(li);
        }
        details.append(el('p', 'muted', 'first bad layer first (backward order):'), list);
      } else if (layers) {
        details.append(el('p', 'muted', 'no per-layer measurement for this step'));
      }
    }
    td.append(details);
    return td;
  }

  render() {
    const rows = [];
    let shown = 0;
    for (let i = this.events.length - 1; i >= 0 && shown < MAX_ROWS; i -= 1) {
      const e = this.events[i];
      const key = keyOf(e);
      const tr = el('tr', 'event-row');
      tr.dataset.step = String(e.step);
      tr.dataset.kind = e.kind;
      const change = el('td', 'num');
      change.append(scaleNode(e.scale_before), el('span', 'muted', ' → '), scaleNode(e.scale_after));
      const kind = el('td');
      kind.append(el('span', `kind kind-${LABEL[e.kind] ? e.kind : 'other'}`, LABEL[e.kind] ?? e.kind));
      tr.append(el('td', 'num', String(e.step)), kind, change,
        hasDetail(e) ? this.detailCell(e, key) : el('td'));
      rows.push(tr);
      shown += 1;
    }
    this.tbody.replaceChildren(...rows);
    /** @type {Record<string, number>} */
    const counts = { skipped: 0, nonfinite: 0, backoff: 0, growth: 0, misuse: 0 };
    for (const e of this.events) counts[e.kind] = (counts[e.kind] ?? 0) + 1;
    const partial = this.nextStart !== null;
    this.countNode.textContent = `${counts.skipped} skipped · ${counts.backoff} backoff · ${counts.growth} growth`
      + (counts.nonfinite ? ` · ${counts.nonfinite} non-finite` : '')
      + (counts.misuse ? ` · ${counts.misuse} misuse` : '')
      + (partial ? ` · not all loaded from step ${this.nextStart} on` : '');
    if (this.more) this.more.button.hidden = !partial;
  }
}
