// @ts-check
// Beyond FP16 (#33), the pure side of the Formats view: every `formats_every` steps the hook
// quantises each Linear/Conv module's three GEMM operands as six recipes would (FP8 tensor-wise,
// row-wise, 128-blocks, MXFP8, MXFP4, NVFP4) and measures five statistics per (layer, operand,
// recipe) (wire v7, GET /api/runs/{id}/formats). Here one sampled step becomes the cells of a
// layer × recipe matrix for one operand and statistic (the value a cell is coloured by, its text
// and its hover), the "worst" score folds underflow and error into one, and the verdicts' keep-lists
// become sentences. No DOM, no plotly: unit-tested under node (tests/web/js/formats.test.mjs).

import { numberText } from './format.js';

/** @import { Formats, Keep, RecipeVerdict, ScaleExponents } from './codec.js' */

/** A cell's five statistics by name (underflow_frac, …); NaN: not measured. @typedef {Record<string, number>} CellStats */

/**
 * A cell of the matrix: measured, not measured by the hook (NaN: a module that got no gradient),
 * or absent (a layer or recipe this run does not have: the compare page lines two runs up).
 * @typedef {{state: 'measured' | 'nan' | 'absent', stats: CellStats | null, value: number}} Cell
 */

/**
 * One operand and statistic of one sampled step, as rows (layers) × columns (recipes).
 * @typedef {object} Grid
 * @property {number} step
 * @property {string[]} rows  layer names, top to bottom
 * @property {(number | null)[]} indices  each row's layer-table index (null: absent here)
 * @property {string[]} recipes
 * @property {Cell[][]} cells  [row][recipe]
 */

export const OPERANDS = Object.freeze(['input', 'weight', 'grad_output']);
export const DEFAULT_OPERAND = 'grad_output';

// The "worst" score: how many times a cell's loss is past the level where it starts to hurt, the
// worse of two. 1 % of an operand's elements flushed to zero and a 5 % relative error are where
// the server's verdicts start looking (findings/thresholds RECIPE_UNDERFLOW_FLOOR and
// RECIPE_ERROR_FLOOR); below them no layer is kept in BF16 whatever its neighbours do. Underflow
// counts apart from the error because flushed values are the small ones: a gradient can lose
// many of them and barely move its RMS. Saturation does not count: the clamped values are the
// largest, so what clamping costs is in the error already (and the hook counts only clamps by
// more than a rounding step, which the recipes' current scaling never makes: an older amax's
// scale would); it stays a statistic of its own in the selector. Reference points, the same operands: E4M3 costs ~0.5x
// (rel. error 0.026), E5M2 gradients ~1x (0.053), MXFP4 and NVFP4 ~7-11x (their underflow); a
// heavy-tailed gradient under FP4, 20-60x.
/** @type {Readonly<Record<string, number>>} */
export const BAD_LEVELS = Object.freeze({ underflow_frac: 0.01, rel_rmse: 0.05 });
// Clipped to [0, WORST_CAP] and coloured on a log axis from WORST_FLOOR: FP8 (~0.5x), FP4 (~10x)
// and an FP4 outlier (50x) are three distinct colours; past 32x a cell is simply the worst.
export const WORST_CAP = 32;
export const WORST_FLOOR = 1 / 8;
// The gradient-noise rule of the verdicts (findings/recipe_fit): a gradient whose norm is below
// √3 times its quantisation noise, i.e. an SNR under 20·log10(√3) ≈ 4.77 dB, stops being useful.
const GRAD_MIN_SNR_DB = 20 * Math.log10(Math.sqrt(3));

/**
 * What the statistic selector offers, in its order: `fraction` statistics (shares, and the
 * error relative to the operand's RMS) are coloured on [0, 1], `worst` on its log axis. The
 * bounds are fixed so that two runs' matrices (the compare page) read alike.
 * @typedef {{label: string, help: string, kind: 'worst' | 'fraction'}} StatView
 * @type {Readonly<Record<string, StatView>>}
 */
export const STAT_VIEWS = Object.freeze({
  worst: { label: 'worst (× its bad level)', kind: 'worst',
    help: 'the worse of underflow ÷ 1 % and relative error ÷ 5 % (what saturation costs is in the error): 1× is where it starts to hurt' },
  underflow_frac: { label: 'underflow', kind: 'fraction',
    help: 'non-zero elements the recipe flushes to zero, as a share of all the operand\'s elements' },
  saturated_frac: { label: 'saturation', kind: 'fraction',
    help: 'share of the operand\'s elements the clamp to the format\'s largest value changes by more than rounding would' },
  rel_rmse: { label: 'relative error', kind: 'fraction',
    help: '‖q(x) − x‖ / ‖x‖, the quantisation error over the operand\'s RMS; SNR = −20·log₁₀ of it' },
  scale_min_frac: { label: 'scale at its least', kind: 'fraction',
    help: 'share of the blocks whose scale sat at its format\'s least value (their small values flush)' },
  scale_max_frac: { label: 'scale at its greatest', kind: 'fraction',
    help: 'share of the blocks whose scale was clamped at its format\'s greatest value' },
});

