// web/js/whatif.js: a layer's exponent histogram classed against the target format at a scale:
// what would flush to zero, go subnormal, overflow or fit, and how many doublings of the scale
// its largest values have left.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { MAX_DOUBLINGS, MIN_DOUBLINGS, sharesAt } from '../../../web/js/whatif.js';

const FP16 = { max: 65504, min_normal: 2 ** -14, min_subnormal: 2 ** -24 };
const BF16 = { max: 3.3895313892515355e38, min_normal: 2 ** -126, min_subnormal: 2 ** -133 };
const MIN_EXP = -30;
const MAX_EXP = 20;

/** A histogram as the server sends one (docs/contracts.md, wire v2 `histogram`). */
function histogram({ zero = 0, nonfinite = 0, below = 0, bins = {}, above = 0 }) {
  const counts = [zero, nonfinite, below, ...Array(MAX_EXP - MIN_EXP + 1).fill(0), above];
  for (const [exp, n] of Object.entries(bins)) counts[3 + Number(exp) - MIN_EXP] = n;
  return counts;
}

const layer = histogram({ zero: 5, nonfinite: 1, below: 2, bins: { '-26': 3, '-25': 4, '-15': 6, '-14': 7, 15: 8 } });

describe('sharesAt', () => {
  test('classes each bin by its lower edge times the scale (FP16, scale 1)', () => {
    assert.equal(layer.length, MAX_EXP - MIN_EXP + 5);
    assert.deepEqual(sharesAt(layer, MIN_EXP, MAX_EXP, 1, FP16), {
      zero: 5, nonfinite: 1,
      flushed: 5, // below 2^-30 and [2^-26, 2^-25): under half the smallest subnormal
      subnormal: 10, // [2^-25, 2^-24) and [2^-15, 2^-14)
      overflow: 0,
      fits: 15, // [2^-14, 2^-13) and [2^15, 2^16): the sliver [65504, 65536) counts as fitting
      total: 36,
      overflowDoublings: 1,
    });
  });

  test('moves every bin up at a doubled scale', () => {
    assert.deepEqual(sharesAt(layer, MIN_EXP, MAX_EXP, 2, FP16), {
      zero: 5, nonfinite: 1, flushed: 2, subnormal: 7, overflow: 8, fits: 13, total: 36, overflowDoublings: 0,
    });
    assert.deepEqual(sharesAt(layer, MIN_EXP, MAX_EXP, 2 ** -4, FP16), {
      zero: 5, nonfinite: 1, flushed: 9, subnormal: 13, overflow: 0, fits: 8, total: 36, overflowDoublings: 5,
    });
  });

  test('classes the bin below the range as the bin under 2^minExp', () => {
    // At 2^5, [2^-31, 2^-30) lands on [2^-26, 2^-25): under half the smallest subnormal.
    assert.deepEqual(sharesAt(histogram({ below: 3 }), MIN_EXP, MAX_EXP, 2 ** 5, FP16), {
      zero: 0, nonfinite: 0, flushed: 3, subnormal: 0, overflow: 0, fits: 0, total: 3, overflowDoublings: null,
    });
  });

  test('counts the bin above the range as overflowing by its lower edge', () => {
    const counts = histogram({ bins: { 0: 1 }, above: 2 });
    assert.deepEqual(sharesAt(counts, MIN_EXP, MAX_EXP, 1, FP16), {
      zero: 0, nonfinite: 0, flushed: 0, subnormal: 0, overflow: 2, fits: 1, total: 3, overflowDoublings: -5,
    });
  });

  test('has no overflow doublings without a finite non-zero value', () => {
    assert.deepEqual(sharesAt(histogram({ zero: 10 }), MIN_EXP, MAX_EXP, 65536, FP16), {
      zero: 10, nonfinite: 0, flushed: 0, subnormal: 0, overflow: 0, fits: 0, total: 10, overflowDoublings: null,
    });
    assert.deepEqual(sharesAt(histogram({ nonfinite: 4 }), MIN_EXP, MAX_EXP, 1, FP16), {
      zero: 0, nonfinite: 4, flushed: 0, subnormal: 0, overflow: 0, fits: 0, total: 4, overflowDoublings: null,
    });
  });

  test('judges against the format given: BF16 keeps what FP16 flushes', () => {
    assert.deepEqual(sharesAt(layer, MIN_EXP, MAX_EXP, 1, BF16), {
      zero: 5, nonfinite: 1, flushed: 0, subnormal: 0, overflow: 0, fits: 30, total: 36, overflowDoublings: 113,
    });
  });
});

test('the ×k slider spans 2^-16 to 2^16', () => {
  assert.equal(MIN_DOUBLINGS, -16);
  assert.equal(MAX_DOUBLINGS, 16);
});
