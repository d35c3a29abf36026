// @ts-check
// TensorBoard's exponential moving average: debiased (the first points are not pulled towards 0),
// non-finite values skipped (they leave the state as it was and get no smoothed point).

/**
 * @typedef {{push: (value: unknown) => number | null}} Ema
 *   push(v): the smoothed value after v; null for anything but a finite number (the state stays)
 */

/**
 * A running EMA with weight w in [0, 1): push(v) returns the smoothed value (null for NaN/inf).
 * @param {number} weight
 * @returns {Ema}
 */
export function ema(weight) {
  let last = 0;
  let count = 0;
  let lo = Infinity;
  let hi = -Infinity;
  return {
    push(value) {
      if (typeof value !== 'number' || !Number.isFinite(value)) return null;
      last = last * weight + (1 - weight) * value;
      count += 1;
      lo = Math.min(lo, value);
      hi = Math.max(hi, value);
      const debias = weight === 0 ? 1 : 1 - weight ** count;
      // The debiased EMA is a weighted mean of the values seen, so it lies within their range;
      // clamping removes the rounding that would otherwise make a constant series wiggle (and a
      // chart autoranged on it zoom into that rounding).
      return Math.min(hi, Math.max(lo, last / debias));
    },
  };
}
