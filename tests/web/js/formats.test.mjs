// web/js/formats.js: the Formats view's pure side (#33). One sampled step's (layer, operand,
// recipe) statistics as a layer × recipe matrix: the "worst" score, what a cell is coloured by
// and says, NaN ("not measured") and absent cells kept apart from 0, two runs' rows merged by
// name, the verdicts' keep-lists as sentences, and a trend's block scale exponents as a heatmap's grid.
// Also formats_trend.js's share ticks.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import {
  BAD_LEVELS, WORST_CAP, WORST_FLOOR, cellValue, colourRange, colourValue, hoverText, keepReason, keptCells,
  matrixGrid, normReason, mergeNames, percent, scaleGrid, snrDb, statText, trainedLines, verdictHeadline, worstScore,
} from '../../../web/js/formats.js';
import { decodeFormats } from '../../../web/js/codec.js';
import { shareTicks, stepRange } from '../../../web/js/formats_trend.js';

const cell = (underflow, saturated, error, scaleMin = 0, scaleMax = 0) => ({
  underflow_frac: underflow, saturated_frac: saturated, rel_rmse: error, scale_min_frac: scaleMin,
  scale_max_frac: scaleMax,
});

/** A /formats answer as the server sends it (docs/contracts.md), tags and all. */
const sent = {
  operand_names: ['input', 'weight', 'grad_output'],
  stat_names: ['underflow_frac', 'saturated_frac', 'rel_rmse', 'scale_min_frac', 'scale_max_frac'],
  operand_stat_names: ['amax', 'rms', 'kurtosis', 'nonfinite_frac'],
  sampled: 3, downsampled: false,
  steps: [{ id: 1, step: 0 }, { id: 2, step: 100 }, { id: 3, step: 200 }],
  matrix: {
    id: 3, step: 200, recipes: ['fp8_tensorwise', 'mxfp8'],
    layers: [{ index: 0, name: 'fc1.weight' }, { index: 2, name: 'fc2.weight' }],
    values: [
      [[[0, 0, 0.021, 0, 0], [0.12, 0, 0.03, 0.3, 0]], [[0, 0, 0.02, 0, 0], [0, 0, 0.02, 0, 0]],
        [[0.002, 0, 0.05, 0, 0], [0.12, 0, 0.03, 0.3, 0]]],
      [[[0, 0, 0.02, 0, 0], [0, 0, 'inf', 0, 0]], [[0, 0, 0.02, 0, 0], [0, 0, 0.02, 0, 0]],
        [['nan', 'nan', 'nan', 'nan', 'nan'], [0, 'nan', 0.02, 0, 0]]],
    ],
    operands: [[[1.5, 0.3, 3.1, 0], [1, 0.1, 3, 0], [2, 0.2, 'inf', 0]],
      [[1, 0.1, 3, 0], [1, 0.1, 3, 0], ['nan', 'nan', 'nan', 0]]],
  },
  verdicts: [
    { recipe: 'mxfp8', step: 200, measured: 2, summary: 'mxfp8: 1 of 2 layers need BF16 (fc1.weight)',
      keep: [{ layer: 'fc1.weight', operand: 'grad_output', stat: 'underflow_frac', value: 0.12, median: 0.001,
        scale_min_frac: 0.3 }], grad_underflow: 0.06, uniform_loss: false, norms_measured: 0, norms: [] },
    { recipe: 'fp8_tensorwise', step: 200, measured: 2, summary: 'fp8_tensorwise: all 2 layers fit', keep: [],
      grad_underflow: 0, uniform_loss: false, norms_measured: 0, norms: [] },
  ],
};
const body = decodeFormats(sent);

