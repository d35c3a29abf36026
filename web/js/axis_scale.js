// @ts-check
// Log/linear toggles for a chart's y axis, and the loss scale's floor on a log axis.
//
// A log axis cannot draw 0: a scale that collapsed to 0 (an exploding run backs off until the
// float underflows) would leave the chart blank from there on, skip markers included. Such
// points are drawn on the axis floor (one power below the smallest positive value) and their
// hover says "0".

import { Plotly } from './plot.js';

/**
 * The y a log axis draws `v` at: itself when positive and finite, `floor` when exactly 0, else
 * null (a gap).
 * @param {unknown} v
 * @param {number} floor
 */
export function onLogAxis(v, floor) {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) return null;
  return v === 0 ? floor : v;
}

/**
 * One power of `base` below the smallest positive value `ticks` has seen (1/base when none).
 * @param {{lo: number, base: number}} ticks  a LogTicks
 */
export function logFloor(ticks) {
  if (!(ticks.lo < Infinity)) return 1 / ticks.base;
  return ticks.base ** (Math.floor(Math.log(ticks.lo) / Math.log(ticks.base) + 1e-9) - 1);
}

/**
 * A "log / linear" button pair that switches `divs`' y axes. `ticks(div)` gives the LogTicks of
 * a chart (its power labels on a log axis) or null. `onChange(log)` hears every switch.
 * @param {HTMLElement} group  holds two buttons with data-scale="log" and data-scale="linear"
 * @param {() => PlotDiv[]} divs
 * @param {(div: PlotDiv) => ({attributes: () => object} | null)} ticks
 * @param {(log: boolean) => void} [onChange]
 * @returns {{set: (log: boolean) => Promise<void>, show: (log: boolean) => void}}
 */
export function axisToggle(group, divs, ticks, onChange = () => {}) {
  const buttons = /** @type {HTMLButtonElement[]} */ ([...group.querySelectorAll('button[data-scale]')]);
  /** @param {boolean} log */
  const show = (log) => {
    for (const b of buttons) b.setAttribute('aria-pressed', String((b.dataset.scale === 'log') === log));
  };
  /** @param {boolean} log */
  const set = async (log) => {
    show(log);
    await Promise.all(divs().filter((d) => d.data).map((d) => {
      const t = ticks(d);
      const attrs = log && t ? t.attributes() : { tickmode: 'auto', tickvals: null, ticktext: null };
      /** @type {PlotUpdate} */
      const update = { 'yaxis.type': log ? 'log' : 'linear', 'yaxis.autorange': true };
      for (const [k, v] of Object.entries(attrs)) update[`yaxis.${k}`] = v;
      return Plotly.relayout(d, update);
    }));
    onChange(log);
  };
  for (const b of buttons) b.addEventListener('click', () => { set(b.dataset.scale === 'log'); });
  return { set, show };
}
