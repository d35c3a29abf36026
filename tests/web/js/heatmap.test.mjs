// web/js/heatmap.js: a live step's column of a statistic, computed in the browser as the read
// API computes it (server/ampscope_server/series_math.py) for the heatmap and the layer table.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { columnOf, eventCells } from '../../../web/js/heatmap.js';

const FP16_MAX = 65504;
const step = (layers, scale = 1024) => ({ step: 7, scale_before: scale, layers });

describe('columnOf', () => {
  test('gives a statistic the step carries as it is', () => {
    assert.deepEqual(columnOf(step({ amax: [1, null, Infinity] }), 'amax', FP16_MAX), [1, null, Infinity]);
  });

  test('is null for a step without per-layer statistics, or without that one', () => {
    assert.equal(columnOf({ step: 1, scale_before: 1, layers: null }, 'amax', FP16_MAX), null);
    assert.equal(columnOf(step({ amax: [1] }), 'l2', FP16_MAX), null);
  });

  test('adds zeros and flushed values into lost_frac', () => {
    const layers = { zero_frac: [0.25, null, 0], underflow_frac: [0.5, 0.1, null] };
    assert.deepEqual(columnOf(step(layers), 'lost_frac', FP16_MAX), [0.75, null, null]);
  });

  test('gives headroom_bits as doublings of the scale left before amax overflows', () => {
    const column = columnOf(step({ amax: [2, 64, 0, null] }, 1024), 'headroom_bits', FP16_MAX);
    assert.deepEqual(column, [Math.log2(FP16_MAX / 2048), Math.log2(FP16_MAX / 65536), Infinity, null]);
    assert.ok(column[0] > 4.99 && column[0] < 5 && column[1] < 0);
  });

  test('counts no scale (no GradScaler) as 1, as the read API does', () => {
    assert.deepEqual(columnOf(step({ amax: [1, 0] }, null), 'headroom_bits', FP16_MAX),
      [Math.log2(FP16_MAX), Infinity]);
  });

  test('has no headroom at a scale that is not a positive finite number', () => {
    for (const scale of [0, -2, NaN, Infinity]) {
      assert.deepEqual(columnOf(step({ amax: [1, 0, null] }, scale), 'headroom_bits', FP16_MAX), [null, null, null],
        String(scale));
    }
  });
});

describe('eventCells', () => {
  test('lists the cells holding a non-zero count, step by step', () => {
    assert.deepEqual(eventCells([10, 11], [[0, 3, null], [1, 0, 0]], ['a', 'b', 'c']),
      { x: [10, 11], y: ['b', 'a'], text: [3, 1] });
    assert.deepEqual(eventCells([], [], ['a']), { x: [], y: [], text: [] });
  });
});