describe('worstScore', () => {
  test('is the worse of underflow and error, each over its bad level', () => {
    assert.deepEqual(BAD_LEVELS, { underflow_frac: 0.01, rel_rmse: 0.05 });
    assert.equal(worstScore(cell(0, 0, 0.025)), 0.5); // E4M3: half the error level
    assert.equal(worstScore(cell(0.02, 0, 0.025)), 2);
    assert.equal(worstScore(cell(0.01, 0, 0.05)), 1);
    assert.equal(worstScore(cell(0.1025, 0, 0.1124)), 10.25); // MXFP4 on a gradient
  });

  test('leaves saturation out: what clamping costs is in the error', () => {
    assert.equal(worstScore(cell(0, 0.0938, 0)), 0); // a clamp by less than a rounding step
    assert.equal(worstScore(cell(0, 0.5, 0.0298)), 0.0298 / 0.05); // NVFP4's amax blocks, by design
    assert.equal(worstScore(cell(0, NaN, 0.025)), 0.5);
  });

  test('is 0 for a cell that loses nothing, and clipped at WORST_CAP', () => {
    assert.equal(worstScore(cell(0, 0, 0)), 0);
    assert.equal(WORST_CAP, 32);
    assert.equal(worstScore(cell(0.62, 0, 0.14)), WORST_CAP);
    assert.equal(worstScore(cell(0, 0, Infinity)), WORST_CAP);
    assert.equal(worstScore(cell(-Infinity, 0, 0.025)), 0.5); // no share is negative: not below 0
  });

  test('is NaN when either is not measured (NaN in, NaN out), never 0', () => {
    assert.ok(Number.isNaN(worstScore(cell(NaN, NaN, NaN))));
    assert.ok(Number.isNaN(worstScore(cell(NaN, 0, 0.02))));
    assert.ok(Number.isNaN(worstScore(cell(0, 0, NaN))));
    assert.ok(Number.isNaN(worstScore(cell(NaN, 0, Infinity))));
    assert.ok(Number.isNaN(worstScore({ underflow_frac: 0 }))); // missing
    assert.ok(Number.isNaN(worstScore(cell(null, 0, 0.02)))); // absent
  });

  test('leaves the scale statistics out', () => {
    assert.equal(worstScore(cell(0, 0, 0.025, 1, 1)), 0.5);
    assert.equal(worstScore(cell(0, 0, 0.025, NaN, NaN)), 0.5);
  });
});

describe('cellValue', () => {
  test('gives the statistic asked for, "worst" the score', () => {
    const c = cell(0.02, 0, 0.025, 0.3, 0.1);
    assert.equal(cellValue(c, 'worst'), 2);
    assert.equal(cellValue(c, 'underflow_frac'), 0.02);
    assert.equal(cellValue(c, 'scale_min_frac'), 0.3);
    assert.equal(cellValue(c, 'scale_max_frac'), 0.1);
    assert.ok(Number.isNaN(cellValue(cell(0, NaN, 0), 'saturated_frac')));
    assert.ok(Number.isNaN(cellValue(c, 'nonsense')));
  });
});

describe('colourValue', () => {
  test('colours "worst" by log2 of the score within [WORST_FLOOR, WORST_CAP]', () => {
    assert.deepEqual(colourRange('worst'), [-3, 5]);
    assert.equal(WORST_FLOOR, 1 / 8);
    assert.equal(colourValue('worst', 1), 0);
    assert.equal(colourValue('worst', 4), 2);
    assert.equal(colourValue('worst', 0), -3); // no loss at all: the floor
    assert.equal(colourValue('worst', 1000), 5);
    assert.equal(colourValue('worst', Infinity), 5);
  });

  test('colours the statistics within [0, 1]', () => {
    assert.deepEqual(colourRange('rel_rmse'), [0, 1]);
    assert.equal(colourValue('underflow_frac', 0.12), 0.12);
    assert.equal(colourValue('rel_rmse', 3), 1);
    assert.equal(colourValue('rel_rmse', Infinity), 1);
    assert.equal(colourValue('underflow_frac', -Infinity), 0);
  });

  test('gives NaN no colour (the "not measured" trace draws it), never 0', () => {
    assert.equal(colourValue('worst', NaN), null);
    assert.equal(colourValue('underflow_frac', NaN), null);
  });
});

