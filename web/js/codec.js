// @ts-check
// The one place that decodes the API's floats (docs/contracts.md, "Non-finite numbers").
//
// JSON has no NaN/Infinity, so the server sends a finite float as a number and a non-finite one as
// the tag "nan", "inf" or "-inf"; `null` means "absent". Decoding is per field, never a blind walk
// over the whole document: a run or layer may legitimately be *named* "nan".
//
// The shapes below are the read API's (server/ampscope_server/schemas.py), as far as the pages
// read them. Each `...Of<F>` is written once: `F` is `Tagged` as the server sends it and `number`
// once decoded here (`Run` = `RunOf<number>`).

/** A float as the API sends it: a number when finite, else its tag. @typedef {number | 'nan' | 'inf' | '-inf'} Tagged */
/** @typedef {'active' | 'finished' | 'crashed'} RunStatus */
/** @typedef {'error' | 'warning' | 'info'} Severity */

/**
 * @template F
 * @typedef {{layer: string, value: F}} WorstLayerOf  a run summary's worst_underflow / worst_headroom
 */

/** A run's most severe finding, in its summary. @typedef {{kind: string, severity: Severity, title: string}} FindingBrief */

/** The target format's limits (FormatLimits). @typedef {{name: string, max: number, min_normal: number, min_subnormal: number}} FormatLimits */

/**
 * A run summary (GET /api/runs, the runs socket, /api/compare).
 * @template F
 * @typedef {object} RunOf
 * @property {string} id
 * @property {string} project
 * @property {string} name
 * @property {string[]} tags
 * @property {RunStatus} status
 * @property {number} created_at  seconds since the epoch
 * @property {number} updated_at
 * @property {number} num_steps
 * @property {number | null} last_step
 * @property {number | null} [last_id]
 * @property {F | null} last_scale
 * @property {number} skipped_steps
 * @property {number} num_layers
 * @property {number} world_size
 * @property {number | null} skip_rate
 * @property {WorstLayerOf<F> | null} worst_underflow
 * @property {WorstLayerOf<F> | null} worst_headroom
 * @property {FindingBrief | null} [top_finding]
 * @property {Record<string, unknown>} config
 * @property {string} notes
 */

/**
 * A run's detail (GET /api/runs/{id}): its summary and the rest.
 * @template F
 * @typedef {RunOf<F> & {host: string, rank: number, target_format: string,
 *   target_format_reason: string | null, target_format_limits: FormatLimits, attempts: object[]}} RunDetailOf
 */

/**
 * A step's per-layer arrays (`{stat: [value per layer]}`: amax, amin_nz, zero_frac, ...).
 * @template F
 * @typedef {{[stat: string]: (F | null)[]}} LayerArraysOf
 */

/**
 * A step's per-rank values (wire v4 `ranks`), rank r at index r.
 * @template F
 * @typedef {{loss: (F | null)[], nonfinite: (number | null)[]}} RankValuesOf
 */

/**
 * One watched optimizer's entry in a step (wire v4 `optimizers`): an lr per parameter group.
 * @template F
 * @typedef {{skipped: boolean | null, lr: (F | null)[]}} OptimizerEntryOf
 */

/**
 * A step's scalars (/steps, the live socket), with its per-layer arrays on the socket.
 * @template F
 * @typedef {object} StepOf
 * @property {number} id
 * @property {number} step
 * @property {F} wall_time
 * @property {F | null} loss
 * @property {F | null} scale_before
 * @property {F | null} scale_after
 * @property {F | null} grad_norm
 * @property {F | null} lr
 * @property {F | null} duration
 * @property {boolean} found_inf
 * @property {boolean} skipped
 * @property {LayerArraysOf<F> | null} [layers]
 * @property {RankValuesOf<F> | null} [ranks]
 * @property {OptimizerEntryOf<F>[] | null} [optimizers]
 */

/**
 * /ranks: the first step where some rank went NaN/inf, and every rank's values there.
 * @template F
 * @typedef {{step: number, ranks: number[], loss: (F | null)[], nonfinite: (number | null)[]}} FirstNonfiniteOf
 */

/**
 * @template F
 * @typedef {{world_size: number, first_nonfinite: FirstNonfiniteOf<F> | null}} RanksOf
 */

/**
 * A bucket of a /series (min, max and last of the steps it holds).
 * @template F
 * @typedef {{step: number, min: F | null, max: F | null, last: F | null}} SeriesPointOf
 */

/**
 * @template F
 * @typedef {{name: string, downsampled: boolean, points: SeriesPointOf<F>[]}} SeriesOf
 */

