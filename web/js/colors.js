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

/** Plotly's colour scale: [position in [0, 1], colour] stops. @typedef {[number, string][]} ColorStops */

/**
 * The Formats matrices' colours (formats_matrix.js), light and dark (plot.js's DARK picks):
 * `fraction` for a share or a relative error on [0, 1], most of its range near 0 where a few
 * percent already matter (as the per-layer heatmap's); `worst` for the worst score on its log
 * axis, log2 of [1/8, 32] (formats.js), green below 1× (its bad level, at 3/8), red past it.
 * `notMeasured`: a cell the hook did not measure (NaN: a module without a gradient), never a
 * colour of either scale; `absent`: a layer or recipe a compared run does not have.
 * @typedef {{fraction: ColorStops, worst: ColorStops, notMeasured: string, absent: string}} FormatColors
 * @type {Readonly<{light: FormatColors, dark: FormatColors}>}
 */
export const FORMAT_COLORS = Object.freeze({
  light: {
    fraction: [[0, '#f8fafc'], [0.005, '#fef3c7'], [0.05, '#fdba74'], [0.2, '#f97316'], [0.5, '#dc2626'], [1, '#5b0f0f']],
    worst: [[0, '#86efac'], [0.25, '#dcfce7'], [0.375, '#fef08a'], [0.625, '#f97316'], [0.875, '#dc2626'], [1, '#7f1d1d']],
    notMeasured: '#a5b4fc',
    absent: '#e5e7eb',
  },
  dark: {
    fraction: [[0, '#1c2128'], [0.005, '#3a2c0c'], [0.05, '#9a3412'], [0.2, '#ea580c'], [0.5, '#ef4444'], [1, '#fecaca']],
    worst: [[0, '#166534'], [0.25, '#1f3d2b'], [0.375, '#854d0e'], [0.625, '#c2410c'], [0.875, '#dc2626'], [1, '#fca5a5']],
    notMeasured: '#4c4f8f',
    absent: '#21262d',
  },
});
