// TensorBoard's exponential moving average: debiased (the first points are not pulled towards 0),
// non-finite values skipped (they leave the state as it was and get no smoothed point).

/** A running EMA with weight w in [0, 1): push(v) returns the smoothed value (null for NaN/inf). */
export function ema(weight) {
  let last = 0;
  let count = 0;
  return {
    push(value) {
      if (typeof value !== 'number' || !Number.isFinite(value)) return null;
      last = last * weight + (1 - weight) * value;
      count += 1;
      const debias = weight === 0 ? 1 : 1 - weight ** count;
      return last / debias;
    },
  };
}
