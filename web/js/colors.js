// @ts-check
// Stable run colours: a run's colour comes from its id, never from its position in a page or URL,
// so the same run has the same colour on every chart, legend and table of the comparison.

export const PALETTE = Object.freeze([
  '#2563eb', '#ea580c', '#16a34a', '#9333ea', '#db2777', '#0891b2', '#ca8a04', '#475569',
]);

/**
 * FNV-1a over the id's UTF-16 code units: a small, stable hash.
 * @param {string} text
 * @returns {number}
 */
function hash(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i += 1) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h;
}

/**
 * The colour a run has when nothing else on the page claims it.
 * @param {string} id
 * @returns {string}
 */
export function runColor(id) {
  return PALETTE[hash(id) % PALETTE.length];
}

/**
 * Colours for the runs shown together: each run takes its own colour (runColor); when two runs
 * hash to the same one, the run with the larger id takes the next free colour. The result depends
 * only on the set of ids, not on their order. Map id → colour.
 * @param {string[]} ids
 * @returns {Map<string, string>}
 */
export function runColors(ids) {
  const taken = new Set();
  const out = new Map();
  for (const id of [...new Set(ids)].sort()) {
    let slot = hash(id) % PALETTE.length;
    for (let probe = 0; probe < PALETTE.length && taken.has(slot); probe += 1) slot = (slot + 1) % PALETTE.length;
    taken.add(slot);
    out.set(id, PALETTE[slot]);
  }
  return out;
}
