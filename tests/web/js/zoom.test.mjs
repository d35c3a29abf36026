// web/js/zoom.js: a zoom of a chart's x axis as a step range, the debounced fetch of that
// range's detail, the step charts zoomed together, and their plot areas lined up.
import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, test } from 'node:test';

import { alignMargins, followZoom, linkZoom, xRangeOf } from '../../../web/js/zoom.js';

/** A stand-in for a drawn chart's div: plotly's `on`, and `emit` to play a relayout event. */
function chart({ name = '', clientWidth = 0, data = [{ x: [], y: [] }], size = undefined } = {}) {
  const handlers = [];
  return {
    name, clientWidth, data, handlers, _fullLayout: size ? { _size: size } : {},
    on(event, handler) {
      assert.equal(event, 'plotly_relayout');
      handlers.push(handler);
    },
    emit(event) {
      for (const handler of this.handlers) handler(event);
    },
  };
}

/** plotly.js's global as plot.js reads it: relayout records its calls (by chart name) and, as
 * plotly does, emits the relayout event on the chart. */
function fakePlotly() {
  const calls = [];
  globalThis.window = {
    Plotly: {
      relayout(div, update) {
        calls.push([div.name, update]);
        div.emit(update);
        return Promise.resolve(div);
      },
    },
  };
  return calls;
}

const settle = () => new Promise((resolve) => { setImmediate(resolve); });

describe('xRangeOf', () => {
  test('reads the two ends plotly sets, widened to whole steps', () => {
    assert.deepEqual(xRangeOf({ 'xaxis.range[0]': 10.2, 'xaxis.range[1]': 99.5 }), { start: 10, end: 100 });
    assert.deepEqual(xRangeOf({ 'xaxis.range[0]': 3, 'xaxis.range[1]': 4 }), { start: 3, end: 4 });
  });

  test('reads the range as one pair, and never starts before step 0', () => {
    assert.deepEqual(xRangeOf({ 'xaxis.range': [-5.5, 20.1] }), { start: 0, end: 21 });
    assert.deepEqual(xRangeOf({ 'xaxis.range': [1, 2], 'xaxis.range[0]': 50, 'xaxis.range[1]': 60 }),
      { start: 1, end: 2 });
  });

  test('is null for an autorange, a y-only change, no event or an empty or reversed range', () => {
    for (const event of [undefined, null, {}, { 'xaxis.autorange': true }, { 'yaxis.range[0]': 1, 'yaxis.range[1]': 2 },
      { 'xaxis.range[0]': 5, 'xaxis.range[1]': 5 }, { 'xaxis.range[0]': 9, 'xaxis.range[1]': 2 },
      { 'xaxis.range[0]': '1', 'xaxis.range[1]': '9' }, { 'xaxis.range[0]': 0, 'xaxis.range[1]': NaN },
      { 'xaxis.range[0]': 1 }]) {
      assert.equal(xRangeOf(event), null, JSON.stringify(event));
    }
  });
});

describe('followZoom', () => {
  beforeEach((t) => t.mock.timers.enable({ apis: ['setTimeout'] }));

  test('fetches the last range of a burst of zooms once, 250 ms after it, at twice the width', async (t) => {
    const div = chart({ clientWidth: 700 });
    const fetched = [];
    const applied = [];
    const state = followZoom(div, async (range, maxPoints) => {
      fetched.push([range, maxPoints]);
      return { points: [range.start] };
    }, (range, series) => applied.push([range, series]), assert.fail);
    div.emit({ 'xaxis.range[0]': 0, 'xaxis.range[1]': 50 });
    t.mock.timers.tick(200);
    div.emit({ 'xaxis.range[0]': 10, 'xaxis.range[1]': 40 });
    t.mock.timers.tick(249);
    await settle();
    assert.deepEqual(fetched, []);
    t.mock.timers.tick(1);
    await settle();
    assert.deepEqual(fetched, [[{ start: 10, end: 40 }, 1400]]);
    assert.deepEqual(applied, [[{ start: 10, end: 40 }, { points: [10] }]]);
    assert.deepEqual(state, { fetches: 1, lastRange: { start: 10, end: 40 } });
  });

  test('asks for at least 200 points, 1200 for a chart not laid out yet', async (t) => {
    const sizes = [];
    for (const clientWidth of [50, 0]) {
      const div = chart({ clientWidth });
      followZoom(div, async (_, maxPoints) => sizes.push(maxPoints), () => {}, assert.fail);
      div.emit({ 'xaxis.range': [0, 10] });
    }
    t.mock.timers.tick(250);
    await settle();
    assert.deepEqual(sizes, [200, 1200]);
  });

  test('ignores autoranges and y-only changes', async (t) => {
    const div = chart();
    const state = followZoom(div, async () => assert.fail('fetched'), () => {}, assert.fail);
    div.emit({ 'xaxis.autorange': true });
    div.emit({ 'yaxis.range[0]': 0, 'yaxis.range[1]': 1 });
    t.mock.timers.tick(1000);
    await settle();
    assert.deepEqual(state, { fetches: 0, lastRange: null });
  });

  test('drops an answer a newer zoom overtook', async (t) => {
    const div = chart();
    const answers = [];
    const applied = [];
    followZoom(div, (range) => new Promise((resolve) => { answers.push(() => resolve(range.start)); }),
      (range, series) => applied.push(series), assert.fail);
    div.emit({ 'xaxis.range': [100, 200] });
    t.mock.timers.tick(250);
    div.emit({ 'xaxis.range': [300, 400] });
    t.mock.timers.tick(250);
    await settle();
    answers[1]();
    answers[0]();
    await settle();
    assert.deepEqual(applied, [300]);
  });

  test('hands a failed fetch to onError', async (t) => {
    const div = chart();
    const errors = [];
    const state = followZoom(div, async () => { throw new Error('GET /series → 503'); }, assert.fail,
      (err) => errors.push(err.message));
    div.emit({ 'xaxis.range': [0, 9] });
    t.mock.timers.tick(250);
    await settle();
    assert.deepEqual(errors, ['GET /series → 503']);
    assert.deepEqual(state, { fetches: 0, lastRange: null });
  });
});

