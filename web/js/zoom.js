// @ts-check
// Zoom fetches detail: when the user zooms a chart's x axis, the visible range is asked of
// /series again (start, end, max_points ≈ 2 × the chart's width), debounced, and the chart swaps
// in the finer points for that range. The layouts keep their `uirevision`, so live updates
// leave the zoom alone.

import { Plotly } from './plot.js';

const DEBOUNCE_MS = 250;

/** A zoomed x range in whole steps. @typedef {{start: number, end: number}} StepRange */

/**
 * The x range a plotly_relayout event sets, or null (autorange, y-only changes, ticks).
 * @param {PlotRelayoutEvent | null} event
 * @returns {StepRange | null}
 */
export function xRangeOf(event) {
  if (!event) return null;
  let lo = event['xaxis.range[0]'];
  let hi = event['xaxis.range[1]'];
  if (Array.isArray(event['xaxis.range'])) [lo, hi] = event['xaxis.range'];
  if (typeof lo !== 'number' || typeof hi !== 'number' || !(hi > lo)) return null;
  return { start: Math.max(0, Math.floor(lo)), end: Math.ceil(hi) };
}

/**
 * @template T
 * @param {PlotDiv} div  a plotly chart
 * @param {(range: StepRange, maxPoints: number) => Promise<T>} fetchRange
 * @param {(range: StepRange, series: T) => void} apply
 * @param {(err: Error) => void} onError
 * @returns {{fetches: number, lastRange: StepRange | null}}  what it did (the browser tests read it)
 */
export function followZoom(div, fetchRange, apply, onError) {
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let timer;
  let request = 0;
  /** @type {{fetches: number, lastRange: StepRange | null}} */
  const state = { fetches: 0, lastRange: null };
  div.on('plotly_relayout', (event) => {
    const range = xRangeOf(event);
    if (!range) return;
    clearTimeout(timer);
    timer = setTimeout(async () => {
      const mine = ++request;
      const maxPoints = Math.max(200, Math.round(2 * (div.clientWidth || 600)));
      try {
        const series = await fetchRange(range, maxPoints);
        if (mine !== request) return; // a newer zoom is on its way
        apply(range, series);
        state.fetches += 1;
        state.lastRange = range;
      } catch (err) {
        onError(/** @type {Error} */ (err));
      }
    }, DEBOUNCE_MS);
  });
  return state;
}

/**
 * One step axis for several charts: zooming (or resetting) the x axis of any of them zooms the
 * others to the same steps. Each chart's own followZoom then fetches its detail. A chart being
 * synchronised ignores the relayout event it emits, so the group never loops.
 * @param {PlotDiv[]} divs  plotly charts whose x axis is the step number
 * @returns {{sync: (range: number[] | null) => Promise<void>}}
 */
export function linkZoom(divs) {
  /** @type {Set<PlotDiv>} */
  const syncing = new Set();
  /** @type {(source: PlotDiv | null, update: PlotUpdate) => Promise<void>} */
  const apply = async (source, update) => {
    await Promise.all(divs.filter((d) => d !== source && d.data).map(async (d) => {
      syncing.add(d);
      try {
        await Plotly.relayout(d, update);
      } finally {
        syncing.delete(d);
      }
    }));
  };
  for (const div of divs) {
    div.on('plotly_relayout', (event) => {
      if (syncing.has(div) || !event) return;
      const range = xRangeOf(event);
      if (range) {
        // xRangeOf found the ends: as two keys, else as the one pair.
        const lo = event['xaxis.range[0]'] ?? /** @type {unknown[]} */ (event['xaxis.range'])[0];
        const hi = event['xaxis.range[1]'] ?? /** @type {unknown[]} */ (event['xaxis.range'])[1];
        apply(div, { 'xaxis.range': [lo, hi] });
      } else if (event['xaxis.autorange'] === true) {
        apply(div, { 'xaxis.autorange': true });
      }
    });
  }
  return { sync: (range) => apply(null, range ? { 'xaxis.range': range } : { 'xaxis.autorange': true }) };
}

/**
 * Line the plot areas of step charts up with each other (same left and right margins), so a
 * step is at the same x on every chart: plotly's automargin sizes each chart's margins to its
 * own tick labels (the heatmap's layer names are far wider than a loss axis's numbers).
 * @param {PlotDiv[]} divs
 * @returns {Promise<void>}
 */
export async function alignMargins(divs) {
  const drawn = divs.flatMap((div) => (div._fullLayout && div._fullLayout._size
    ? [{ div, size: div._fullLayout._size }] : []));
  if (drawn.length < 2) return;
  const left = Math.max(...drawn.map((d) => d.size.l));
  const right = Math.max(...drawn.map((d) => d.size.r));
  await Promise.all(drawn.map(({ div, size }) => {
    if (size.l === left && size.r === right) return null;
    return Plotly.relayout(div, { 'margin.l': left, 'margin.r': right, 'yaxis.automargin': false });
  }));
}
