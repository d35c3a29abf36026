// web/js/codec.js: the API's floats as the browser gets them. A finite float is a number, a
// non-finite one the tag "nan", "inf" or "-inf", null is "absent"; decoding is per field, so a
// run or a layer *named* "nan" keeps its name.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import {
  decodeCompare, decodeEvents, decodeLayerStats, decodeLiveMessage, decodeOptimizers, decodeRanks, decodeRun,
  decodeSeries, decodeStep, num,
} from '../../../web/js/codec.js';
import { numberText } from '../../../web/js/format.js';

describe('num', () => {
  test('decodes the tags to NaN and ±Infinity', () => {
    assert.ok(Number.isNaN(num('nan')));
    assert.equal(num('inf'), Infinity);
    assert.equal(num('-inf'), -Infinity);
  });

  test('keeps numbers, and reads null and undefined as absent', () => {
    assert.equal(num(1.5), 1.5);
    assert.equal(num(0), 0);
    assert.equal(num(-2e-300), -2e-300);
    assert.equal(num(null), null);
    assert.equal(num(undefined), null);
  });

  test('refuses anything else, naming it', () => {
    const refused = (value, text) => assert.throws(() => num(value), {
      name: 'TypeError', message: `expected a number or "nan"/"inf"/"-inf", got ${text}`,
    });
    refused('NaN', '"NaN"');
    refused('Infinity', '"Infinity"');
    refused('1.5', '"1.5"');
    refused('', '""');
    refused('constructor', '"constructor"'); // an inherited name is no tag
    refused(true, 'true');
    refused([1], '[1]');
  });

  test('gives values that print as the tags they came from', () => {
    assert.deepEqual(['nan', 'inf', '-inf', 2.5, null].map((v) => numberText(num(v))),
      ['NaN', '+inf', '-inf', '2.5', '—']);
  });
});

describe('decodeStep', () => {
  const wire = {
    id: 7, attempt: 1, seq: 3, step: 12, wall_time: 1764430001.25, loss: 'nan', scale_before: 65536,
    scale_after: 'inf', growth_tracker: null, found_inf: true, skipped: true, grad_norm: '-inf', lr: null,
    duration: 0.5,
  };

  test('decodes each float field, the rest as sent', () => {
    assert.deepEqual(decodeStep(wire), {
      id: 7, attempt: 1, seq: 3, step: 12, wall_time: 1764430001.25, loss: NaN, scale_before: 65536,
      scale_after: Infinity, growth_tracker: null, found_inf: true, skipped: true, grad_norm: -Infinity,
      lr: null, duration: 0.5,
    });
  });

  test('leaves an absent field absent', () => {
    const decoded = decodeStep({ id: 1, step: 0, loss: 'inf' });
    assert.deepEqual(decoded, { id: 1, step: 0, loss: Infinity });
    assert.ok(!('grad_norm' in decoded) && !('layers' in decoded) && !('ranks' in decoded));
  });

  test('decodes every per-layer statistic, null entries kept', () => {
    const step = decodeStep({ ...wire, layers: { amax: [0.5, 'inf', null], nan_count: [0, 3, 0] } });
    assert.deepEqual(step.layers, { amax: [0.5, Infinity, null], nan_count: [0, 3, 0] });
    assert.equal(decodeStep({ ...wire, layers: null }).layers, null);
  });

  test('decodes the ranks\' losses and the optimizers\' lr', () => {
    const step = decodeStep({
      ...wire,
      ranks: { loss: [1.5, 'nan', null], nonfinite: [0, 2, null] },
      optimizers: [{ skipped: true, lr: ['inf', 0.001, null] }, { skipped: null, lr: [] }],
    });
    assert.deepEqual(step.ranks, { loss: [1.5, NaN, null], nonfinite: [0, 2, null] });
    assert.deepEqual(step.optimizers, [{ skipped: true, lr: [Infinity, 0.001, null] }, { skipped: null, lr: [] }]);
    assert.equal(decodeStep({ ...wire, ranks: null, optimizers: null }).ranks, null);
    assert.equal(decodeStep({ ...wire, ranks: null, optimizers: null }).optimizers, null);
  });

  test('refuses a float field holding something else', () => {
    assert.throws(() => decodeStep({ ...wire, loss: 'NaN' }), TypeError);
  });
});

describe('decodeRun', () => {
  test('decodes the scale and the worst layers\' values, never a name', () => {
    const run = {
      id: 'r1', name: 'nan', project: 'inf', tags: ['nan'], status: 'active', last_scale: 'inf',
      worst_underflow: { layer: 'nan', value: 'nan' }, worst_headroom: { layer: 'fc.weight', value: '-inf' },
      config: { lr: 'nan' },
    };
    assert.deepEqual(decodeRun(run), {
      id: 'r1', name: 'nan', project: 'inf', tags: ['nan'], status: 'active', last_scale: Infinity,
      worst_underflow: { layer: 'nan', value: NaN }, worst_headroom: { layer: 'fc.weight', value: -Infinity },
      config: { lr: 'nan' },
    });
  });

  test('reads an absent scale and no worst layers as null', () => {
    const run = decodeRun({ id: 'r2', last_scale: null, worst_underflow: null });
    assert.deepEqual(run, { id: 'r2', last_scale: null, worst_underflow: null, worst_headroom: null });
  });
});

describe('decodeSeries', () => {
  test('decodes each point\'s min, max and last, and keeps only those', () => {
    const series = decodeSeries({
      name: 'loss', downsampled: true,
      points: [{ step: 0, min: 1, max: 'inf', last: 'nan', extra: 1 }, { step: 5, min: null, max: null, last: null }],
    });
    assert.deepEqual(series, {
      name: 'loss', downsampled: true,
      points: [{ step: 0, min: 1, max: Infinity, last: NaN }, { step: 5, min: null, max: null, last: null }],
    });
  });
});