describe('linkZoom', () => {
  let calls;
  beforeEach(() => { calls = fakePlotly(); });
  afterEach(() => { delete globalThis.window; });

  test('zooms the other drawn charts to the same steps, once each', () => {
    const [a, b, c, blank] = ['a', 'b', 'c', 'blank'].map((name) => chart({ name, data: name === 'blank' ? null : [] }));
    linkZoom([a, b, c, blank]);
    a.emit({ 'xaxis.range[0]': 10.5, 'xaxis.range[1]': 20 });
    assert.deepEqual(calls, [['b', { 'xaxis.range': [10.5, 20] }], ['c', { 'xaxis.range': [10.5, 20] }]]);
  });

  test('passes a range given as one pair on as it was given', () => {
    const [a, b] = [chart({ name: 'a' }), chart({ name: 'b' })];
    linkZoom([a, b]);
    b.emit({ 'xaxis.range': [3, 7.5] });
    assert.deepEqual(calls, [['a', { 'xaxis.range': [3, 7.5] }]]);
  });

  test('resets the others when one is reset', () => {
    const [a, b] = [chart({ name: 'a' }), chart({ name: 'b' })];
    linkZoom([a, b]);
    a.emit({ 'xaxis.autorange': true });
    b.emit({ 'yaxis.autorange': true });
    assert.deepEqual(calls, [['b', { 'xaxis.autorange': true }]]);
  });

  test('sync zooms or resets every drawn chart', async () => {
    const [a, b] = [chart({ name: 'a' }), chart({ name: 'b' })];
    const linked = linkZoom([a, b]);
    await linked.sync([5, 9]);
    await linked.sync(null);
    assert.deepEqual(calls, [['a', { 'xaxis.range': [5, 9] }], ['b', { 'xaxis.range': [5, 9] }],
      ['a', { 'xaxis.autorange': true }], ['b', { 'xaxis.autorange': true }]]);
  });
});

describe('alignMargins', () => {
  let calls;
  beforeEach(() => { calls = fakePlotly(); });
  afterEach(() => { delete globalThis.window; });

  test('gives every drawn chart the widest left and right margins', async () => {
    const narrow = chart({ name: 'narrow', size: { l: 56, r: 16 } });
    const wide = chart({ name: 'wide', size: { l: 180, r: 16 } });
    const right = chart({ name: 'right', size: { l: 60, r: 30 } });
    const done = chart({ name: 'done', size: { l: 180, r: 30 } });
    const undrawn = chart({ name: 'undrawn' });
    await alignMargins([narrow, wide, right, done, undrawn]);
    const update = { 'margin.l': 180, 'margin.r': 30, 'yaxis.automargin': false };
    assert.deepEqual(calls, [['narrow', update], ['wide', update], ['right', update]]);
  });

  test('leaves charts alone when they line up already, or when fewer than two are drawn', async () => {
    await alignMargins([chart({ size: { l: 80, r: 20 } }), chart({ size: { l: 80, r: 20 } })]);
    await alignMargins([chart({ size: { l: 80, r: 20 } }), chart()]);
    assert.deepEqual(calls, []);
  });
});