/** @type {Readonly<Record<string, string>>} the statistics' short names, in hovers and keep-lists */
const SHORT = Object.freeze({
  underflow_frac: 'underflow', saturated_frac: 'saturated', rel_rmse: 'rel. error',
  scale_min_frac: 'scale at least', scale_max_frac: 'scale at greatest',
});

/**
 * A value as a number, anything else (null: absent) as NaN.
 * @param {unknown} v
 */
const asNumber = (v) => (typeof v === 'number' ? v : NaN);

/**
 * The worse of a cell's underflow and error, each over its bad level (BAD_LEVELS), clipped to
 * [0, WORST_CAP]; NaN when either is not measured (NaN or missing): an unmeasured operand is
 * unknown, never fine. +inf counts as the cap.
 * @param {CellStats} cell
 * @returns {number}
 */
export function worstScore(cell) {
  let worst = 0;
  for (const [stat, level] of Object.entries(BAD_LEVELS)) {
    const v = asNumber(cell[stat]);
    if (Number.isNaN(v)) return NaN;
    worst = Math.max(worst, v / level);
  }
  return Math.min(WORST_CAP, worst);
}

/**
 * The statistic `stat` (a STAT_VIEWS key) of a cell.
 * @param {CellStats} cell
 * @param {string} stat
 */
export function cellValue(cell, stat) {
  return stat === 'worst' ? worstScore(cell) : asNumber(cell[stat]);
}

/**
 * The number a cell is coloured by: `worst` as log2 of the score within [WORST_FLOOR,
 * WORST_CAP], the others clipped to [0, 1]; null (no colour) for NaN.
 * @param {string} stat
 * @param {number} v
 * @returns {number | null}
 */
export function colourValue(stat, v) {
  if (Number.isNaN(v)) return null;
  if (stat === 'worst') return Math.log2(Math.min(WORST_CAP, Math.max(WORST_FLOOR, v)));
  return Math.min(1, Math.max(0, v));
}

/**
 * The colour axis' bounds of `stat` (colourValue's range).
 * @param {string} stat
 * @returns {[number, number]}
 */
export function colourRange(stat) {
  return stat === 'worst' ? [Math.log2(WORST_FLOOR), Math.log2(WORST_CAP)] : [0, 1];
}

/**
 * A share as "12%", "0.05%" (format.js's digits); NaN as "not measured".
 * @param {number} v
 */
export function percent(v) {
  return Number.isNaN(v) ? 'not measured' : `${numberText(100 * v, 3)}%`;
}

/**
 * One sentence per layer whose module really trains in a recipe now (torchao's Float8Linear):
 * "head.weight trains in fp8_tensorwise: scale 12.3 (input amax 36.4), …"; a row-wise recipe's
 * scale is its largest row's ("largest row's scale 8 (input amax 36.4)"). Empty when none does.
 * @param {{layers: {name: string}[], trained: {recipes: (string | null)[],
 *   amax: (number | null)[][], scale: (number | null)[][]} | null}} matrix
 * @param {string[]} operands  the operand names, in the order of `amax[l]` and `scale[l]`
 * @returns {string[]}
 */
export function trainedLines(matrix, operands) {
  const t = matrix.trained;
  if (!t) return [];
  /** @type {string[]} */
  const lines = [];
  t.recipes.forEach((recipe, l) => {
    if (recipe === null) return;
    const label = recipe === 'fp8_rowwise' ? "largest row's scale" : 'scale';
    const parts = operands.map((name, o) => {
      const scale = t.scale[l][o] ?? NaN;
      const amax = `${name} amax ${numberText(t.amax[l][o] ?? NaN, 3)}`;
      return Number.isNaN(scale) ? amax : `${label} ${numberText(scale, 3)} (${amax})`;
    });
    lines.push(`${matrix.layers[l].name} trains in ${recipe}: ${parts.join(', ')}`);
  });
  return lines;
}

/**
 * The SNR in dB of a relative error: −20·log10(rel_rmse); +inf for no error, NaN for a value
 * that is not one (NaN, negative).
 * @param {number} relRmse
 */
export function snrDb(relRmse) {
  if (!(relRmse >= 0)) return NaN;
  return -20 * Math.log10(relRmse);
}

/**
 * A cell's text for `stat`: "0.53×", "≥32×", "12%", "0.0268"; "not measured" for NaN.
 * @param {string} stat
 * @param {number} v
 */