describe('texts', () => {
  test('statText: the score with ×, shares as percents, the error as a number', () => {
    assert.equal(statText('worst', 0.52), '0.52×');
    assert.equal(statText('worst', 11.4), '11×');
    assert.equal(statText('worst', 0), '0×');
    assert.equal(statText('worst', 0.004), '<0.01×');
    assert.equal(statText('worst', WORST_CAP), '≥32×');
    assert.equal(statText('underflow_frac', 0.12), '12%');
    assert.equal(statText('underflow_frac', 0.0005), '0.05%');
    assert.equal(statText('saturated_frac', 0), '0%');
    assert.equal(statText('rel_rmse', 0.02676), '0.0268');
    assert.equal(statText('rel_rmse', Infinity), '+inf');
  });

  test('statText: NaN is "not measured" whatever the statistic', () => {
    for (const stat of ['worst', 'underflow_frac', 'rel_rmse', 'scale_max_frac']) {
      assert.equal(statText(stat, NaN), 'not measured', stat);
    }
    assert.equal(percent(NaN), 'not measured');
  });

  test('snrDb: −20·log10 of the relative error', () => {
    assert.equal(snrDb(0.1), 20);
    assert.equal(snrDb(1), -0);
    assert.equal(snrDb(0), Infinity);
    assert.ok(Number.isNaN(snrDb(NaN)));
    assert.ok(Number.isNaN(snrDb(-0.1)));
    assert.equal(snrDb(Infinity), -Infinity);
  });

  test('hoverText: all five numbers, the SNR beside the error', () => {
    assert.equal(hoverText(cell(0.12, 0, 0.03, 0.3, 0)),
      'underflow 12% · saturated 0%<br>rel. error 0.03 (SNR 30.5 dB)<br>'
      + 'blocks\' scale at least 30% · at greatest 0%');
    assert.equal(hoverText(cell(NaN, NaN, NaN, NaN, NaN)),
      'underflow not measured · saturated not measured<br>rel. error NaN<br>'
      + 'blocks\' scale at least not measured · at greatest not measured');
    assert.equal(hoverText(cell(0, 0, 0)).split('<br>')[1], 'rel. error 0 (SNR +inf dB)');
  });
});

describe('mergeNames', () => {
  test('keeps the first order, each name only in the second after the one it follows there', () => {
    assert.deepEqual(mergeNames(['q', 'fc1', 'fc2', 'head', 'aux'], ['q', 'proj', 'fc1', 'fc2', 'head']),
      ['q', 'proj', 'fc1', 'fc2', 'head', 'aux']);
    assert.deepEqual(mergeNames(['b', 'c'], ['a', 'b', 'd']), ['a', 'b', 'd', 'c']);
    assert.deepEqual(mergeNames(['a', 'b'], ['a', 'b']), ['a', 'b']);
    assert.deepEqual(mergeNames([], ['x', 'y']), ['x', 'y']);
    assert.deepEqual(mergeNames(['x', 'y'], []), ['x', 'y']);
    assert.deepEqual(mergeNames(['a', 'a'], ['a']), ['a']);
  });
});