/**
 * @template F
 * @typedef {{group: number, downsampled: boolean, points: SeriesPointOf<F>[]}} OptimizerGroupOf
 */

/**
 * One watched optimizer over the run (/optimizers).
 * @template F
 * @typedef {object} OptimizerTrackOf
 * @property {number} optimizer
 * @property {number} steps
 * @property {number} skipped
 * @property {number} unknown  steps that did not say whether it skipped
 * @property {number[]} skipped_steps
 * @property {number} groups
 * @property {OptimizerGroupOf<F>[]} lr
 */

/**
 * @template F
 * @typedef {{optimizers: OptimizerTrackOf<F>[], last_step: number | null}} OptimizersOf
 */

/** @typedef {'nan' | 'inf'} NonfiniteKind */
/** A layer whose gradient held NaN/inf at an event's step. @typedef {{index: number, name: string, kind: NonfiniteKind}} EventLayer */
/** @typedef {'skipped' | 'nonfinite' | 'backoff' | 'growth' | 'misuse'} EventKind */

/**
 * An event of /events, by kind: a skipped or non-finite step says whether its loss was finite
 * and which layers went NaN/inf (null: not known yet, a live step's), a misuse what it was.
 * @template F
 * @typedef {{step: number, scale_before: F | null, scale_after: F | null} & (
 *   {kind: 'backoff' | 'growth'}
 *   | {kind: 'skipped' | 'nonfinite', loss_finite: boolean | null, layers: EventLayer[] | null}
 *   | {kind: 'misuse', misuse_kind: string, detail: string})} RunEventOf
 */

/**
 * /layer-stats: z[layer][step] of one statistic over the layers (or modules) and steps.
 * @template F
 * @typedef {object} LayerStatsOf
 * @property {string} stat
 * @property {'param' | 'activation'} source
 * @property {string[]} layers
 * @property {number[]} steps
 * @property {(F | null)[][]} z
 */

/**
 * @template F
 * @typedef {{metric: 'loss' | 'grad_norm', step: number, reference_value: F, value: F, relative: F}} DivergenceOf
 */

/**
 * A layer in both compared runs (/api/compare).
 * @template F
 * @typedef {object} LayerDiffOf
 * @property {string} layer
 * @property {number} steps
 * @property {F | null} l2_ratio
 * @property {number} ratio_steps
 * @property {number | null} lost_frac_reference
 * @property {number | null} lost_frac
 * @property {string | null} underflow_only_in  the run id
 * @property {number} nonfinite_steps
 */

/**
 * One run against the reference (/api/compare).
 * @template F
 * @typedef {object} ComparisonOf
 * @property {string} run
 * @property {string} reference
 * @property {number} common_steps
 * @property {number} layer_steps
 * @property {DivergenceOf<F> | null} divergence
 * @property {DivergenceOf<F> | null} loss_divergence
 * @property {DivergenceOf<F> | null} grad_norm_divergence
 * @property {LayerDiffOf<F>[]} layers
 * @property {boolean} divergence_exact
 * @property {number} layer_bucket_width
 */

/**
 * @template F
 * @typedef {object} CompareOf
 * @property {number} tolerance
 * @property {number} underflow_threshold
 * @property {string} reference
 * @property {RunOf<F>[]} runs
 * @property {ComparisonOf<F>[]} comparisons
 */

/**
 * One sampled step of wire v7's scaled-format what-ifs (/formats' `matrix`): values[l][o][r][s]
 * is layer `layers[l]`, operand `operand_names[o]`, recipe `recipes[r]`, statistic
 * `stat_names[s]`; operands[l][o][k] the operand's own statistic `operand_stat_names[k]`. NaN:
 * not measured (a module that got no gradient).
 * @template F
 * @typedef {object} FormatMatrixOf
 * @property {number} id
 * @property {number} step
 * @property {string[]} recipes
 * @property {{index: number, name: string}[]} layers  `index`: the layer table's row
 * @property {(F | null)[][][][]} values
 * @property {(F | null)[][][]} operands
 * @property {TrainedOf<F> | null} trained  null: no module of the step trains in a recipe
 */

/**
 * What each layer's module really trains in (wire v7 `trained`; null: none), with the amax and
 * the scale that recipe used, `[layer][operand]`.
 * @template F
 * @typedef {{recipes: (string | null)[], amax: (F | null)[][], scale: (F | null)[][]}} TrainedOf
 */

