// web/js/smoothing.js: TensorBoard's debiased EMA. Non-finite values are data the smoothing
// cannot average: they get no smoothed point and leave its state as it was.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { ema } from '../../../web/js/smoothing.js';

const pushAll = (smoother, values) => values.map((v) => smoother.push(v));

describe('ema', () => {
  test('is debiased: the first point is the value itself, not pulled towards 0', () => {
    assert.equal(ema(0.99).push(100), 100);
    assert.deepEqual(pushAll(ema(0.5), [1, 2, 3]), [1, 1.6666666666666667, 2.4285714285714284]);
  });

  test('with weight 0 is the raw series', () => {
    assert.deepEqual(pushAll(ema(0), [3, -1, 0.25]), [3, -1, 0.25]);
  });

  test('gives no point for NaN, ±inf or a missing value, and carries on as if it was not there', () => {
    const smoother = ema(0.5);
    assert.deepEqual(pushAll(smoother, [1, NaN, Infinity, -Infinity, null, undefined, '2', 2]),
      [1, null, null, null, null, null, null, 1.6666666666666667]);
  });

  test('keeps a constant series exactly constant (no rounding wiggle)', () => {
    const values = pushAll(ema(0.9), Array(50).fill(0.1));
    assert.deepEqual(values, Array(50).fill(0.1));
  });

  test('stays within the range of the values seen', () => {
    const values = pushAll(ema(0.6), [5, 1e-30, 5, 1e-30, 5]);
    for (const v of values) assert.ok(v >= 1e-30 && v <= 5, String(v));
  });

  test('smoothers are independent', () => {
    const a = ema(0.5);
    const b = ema(0.5);
    a.push(10);
    assert.equal(b.push(2), 2);
    assert.equal(a.push(2), 4.666666666666667);
  });
});
