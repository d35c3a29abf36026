// Zoom fetches detail: when the user zooms a chart's x axis, the visible range is asked of
// /series again (start, end, max_points ≈ 2 × the chart's width), debounced, and the chart swaps
// in the finer points for that range. The layouts keep their `uirevision`, so live updates
// leave the zoom alone.

const DEBOUNCE_MS = 250;

/** The x range a plotly_relayout event sets, or null (autorange, y-only changes, ticks). */
export function xRangeOf(event) {
  if (!event) return null;
  let lo = event['xaxis.range[0]'];
  let hi = event['xaxis.range[1]'];
  if (Array.isArray(event['xaxis.range'])) [lo, hi] = event['xaxis.range'];
  if (typeof lo !== 'number' || typeof hi !== 'number' || !(hi > lo)) return null;
  return { start: Math.max(0, Math.floor(lo)), end: Math.ceil(hi) };
}

/**
 * @param {HTMLElement} div  a plotly chart
 * @param {(range: {start: number, end: number}, maxPoints: number) => Promise<object>} fetchRange
 * @param {(range: {start: number, end: number}, series: object) => void} apply
 * @param {(err: Error) => void} onError
 */
export function followZoom(div, fetchRange, apply, onError) {
  let timer = null;
  let request = 0;
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
        onError(err);
      }
    }, DEBOUNCE_MS);
  });
  return state;
}