describe('matrixGrid', () => {
  test('gives the layers in table order and the recipes, one cell each, for one operand', () => {
    const grid = matrixGrid(body, 'grad_output', 'underflow_frac');
    assert.deepEqual(grid.rows, ['fc1.weight', 'fc2.weight']);
    assert.deepEqual(grid.indices, [0, 2]);
    assert.deepEqual(grid.recipes, ['fp8_tensorwise', 'mxfp8']);
    assert.equal(grid.step, 200);
    assert.deepEqual(grid.cells[0].map((c) => [c.state, c.value]), [['measured', 0.002], ['measured', 0.12]]);
    assert.deepEqual(grid.cells[0][1].stats, cell(0.12, 0, 0.03, 0.3, 0));
    const input = matrixGrid(body, 'input', 'rel_rmse');
    assert.deepEqual(input.cells.map((row) => row.map((c) => c.value)), [[0.021, 0.03], [0.02, Infinity]]);
  });

  test('keeps a "nan" cell apart from 0: not measured', () => {
    const grid = matrixGrid(body, 'grad_output', 'worst');
    const [nan, partly] = grid.cells[1];
    assert.equal(nan.state, 'nan');
    assert.ok(Number.isNaN(nan.value));
    assert.equal(partly.state, 'measured'); // its saturation was not measured: not in the score
    assert.equal(partly.value, 0.02 / 0.05);
    assert.deepEqual(grid.cells[0].map((c) => [c.state, c.value]), [['measured', 1], ['measured', 12]]);
    // The statistic measured in that cell is shown; the one not measured is not.
    assert.equal(matrixGrid(body, 'grad_output', 'rel_rmse').cells[1][1].state, 'measured');
    assert.equal(matrixGrid(body, 'grad_output', 'saturated_frac').cells[1][1].state, 'nan');
  });

  test('lines up rows and recipes given by name: those the matrix lacks are absent', () => {
    const grid = matrixGrid(body, 'weight', 'worst',
      { rows: ['fc0.weight', 'fc1.weight', 'fc2.weight'], recipes: ['mxfp8', 'nvfp4'] });
    assert.deepEqual(grid.indices, [null, 0, 2]);
    assert.deepEqual(grid.cells.map((row) => row.map((c) => c.state)),
      [['absent', 'absent'], ['measured', 'absent'], ['measured', 'absent']]);
    assert.equal(grid.cells[1][0].value, 0.02 / 0.05); // its error, over 5 %
    assert.equal(grid.cells[0][0].stats, null);
  });

  test('is null without a matrix (no sampled step), all absent for an unknown operand', () => {
    assert.equal(matrixGrid({ ...body, matrix: null, verdicts: [] }, 'input', 'worst'), null);
    const grid = matrixGrid(body, 'output', 'worst');
    assert.ok(grid.cells.flat().every((c) => c.state === 'absent'));
  });

  test('reads a value left null (absent) as not measured', () => {
    const held = structuredClone(body);
    held.matrix.values[0][2][0] = [null, 0, 0.03, 0, 0];
    assert.equal(matrixGrid(held, 'grad_output', 'worst').cells[0][0].state, 'nan');
  });
});

describe('verdicts', () => {
  test('keepReason: the operand, the statistic against the median, the pinned scales', () => {
    assert.equal(keepReason(body.verdicts[0].keep[0]),
      'grad_output, underflow 12% vs median 0.1% (scale pinned at its least in 30% of blocks)');
    assert.equal(keepReason({ layer: 'a', operand: 'input', stat: 'rel_rmse', value: 0.4, median: 0.05,
      scale_min_frac: 0 }), 'input, rel. error 0.4 vs median 0.05');
    assert.equal(keepReason({ layer: 'a', operand: 'input', stat: 'rel_rmse', value: 0.4, median: 0.05,
      scale_min_frac: NaN }), 'input, rel. error 0.4 vs median 0.05');
  });

  test('keepReason: a NaN median is the gradient-noise rule, said in dB', () => {
    assert.equal(keepReason({ layer: 'head', operand: 'grad_output', stat: 'rel_rmse', value: 0.7, median: NaN,
      scale_min_frac: 0 }),
    'grad_output, rel. error 0.7: SNR 3.1 dB, under the 4.77 dB below which a gradient drowns in its quantisation noise');
  });

  test('normReason: the gains flushed, or the error, beside the GEMM weights\' median', () => {
    const flushed = { layer: 'ln.weight', operand: 'weight', stat: 'underflow_frac', value: 0.6875, median: 0.03,
      scale_min_frac: 0 };
    assert.equal(normReason(flushed), '68.8% of its gains flushed to zero (GEMM weights\' median 3%)');
    assert.equal(normReason({ ...flushed, stat: 'rel_rmse', value: 0.33, median: 0.08 }),
      'rel. error 0.33 (GEMM weights\' median 0.08)');
    assert.equal(normReason({ ...flushed, median: NaN }), '68.8% of its gains flushed to zero');
  });

  test('keptCells: each kept layer under its recipe, as [row, column, keep]', () => {
    const grid = matrixGrid(body, 'input', 'worst');
    assert.deepEqual(keptCells(grid, body.verdicts), [[0, 1, body.verdicts[0].keep[0]]]);
    const norm = { layer: 'fc2.weight', operand: 'weight', stat: 'underflow_frac', value: 0.5, median: 0,
      scale_min_frac: 0 };
    assert.deepEqual(keptCells(grid, [{ ...body.verdicts[1], norms: [norm] }]), [[1, 0, norm]]);
    const other = matrixGrid(body, 'input', 'worst', { rows: ['fc2.weight'], recipes: ['fp8_tensorwise'] });
    assert.deepEqual(keptCells(other, body.verdicts), []);
  });

  test('verdictHeadline: the recipes that fit, and those that keep layers', () => {
    assert.equal(verdictHeadline(body.verdicts),
      'Fits with every layer: fp8_tensorwise · Needs layers kept in BF16: mxfp8 (1 of 2 layers)');
    assert.equal(verdictHeadline([body.verdicts[1]]), 'Fits with every layer: fp8_tensorwise');
    assert.equal(verdictHeadline([{ ...body.verdicts[0], measured: 1 }]),
      'Needs layers kept in BF16: mxfp8 (1 of 1 layer)');
    assert.equal(verdictHeadline([]), '');
  });

  test('verdictHeadline: the recipes under which norms\' affine weights stay in BF16, apart', () => {
    const norm = { layer: 'ln.weight', operand: 'weight', stat: 'underflow_frac', value: 0.5, median: 0,
      scale_min_frac: 0 };
    const mxfp4 = { ...body.verdicts[1], recipe: 'mxfp4', norms_measured: 2, norms: [norm] };
    assert.equal(verdictHeadline([body.verdicts[1], mxfp4]),
      'Fits with every layer: fp8_tensorwise, mxfp4 · Norms\' affine weights to keep in BF16 if quantised: '
      + 'mxfp4 (1 of 2)');
  });

  test('verdictHeadline: a recipe that flushes every layer\'s gradient is not said to fit', () => {
    const everywhere = { ...body.verdicts[1], recipe: 'mxfp4', keep: [], grad_underflow: 0.25,
      uniform_loss: true };
    assert.equal(verdictHeadline([body.verdicts[1], everywhere]),
      'Fits with every layer: fp8_tensorwise · Flushes gradients to zero everywhere: mxfp4 (25% of '
      + 'the median layer\'s gradient)');
  });
});