describe('decodeEvents', () => {
  test('decodes the scales of each event, the rest as sent', () => {
    const events = decodeEvents({
      events: [
        { step: 3, kind: 'skipped', scale_before: 'inf', scale_after: 32768, loss_finite: false, layers: [] },
        { step: 4, kind: 'misuse', scale_before: null, scale_after: null, misuse_kind: 'unscale_twice', detail: 'nan' },
      ],
      next_start: 9,
    });
    assert.deepEqual(events, [
      { step: 3, kind: 'skipped', scale_before: Infinity, scale_after: 32768, loss_finite: false, layers: [] },
      { step: 4, kind: 'misuse', scale_before: null, scale_after: null, misuse_kind: 'unscale_twice', detail: 'nan' },
    ]);
  });
});

describe('decodeLayerStats', () => {
  test('decodes every cell, gaps kept, layer names untouched', () => {
    const body = { stat: 'amax', source: 'param', layers: ['nan', 'b'], steps: [0, 1], z: [[1, 'inf'], [null, '-inf']] };
    assert.deepEqual(decodeLayerStats(body), { ...body, z: [[1, Infinity], [null, -Infinity]] });
  });
});

describe('decodeRanks', () => {
  test('decodes the first non-finite step\'s losses', () => {
    const body = { world_size: 2, first_nonfinite: { step: 8, ranks: [1], loss: [0.5, 'nan'], nonfinite: [0, 4] } };
    assert.deepEqual(decodeRanks(body), {
      world_size: 2, first_nonfinite: { step: 8, ranks: [1], loss: [0.5, NaN], nonfinite: [0, 4] },
    });
    assert.deepEqual(decodeRanks({ world_size: 4, first_nonfinite: null }), { world_size: 4, first_nonfinite: null });
  });
});

describe('decodeOptimizers', () => {
  test('decodes each group\'s lr points and keeps the last step', () => {
    const body = {
      optimizers: [{
        optimizer: 0, steps: 3, skipped: 1, unknown: 0, skipped_steps: [2], groups: 1,
        lr: [{ group: 0, downsampled: false, points: [{ step: 2, min: 'nan', max: 'inf', last: 0.1 }] }],
      }],
      last_step: 2,
    };
    assert.deepEqual(decodeOptimizers(body), {
      optimizers: [{
        optimizer: 0, steps: 3, skipped: 1, unknown: 0, skipped_steps: [2], groups: 1,
        lr: [{ group: 0, downsampled: false, points: [{ step: 2, min: NaN, max: Infinity, last: 0.1 }] }],
      }],
      last_step: 2,
    });
    assert.deepEqual(decodeOptimizers({ optimizers: [], last_step: null }), { optimizers: [], last_step: null });
  });
});

describe('decodeCompare', () => {
  test('decodes the runs, the divergences and the layers\' ratios', () => {
    const divergence = { metric: 'loss', step: 40, reference_value: 1.5, value: 'inf', relative: 'inf' };
    const body = {
      tolerance: 0.05, underflow_threshold: 0.01, reference: 'a',
      runs: [{ id: 'a', name: 'nan', last_scale: 'nan', worst_underflow: null, worst_headroom: null }],
      comparisons: [{
        run: 'b', reference: 'a', divergence, loss_divergence: divergence, grad_norm_divergence: null,
        layers: [{ layer: 'nan', l2_ratio: 'inf' }, { layer: 'fc', l2_ratio: null }],
      }],
    };
    const decoded = { metric: 'loss', step: 40, reference_value: 1.5, value: Infinity, relative: Infinity };
    assert.deepEqual(decodeCompare(body), {
      tolerance: 0.05, underflow_threshold: 0.01, reference: 'a',
      runs: [{ id: 'a', name: 'nan', last_scale: NaN, worst_underflow: null, worst_headroom: null }],
      comparisons: [{
        run: 'b', reference: 'a', divergence: decoded, loss_divergence: decoded, grad_norm_divergence: null,
        layers: [{ layer: 'nan', l2_ratio: Infinity }, { layer: 'fc', l2_ratio: null }],
      }],
    });
  });
});

describe('decodeLiveMessage', () => {
  test('decodes a run\'s steps', () => {
    const text = '{"type": "steps", "run_id": "r", "last_id": 9, "steps": [{"id": 9, "step": 4, "loss": "-inf"}]}';
    assert.deepEqual(decodeLiveMessage(text), {
      type: 'steps', run_id: 'r', last_id: 9, steps: [{ id: 9, step: 4, loss: -Infinity }],
    });
  });

  test('decodes the runs list\'s runs, older active ones empty when not sent', () => {
    const text = '{"type": "runs", "full": false, "runs": [{"id": "nan", "last_scale": "inf"}]}';
    assert.deepEqual(decodeLiveMessage(text), {
      type: 'runs', full: false, active: [],
      runs: [{ id: 'nan', last_scale: Infinity, worst_underflow: null, worst_headroom: null }],
    });
  });

  test('passes a status message as it is', () => {
    assert.deepEqual(decodeLiveMessage('{"type": "status", "status": "finished"}'), { type: 'status', status: 'finished' });
  });

  test('refuses a bare NaN token: JSON has none (the server sends the tag)', () => {
    assert.throws(() => decodeLiveMessage('{"type": "steps", "steps": [{"loss": NaN}]}'), SyntaxError);
  });
});