export function statText(stat, v) {
  if (Number.isNaN(v)) return 'not measured';
  if (stat === 'worst') {
    if (v >= WORST_CAP) return `≥${WORST_CAP}×`;
    return v > 0 && v < 0.01 ? '<0.01×' : `${numberText(v, 2)}×`;
  }
  return stat === 'rel_rmse' ? numberText(v, 3) : percent(v);
}

/**
 * All five numbers of a cell, for its hover (plotly's <br> between lines).
 * @param {CellStats} cell
 */
export function hoverText(cell) {
  const error = asNumber(cell.rel_rmse);
  const snr = snrDb(error);
  return [
    `underflow ${percent(asNumber(cell.underflow_frac))} · saturated ${percent(asNumber(cell.saturated_frac))}`,
    `rel. error ${numberText(error, 3)}${Number.isNaN(snr) ? '' : ` (SNR ${numberText(snr, 3)} dB)`}`,
    `blocks' scale at least ${percent(asNumber(cell.scale_min_frac))} · at greatest ${percent(asNumber(cell.scale_max_frac))}`,
  ].join('<br>');
}

/**
 * Two runs' names in one order: `a`'s, each name only in `b` after the name it follows there
 * (at the top when it follows none of `a`'s), so the rows line up by name.
 * @param {string[]} a
 * @param {string[]} b
 * @returns {string[]}
 */
export function mergeNames(a, b) {
  const out = [...new Set(a)];
  let at = 0; // where b's next new name goes: after the last name of b already placed
  for (const name of b) {
    const i = out.indexOf(name);
    if (i >= 0) at = i + 1;
    else out.splice(at++, 0, name);
  }
  return out;
}

/**
 * One operand and statistic of a /formats answer's matrix as a Grid; `rows` and `recipes` (the
 * compare page's, merged over two runs) when given, else the matrix's own. A row or recipe the
 * matrix lacks is `absent`; a value the hook did not measure, `nan`. Null without a matrix.
 * @param {Formats} body
 * @param {string} operand
 * @param {string} stat  a STAT_VIEWS key
 * @param {{rows?: string[] | null, recipes?: string[] | null}} [lineUp]
 * @returns {Grid | null}
 */
export function matrixGrid(body, operand, stat, { rows = null, recipes = null } = {}) {
  const m = body.matrix;
  if (!m) return null;
  const o = body.operand_names.indexOf(operand);
  const names = m.layers.map((l) => l.name);
  const rowNames = rows ?? names;
  const columns = recipes ?? m.recipes;
  /** @type {Cell} */
  const absent = { state: 'absent', stats: null, value: NaN };
  const cells = rowNames.map((name) => {
    const l = names.indexOf(name);
    return columns.map((recipe) => {
      const r = m.recipes.indexOf(recipe);
      if (l < 0 || r < 0 || o < 0) return absent;
      /** @type {CellStats} */
      const stats = {};
      body.stat_names.forEach((s, k) => { stats[s] = asNumber(m.values[l][o][r][k]); });
      const value = cellValue(stats, stat);
      /** @type {Cell} */
      const cell = { state: Number.isNaN(value) ? 'nan' : 'measured', stats, value };
      return cell;
    });
  });
  return {
    step: m.step, rows: rowNames, recipes: columns, cells,
    indices: rowNames.map((name) => { const l = names.indexOf(name); return l < 0 ? null : m.layers[l].index; }),
  };
}

/**
 * Why a verdict keeps a layer in BF16, as a sentence: the operand and statistic, its value
 * against the other layers' median, and the share of blocks whose scale was pinned at its least
 * value when some were. A NaN median is the gradient-noise rule (compared with no other layer).
 * @param {Keep} keep
 */
export function keepReason(keep) {
  const pinned = keep.scale_min_frac > 0
    ? ` (scale pinned at its least in ${percent(keep.scale_min_frac)} of blocks)` : '';
  const shown = (/** @type {number} */ v) => (keep.stat === 'rel_rmse' ? numberText(v, 3) : percent(v));
  if (Number.isNaN(keep.median)) {
    return `${keep.operand}, ${SHORT[keep.stat] ?? keep.stat} ${shown(keep.value)}: SNR ${numberText(snrDb(keep.value), 3)} dB,`
      + ` under the ${numberText(GRAD_MIN_SNR_DB, 3)} dB below which a gradient drowns in its quantisation noise${pinned}`;
  }
  return `${keep.operand}, ${SHORT[keep.stat] ?? keep.stat} ${shown(keep.value)} vs median ${shown(keep.median)}${pinned}`;
}