describe('decodeFormats', () => {
  test('decodes every tagged value of the matrix and of the evidence, names never', () => {
    assert.equal(body.matrix.values[1][2][0].every(Number.isNaN), true);
    assert.equal(body.matrix.values[1][0][1][2], Infinity);
    assert.equal(body.matrix.operands[0][2][2], Infinity);
    assert.ok(Number.isNaN(body.matrix.operands[1][2][0]));
    assert.equal(body.verdicts[0].keep[0].value, 0.12);
    const named = decodeFormats({ ...sent, matrix: { ...sent.matrix, layers: [{ index: 0, name: 'nan' }],
      values: [sent.matrix.values[0]], operands: [sent.matrix.operands[0]] },
    verdicts: [{ ...sent.verdicts[0], keep: [{ ...sent.verdicts[0].keep[0], layer: 'nan', median: 'nan' }] }] });
    assert.equal(named.matrix.layers[0].name, 'nan');
    assert.equal(named.verdicts[0].keep[0].layer, 'nan');
    assert.ok(Number.isNaN(named.verdicts[0].keep[0].median));
  });

  test('keeps a run without samples as it is', () => {
    const none = { ...sent, sampled: 0, steps: [], matrix: null, verdicts: [] };
    assert.deepEqual(decodeFormats(none), none);
  });
});

describe('shareTicks', () => {
  test('one tick per decade from the floor (labelled 0) up, as percents', () => {
    assert.deepEqual(shareTicks(1e-4, 0.3), { // the floor as given: logFloor's 10 ** -4 is not 1e-4
      tickmode: 'array', tickvals: [1e-4, 1e-3, 1e-2, 1e-1, 1], ticktext: ['0', '0.1%', '1%', '10%', '100%'],
    });
    assert.deepEqual(shareTicks(0.1, -Infinity).ticktext, ['0', '100%']); // all zero: the floor alone
    assert.deepEqual(shareTicks(10 ** -4, 0.05).tickvals, [10 ** -4, 1e-3, 1e-2, 1e-1]);
  });
});