/**
 * A layer a recipe's verdict keeps in BF16, and the number that decided it. `median`: the other
 * layers' median of the same statistic (NaN: the gradient-noise rule, which compares with none).
 * @template F
 * @typedef {{layer: string, operand: string, stat: string, value: F, median: F,
 *   scale_min_frac: F}} KeepOf
 */

/**
 * Could the run train in `recipe`, and which layers must stay in BF16 (`keep`, model order);
 * `uniform_loss`: the median layer's gradient loses `grad_underflow` (15 % or more) to zero
 * under it, everywhere, which no comparison between layers shows. Apart from the layers: the
 * normalisation layers' affine weights measured (`norms_measured`) and those a fully quantised
 * run keeps in BF16 (`norms`, their `median` the GEMM weights').
 * @template F
 * @typedef {{recipe: string, step: number, measured: number, summary: string,
 *   keep: KeepOf<F>[], grad_underflow: F, uniform_loss: boolean, norms_measured: number,
 *   norms: KeepOf<F>[]}} RecipeVerdictOf
 */

/**
 * GET /api/runs/{id}/formats: the sampled steps, one step's matrix (null: none sampled) and each
 * recipe's verdict as of it.
 * @template F
 * @typedef {object} FormatsOf
 * @property {string[]} operand_names
 * @property {string[]} stat_names
 * @property {string[]} operand_stat_names
 * @property {number} sampled
 * @property {boolean} downsampled
 * @property {{id: number, step: number}[]} steps
 * @property {FormatMatrixOf<F> | null} matrix
 * @property {RecipeVerdictOf<F>[]} verdicts
 */

/**
 * GET /api/runs/{id}/formats/trend: one (layer, operand, recipe) over the sampled steps.
 * @template F
 * @typedef {object} FormatTrendOf
 * @property {number} layer
 * @property {string | null} name  null past the layer table
 * @property {string} operand
 * @property {string} recipe
 * @property {number} sampled
 * @property {boolean} downsampled
 * @property {number[]} steps
 * @property {number[]} ids
 * @property {Record<string, (F | null)[]>} values  the recipe's five statistics, one per step
 * @property {Record<string, (F | null)[]>} operand_values  the operand's four, one per step
 * @property {(ScaleExponents | null)[]} scales  the recipe's block scale exponents, one per step
 *   (null: not measured, or a client before wire v8)
 */

/**
 * One step's block scale exponents (wire v8): the greatest exponent of the scales of the blocks
 * holding a non-zero value (null: no block held one) and the blocks' counts by binades below it,
 * the last that many or more. Whole numbers: nothing to decode.
 * @typedef {{top: number | null, counts: number[]}} ScaleExponents
 */

/**
 * A live socket message: a run's steps or status (WS /api/runs/{id}/live), or the runs list's
 * snapshot and changes (WS /api/runs/live).
 * @template F
 * @typedef {{type: 'steps', run_id: string, steps: StepOf<F>[], last_id: number}
 *   | {type: 'status', status: RunStatus}
 *   | {type: 'runs', full: boolean, runs: RunOf<F>[], next_cursor?: string | null, total?: number | null,
 *      active: RunOf<F>[]}} LiveMessageOf
 */

/**
 * @typedef {RunOf<number>} Run
 * @typedef {RunDetailOf<number>} RunDetail
 * @typedef {WorstLayerOf<number>} WorstLayer
 * @typedef {StepOf<number>} Step
 * @typedef {Step & {layers: LayerArrays}} StepWithLayers  a live step with per-layer statistics
 * @typedef {LayerArraysOf<number>} LayerArrays
 * @typedef {RanksOf<number>} Ranks
 * @typedef {FirstNonfiniteOf<number>} FirstNonfinite
 * @typedef {SeriesPointOf<number>} SeriesPoint
 * @typedef {SeriesOf<number>} Series
 * @typedef {OptimizerTrackOf<number>} OptimizerTrack
 * @typedef {OptimizersOf<number>} Optimizers
 * @typedef {RunEventOf<number>} RunEvent
 * @typedef {LayerStatsOf<number>} LayerStats
 * @typedef {DivergenceOf<number>} Divergence
 * @typedef {LayerDiffOf<number>} LayerDiff
 * @typedef {ComparisonOf<number>} Comparison
 * @typedef {CompareOf<number>} Compare
 * @typedef {LiveMessageOf<number>} LiveMessage
 * @typedef {FormatMatrixOf<number>} FormatMatrix
 * @typedef {KeepOf<number>} Keep
 * @typedef {RecipeVerdictOf<number>} RecipeVerdict
 * @typedef {FormatsOf<number>} Formats
 * @typedef {FormatTrendOf<number>} FormatTrend
 */