/**
 * Why a fully quantised run keeps a normalisation layer's affine weight in BF16: its gains
 * flushed to zero, or its error, beside the GEMM weights' median (NaN: none measured).
 * @param {Keep} keep
 */
export function normReason(keep) {
  const shown = (/** @type {number} */ v) => (keep.stat === 'rel_rmse' ? numberText(v, 3) : percent(v));
  const what = keep.stat === 'underflow_frac' ? `${shown(keep.value)} of its gains flushed to zero`
    : `${SHORT[keep.stat] ?? keep.stat} ${shown(keep.value)}`;
  return Number.isNaN(keep.median) ? what : `${what} (GEMM weights' median ${shown(keep.median)})`;
}

/**
 * The cells of `grid` whose layer a verdict keeps in BF16 under its recipe, whatever the operand
 * that decided (a layer is kept whole), a norm's affine weight among them: [row, column, the keep].
 * @param {Grid} grid
 * @param {RecipeVerdict[]} verdicts
 * @returns {[number, number, Keep][]}
 */
export function keptCells(grid, verdicts) {
  /** @type {[number, number, Keep][]} */
  const out = [];
  for (const v of verdicts) {
    const column = grid.recipes.indexOf(v.recipe);
    if (column < 0) continue;
    for (const k of [...v.keep, ...v.norms]) {
      const row = grid.rows.indexOf(k.layer);
      if (row >= 0) out.push([row, column, k]);
    }
  }
  return out;
}

/**
 * The verdicts in one line: the recipes that fit as they are, those that need BF16 layers (how
 * many of the layers measured), and those under which a fully quantised run keeps norms' affine
 * weights in BF16. Empty without verdicts.
 * @param {RecipeVerdict[]} verdicts
 */
export function verdictHeadline(verdicts) {
  const fits = verdicts.filter((v) => !v.keep.length && !v.uniform_loss).map((v) => v.recipe);
  const needs = verdicts.filter((v) => v.keep.length)
    .map((v) => `${v.recipe} (${v.keep.length} of ${v.measured} layer${v.measured === 1 ? '' : 's'})`);
  const everywhere = verdicts.filter((v) => v.uniform_loss)
    .map((v) => `${v.recipe} (${percent(v.grad_underflow)} of the median layer's gradient)`);
  const parts = [];
  if (fits.length) parts.push(`Fits with every layer: ${fits.join(', ')}`);
  if (needs.length) parts.push(`Needs layers kept in BF16: ${needs.join(', ')}`);
  if (everywhere.length) parts.push(`Flushes gradients to zero everywhere: ${everywhere.join(', ')}`);
  const norms = verdicts.filter((v) => v.norms.length)
    .map((v) => `${v.recipe} (${v.norms.length} of ${v.norms_measured})`);
  if (norms.length) parts.push(`Norms' affine weights to keep in BF16 if quantised: ${norms.join(', ')}`);
  return parts.join(' · ');
}

/**
 * A trend's block scale exponents as a heatmap: `y` every exponent a step reaches, lowest
 * first; `z[i][j]` the share of step j's blocks whose scale has exponent y[i] (0 above its top,
 * null below its last bin, whose blocks are that far down or farther, and for a step without
 * exponents); `text` the hovers. No step with exponents: no rows.
 * @param {number[]} steps
 * @param {(ScaleExponents | null)[]} scales  one per step
 * @returns {{y: number[], z: (number | null)[][], text: string[][]}}
 */
export function scaleGrid(steps, scales) {
  const measured = scales.map((s) => (s && s.top !== null && s.counts.length ? s : null));
  const tops = measured.flatMap((s) => (s ? [/** @type {number} */ (s.top)] : []));
  const lows = measured.flatMap((s) => (s ? [/** @type {number} */ (s.top) - s.counts.length + 1] : []));
  if (!tops.length) return { y: [], z: [], text: [] };
  const hi = Math.max(...tops);
  const lo = Math.min(...lows);
  const y = Array.from({ length: hi - lo + 1 }, (_, i) => lo + i);
  const z = y.map(() => steps.map(() => /** @type {number | null} */ (null)));
  const text = y.map(() => steps.map(() => ''));
  measured.forEach((s, j) => {
    if (!s) return;
    const top = /** @type {number} */ (s.top);
    const total = s.counts.reduce((a, b) => a + b, 0);
    const last = s.counts.length - 1;
    y.forEach((e, i) => {
      const below = top - e;
      if (below > last) return;
      const n = below < 0 ? 0 : s.counts[below];
      z[i][j] = total ? n / total : 0;
      const where = below === last ? `2^${e} or below` : `2^${e}`;
      text[i][j] = `step ${steps[j]} · scale ${where}: ${n} of ${total} blocks (${percent(total ? n / total : 0)})`;
    });
  });
  return { y, z, text };
}