describe('scaleGrid', () => {
  const counts = (/** @type {Record<number, number>} */ at) => Array.from({ length: 16 }, (_, k) => at[k] ?? 0);

  test('one row per exponent any step reaches, shares of each step\'s blocks', () => {
    // Step 0: top 2^-8, 3 blocks there, 1 ten below. Step 100: top 2^-6, 4 blocks 15 or more below.
    const grid = scaleGrid([0, 100], [{ top: -8, counts: counts({ 0: 3, 10: 1 }) },
      { top: -6, counts: counts({ 15: 4 }) }]);
    assert.deepEqual(grid.y, Array.from({ length: 18 }, (_, i) => -23 + i)); // 2^-23 (-8 - 15) to 2^-6
    const at = (/** @type {number} */ e) => grid.z[grid.y.indexOf(e)];
    assert.deepEqual(at(-8), [0.75, 0]);
    assert.deepEqual(at(-18), [0.25, 0]);
    assert.deepEqual(at(-21), [0, 1]); // step 100's last bin: 15 binades below 2^-6 or farther
    assert.deepEqual(at(-22), [0, null]); // below step 100's last bin: unknown, a gap
    assert.deepEqual(at(-23), [0, null]);
    assert.deepEqual(at(-6), [0, 0]); // above step 0's top: none of its blocks
    assert.equal(grid.text[grid.y.indexOf(-21)][1], 'step 100 · scale 2^-21 or below: 4 of 4 blocks (100%)');
    assert.equal(grid.text[grid.y.indexOf(-18)][0], 'step 0 · scale 2^-18: 1 of 4 blocks (25%)');
  });

  test('a step without exponents is a gap, none at all is no rows', () => {
    const grid = scaleGrid([0, 10, 20], [null, { top: null, counts: counts({}) }, { top: 3, counts: counts({ 0: 2 }) }]);
    assert.deepEqual(grid.y, Array.from({ length: 16 }, (_, i) => -12 + i));
    assert.ok(grid.z.every((row) => row[0] === null && row[1] === null));
    assert.deepEqual(grid.z[grid.y.indexOf(3)], [null, null, 1]);
    assert.deepEqual(scaleGrid([0], [null]), { y: [], z: [], text: [] });
  });
});

describe('stepRange', () => {
  test('first to last step, widened by half the mean spacing: where the heatmap columns end', () => {
    assert.deepEqual(stepRange([0, 100, 200]), [-50, 250]);
    assert.deepEqual(stepRange([10, 20, 50]), [0, 60]); // mean spacing 20
    assert.deepEqual(stepRange([300]), [299.5, 300.5]);
    assert.equal(stepRange([]), null);
  });
});

describe('trainedLines', () => {
  test('one sentence per layer that trains in a recipe, its scales and amaxes', () => {
    const matrix = decodeFormats({ ...sent, matrix: { ...sent.matrix, trained: {
      recipes: ['fp8_tensorwise', null], amax: [[2, 0.5, 'inf'], ['nan', 'nan', 'nan']],
      scale: [[224, 896, 'nan'], ['nan', 'nan', 'nan']] } } }).matrix;
    assert.deepEqual(trainedLines(matrix, ['input', 'weight', 'grad_output']), [
      'fc1.weight trains in fp8_tensorwise: scale 224 (input amax 2), scale 896 (weight amax 0.5), '
      + 'grad_output amax +inf']);
    assert.deepEqual(trainedLines(body.matrix, ['input', 'weight', 'grad_output']), []);
  });

  test("a row-wise recipe's scale is its largest row's", () => {
    const matrix = decodeFormats({ ...sent, matrix: { ...sent.matrix, trained: {
      recipes: [null, 'fp8_rowwise'], amax: [['nan', 'nan', 'nan'], [3.18, 0.125, 0.0027]],
      scale: [['nan', 'nan', 'nan'], [128, 2048, 131072]] } } }).matrix;
    assert.deepEqual(trainedLines(matrix, ['input', 'weight', 'grad_output']), [
      "fc2.weight trains in fp8_rowwise: largest row's scale 128 (input amax 3.18), largest row's "
      + "scale 2048 (weight amax 0.125), largest row's scale 131072 (grad_output amax 0.0027)"]);
  });
});
