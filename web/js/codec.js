// The one place that decodes the API's floats (docs/contracts.md, "Non-finite numbers").
//
// JSON has no NaN/Infinity, so the server sends a finite float as a number and a non-finite one as
// the tag "nan", "inf" or "-inf"; `null` means "absent". Decoding is per field, never a blind walk
// over the whole document: a run or layer may legitimately be *named* "nan".

const TAGS = { nan: NaN, inf: Infinity, '-inf': -Infinity };

/** A tagged float → number (NaN/±Infinity included); null/undefined → null. */
export function num(value) {
  if (value === null || value === undefined) return null;
  if (typeof value === 'number') return value;
  if (typeof value === 'string' && Object.hasOwn(TAGS, value)) return TAGS[value];
  throw new TypeError(`expected a number or "nan"/"inf"/"-inf", got ${JSON.stringify(value)}`);
}

function nums(values) {
  return values === null || values === undefined ? null : values.map(num);
}

const STEP_FLOATS = ['loss', 'scale_before', 'scale_after', 'grad_norm', 'lr', 'duration', 'wall_time'];

/** Per-layer arrays of a step (`{stat: [...]}`), every stat decoded. */
function decodeLayers(layers) {
  if (layers === null || layers === undefined) return null;
  const out = {};
  for (const [stat, values] of Object.entries(layers)) out[stat] = nums(values);
  return out;
}

/** A step's per-rank values (wire v4 `ranks`: {loss, nonfinite}) or null. */
function decodeRankValues(ranks) {
  return ranks === null || ranks === undefined ? null : { ...ranks, loss: nums(ranks.loss) };
}

/** StepScalars (+ optional "layers", v4 "ranks" and "optimizers") from /steps or the live socket. */
export function decodeStep(step) {
  const out = { ...step };
  for (const key of STEP_FLOATS) if (key in out) out[key] = num(out[key]);
  if ('layers' in out) out.layers = decodeLayers(out.layers);
  if ('ranks' in out) out.ranks = decodeRankValues(out.ranks);
  if (Array.isArray(out.optimizers)) out.optimizers = out.optimizers.map((o) => ({ ...o, lr: nums(o.lr) }));
  return out;
}

/** /api/runs/{id}/ranks: {world_size, first_nonfinite: {step, ranks, loss, nonfinite} | null}. */
export function decodeRanks(body) {
  const first = body.first_nonfinite;
  return { ...body, first_nonfinite: first ? { ...first, loss: nums(first.loss) } : null };
}

/** /api/runs/{id}/optimizers: each optimizer's groups' lr points decoded. */
export function decodeOptimizers(body) {
  return {
    ...body,
    optimizers: body.optimizers.map((o) => ({
      ...o,
      lr: o.lr.map((g) => ({ ...g, points: decodeSeries(g).points })),
    })),
  };
}

/** A run summary or detail (/api/runs, /api/runs/{id}). */
export function decodeRun(run) {
  return {
    ...run,
    last_scale: num(run.last_scale),
    worst_underflow: decodeWorst(run.worst_underflow),
    worst_headroom: decodeWorst(run.worst_headroom),
  };
}

/** A run summary's {layer, value} (worst_underflow / worst_headroom) or null. */
function decodeWorst(worst) {
  return worst === null || worst === undefined ? null : { layer: worst.layer, value: num(worst.value) };
}

function decodeDivergence(d) {
  return d === null ? null : { ...d, reference_value: num(d.reference_value), value: num(d.value), relative: num(d.relative) };
}

/** /api/compare. */
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

/** /series/{name}: points with min/max/last. */
export function decodeSeries(series) {
  return {
    ...series,
    points: series.points.map((p) => ({ step: p.step, min: num(p.min), max: num(p.max), last: num(p.last) })),
  };
}

/** /events. */
export function decodeEvents(body) {
  return body.events.map((e) => ({ ...e, scale_before: num(e.scale_before), scale_after: num(e.scale_after) }));
}

/** /layer-stats: z[layer][step]. */
export function decodeLayerStats(body) {
  return { ...body, z: body.z.map(nums) };
}

/** A live socket message: {"type": "steps"|"status"|"runs", ...}. */
export function decodeLiveMessage(text) {
  const msg = JSON.parse(text);
  if (msg.type === 'steps') return { ...msg, steps: msg.steps.map(decodeStep) };
  if (msg.type === 'runs') return { ...msg, runs: msg.runs.map(decodeRun), active: (msg.active ?? []).map(decodeRun) };
  return msg;
}