/** @type {Readonly<Record<string, number>>} */
const TAGS = { nan: NaN, inf: Infinity, '-inf': -Infinity };

/**
 * A tagged float → number (NaN/±Infinity included); null/undefined → null.
 * @overload
 * @param {Tagged} value
 * @returns {number}
 */
/**
 * @overload
 * @param {Tagged | null | undefined} value
 * @returns {number | null}
 */
/**
 * @param {unknown} value  anything else is refused (a TypeError naming it)
 * @returns {number | null}
 */
export function num(value) {
  if (value === null || value === undefined) return null;
  if (typeof value === 'number') return value;
  if (typeof value === 'string' && Object.hasOwn(TAGS, value)) return TAGS[value];
  throw new TypeError(`expected a number or "nan"/"inf"/"-inf", got ${JSON.stringify(value)}`);
}

/**
 * @overload
 * @param {(Tagged | null)[]} values
 * @returns {(number | null)[]}
 */
/**
 * @overload
 * @param {(Tagged | null)[] | null | undefined} values
 * @returns {(number | null)[] | null}
 */
/**
 * @param {(Tagged | null)[] | null | undefined} values
 * @returns {(number | null)[] | null}
 */
function nums(values) {
  return values === null || values === undefined ? null : values.map(num);
}

const STEP_FLOATS = ['loss', 'scale_before', 'scale_after', 'grad_norm', 'lr', 'duration', 'wall_time'];

/**
 * Per-layer arrays of a step (`{stat: [...]}`), every stat decoded.
 * @param {LayerArraysOf<Tagged> | null | undefined} layers
 * @returns {LayerArrays | null}
 */
function decodeLayers(layers) {
  if (layers === null || layers === undefined) return null;
  /** @type {LayerArrays} */
  const out = {};
  for (const [stat, values] of Object.entries(layers)) out[stat] = nums(values);
  return out;
}

/**
 * A step's per-rank values (wire v4 `ranks`: {loss, nonfinite}) or null.
 * @param {RankValuesOf<Tagged> | null | undefined} ranks
 * @returns {RankValuesOf<number> | null}
 */
function decodeRankValues(ranks) {
  return ranks === null || ranks === undefined ? null : { ...ranks, loss: nums(ranks.loss) };
}

/**
 * StepScalars (+ optional "layers", v4 "ranks" and "optimizers") from /steps or the live socket.
 * Only the fields present are decoded: one absent stays absent.
 * @param {StepOf<Tagged>} step
 * @returns {Step}
 */
export function decodeStep(step) {
  /** @type {Record<string, unknown>} the fields are decoded in place, by name */
  const out = { ...step };
  for (const key of STEP_FLOATS) if (key in out) out[key] = num(/** @type {Tagged | null} */ (out[key]));
  if ('layers' in out) out.layers = decodeLayers(step.layers);
  if ('ranks' in out) out.ranks = decodeRankValues(step.ranks);
  if (Array.isArray(step.optimizers)) out.optimizers = step.optimizers.map((o) => ({ ...o, lr: nums(o.lr) }));
  return /** @type {Step} */ (out);
}

/**
 * /api/runs/{id}/ranks: {world_size, first_nonfinite: {step, ranks, loss, nonfinite} | null}.
 * @param {RanksOf<Tagged>} body
 * @returns {Ranks}
 */
export function decodeRanks(body) {
  const first = body.first_nonfinite;
  return { ...body, first_nonfinite: first ? { ...first, loss: nums(first.loss) } : null };
}

/**
 * /api/runs/{id}/optimizers: each optimizer's groups' lr points decoded.
 * @param {OptimizersOf<Tagged>} body
 * @returns {Optimizers}
 */
export function decodeOptimizers(body) {
  return {
    ...body,
    optimizers: body.optimizers.map((o) => ({
      ...o,
      lr: o.lr.map((g) => ({ ...g, points: decodeSeries(g).points })),
    })),
  };
}

/**
 * A run summary or detail (/api/runs, /api/runs/{id}).
 * @overload
 * @param {RunDetailOf<Tagged>} run
 * @returns {RunDetail}
 */
/**
 * @overload
 * @param {RunOf<Tagged>} run
 * @returns {Run}
 */
/**
 * @param {RunOf<Tagged>} run
 * @returns {Run}
 */
export function decodeRun(run) {
  return {
    ...run,
    last_scale: num(run.last_scale),
    worst_underflow: decodeWorst(run.worst_underflow),
    worst_headroom: decodeWorst(run.worst_headroom),
  };
}

