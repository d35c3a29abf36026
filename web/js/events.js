// The events table: skipped steps, backoffs and growths (never downsampled), newest first.

import { el, scaleNode } from './format.js';

const MAX_ROWS = 300;
const LABEL = { skipped: 'skipped', backoff: 'backoff', growth: 'growth' };

export class EventLog {
  constructor(tbody, countNode) {
    this.tbody = tbody;
    this.countNode = countNode;
    this.events = [];
    this.seen = new Set();
  }

  add(events) {
    let added = false;
    for (const e of events) {
      const key = `${e.step}:${e.kind}`;
      if (this.seen.has(key)) continue;
      this.seen.add(key);
      this.events.push(e);
      added = true;
    }
    if (added || !this.events.length) this.render();
  }

  /** Events implied by live steps (the socket carries steps, not events). */
  addFromSteps(steps) {
    const derived = [];
    for (const s of steps) {
      if (s.skipped) derived.push({ step: s.step, kind: 'skipped', scale_before: s.scale_before, scale_after: s.scale_after });
      if (s.scale_after < s.scale_before) derived.push({ step: s.step, kind: 'backoff', scale_before: s.scale_before, scale_after: s.scale_after });
      if (s.scale_after > s.scale_before) derived.push({ step: s.step, kind: 'growth', scale_before: s.scale_before, scale_after: s.scale_after });
    }
    if (derived.length) this.add(derived);
  }

  render() {
    const rows = [];
    for (let i = this.events.length - 1; i >= 0 && rows.length < MAX_ROWS; i -= 1) {
      const e = this.events[i];
      const tr = el('tr');
      const change = el('td', 'num');
      change.append(scaleNode(e.scale_before), el('span', 'muted', ' → '), scaleNode(e.scale_after));
      const kind = el('td');
      kind.append(el('span', `kind kind-${LABEL[e.kind] ? e.kind : 'other'}`, LABEL[e.kind] ?? e.kind));
      tr.append(el('td', 'num', String(e.step)), kind, change);
      rows.push(tr);
    }
    this.tbody.replaceChildren(...rows);
    const counts = { skipped: 0, backoff: 0, growth: 0 };
    for (const e of this.events) counts[e.kind] = (counts[e.kind] ?? 0) + 1;
    this.countNode.textContent = `${counts.skipped} skipped · ${counts.backoff} backoff · ${counts.growth} growth`;
  }
}