/**
 * A run summary's {layer, value} (worst_underflow / worst_headroom) or null.
 * @param {WorstLayerOf<Tagged> | null | undefined} worst
 * @returns {WorstLayer | null}
 */
function decodeWorst(worst) {
  return worst === null || worst === undefined ? null : { layer: worst.layer, value: num(worst.value) };
}

/**
 * @param {DivergenceOf<Tagged> | null} d
 * @returns {Divergence | null}
 */
function decodeDivergence(d) {
  return d === null ? null : { ...d, reference_value: num(d.reference_value), value: num(d.value), relative: num(d.relative) };
}

/**
 * /api/compare.
 * @param {CompareOf<Tagged>} body
 * @returns {Compare}
 */
export function decodeCompare(body) {
  return {
    ...body,
    runs: body.runs.map(decodeRun),
    comparisons: body.comparisons.map((c) => ({
      ...c,
      divergence: decodeDivergence(c.divergence),
      loss_divergence: decodeDivergence(c.loss_divergence),
      grad_norm_divergence: decodeDivergence(c.grad_norm_divergence),
      layers: c.layers.map((l) => ({ ...l, l2_ratio: num(l.l2_ratio) })),
    })),
  };
}

/**
 * /series/{name}: points with min/max/last.
 * @template {{points: SeriesPointOf<Tagged>[]}} S  a /series answer, or an optimizer group's lr
 * @param {S} series
 * @returns {Omit<S, 'points'> & {points: SeriesPoint[]}}
 */
export function decodeSeries(series) {
  return {
    ...series,
    points: series.points.map((p) => ({ step: p.step, min: num(p.min), max: num(p.max), last: num(p.last) })),
  };
}

/**
 * /events.
 * @param {{events: RunEventOf<Tagged>[]}} body
 * @returns {RunEvent[]}
 */
export function decodeEvents(body) {
  return body.events.map((e) => ({ ...e, scale_before: num(e.scale_before), scale_after: num(e.scale_after) }));
}

/**
 * /layer-stats: z[layer][step].
 * @param {LayerStatsOf<Tagged>} body
 * @returns {LayerStats}
 */
export function decodeLayerStats(body) {
  return { ...body, z: body.z.map((row) => nums(row)) };
}

/**
 * /formats: every value of the matrix and of the verdicts' evidence decoded (names never).
 * @param {FormatsOf<Tagged>} body
 * @returns {Formats}
 */
export function decodeFormats(body) {
  const m = body.matrix;
  return {
    ...body,
    matrix: m === null ? null : {
      ...m,
      values: m.values.map((layer) => layer.map((operand) => operand.map((recipe) => nums(recipe)))),
      operands: m.operands.map((layer) => layer.map((operand) => nums(operand))),
      trained: m.trained ? {
        ...m.trained,
        amax: m.trained.amax.map((layer) => nums(layer)),
        scale: m.trained.scale.map((layer) => nums(layer)),
      } : null,
    },
    verdicts: body.verdicts.map((v) => ({
      ...v,
      grad_underflow: num(v.grad_underflow),
      keep: v.keep.map(decodeKeep),
      norms: v.norms.map(decodeKeep),
    })),
  };
}

/**
 * @param {KeepOf<Tagged>} k
 * @returns {Keep}
 */
function decodeKeep(k) {
  return { ...k, value: num(k.value), median: num(k.median), scale_min_frac: num(k.scale_min_frac) };
}

/**
 * /formats/trend: each statistic's series decoded.
 * @param {FormatTrendOf<Tagged>} body
 * @returns {FormatTrend}
 */
export function decodeFormatTrend(body) {
  /** @param {Record<string, (Tagged | null)[]>} series */
  const decode = (series) => Object.fromEntries(Object.entries(series).map(([k, v]) => [k, nums(v)]));
  return { ...body, values: decode(body.values), operand_values: decode(body.operand_values) };
}

/**
 * A live socket message: {"type": "steps"|"status"|"runs", ...}.
 * @param {string} text
 * @returns {LiveMessage}
 */
export function decodeLiveMessage(text) {
  /** @type {LiveMessageOf<Tagged>} */
  const msg = JSON.parse(text);
  if (msg.type === 'steps') return { ...msg, steps: msg.steps.map(decodeStep) };
  if (msg.type === 'runs') return { ...msg, runs: msg.runs.map(decodeRun), active: (msg.active ?? []).map(decodeRun) };
  return msg;
}
