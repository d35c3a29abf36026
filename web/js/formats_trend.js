// @ts-check
// One (layer, operand, recipe) of the Formats matrix over the run (GET /formats/trend): the five
// statistics on one chart (log axis; an exact 0, no loss at all, sits on its floor and says "0%"
// in the hover, as the loss scale's zeros do), and the operand's own amax (log, left) and
// kurtosis (right) on a second, smaller one: the outliers' trend that block scales answer to;
// below them, where the recipe's block scales sit, as a heatmap of their exponents per step
// (wire v8; formats.js scaleGrid). NaN (not measured at that step) is a gap. A dotted line marks
// the step the matrix shows.

import { logFloor, onLogAxis } from './axis_scale.js';
import { PALETTE } from './colors.js';
import { numberText } from './format.js';
import { percent, scaleGrid, snrDb } from './formats.js';
import { CONFIG, DARK, LogTicks, Plotly, THEME, finiteOrNull, themedLayout } from './plot.js';

/** @import { FormatTrend } from './codec.js' */

/** The statistics drawn, their names and colours. */
const LINES = Object.freeze([
  ['underflow_frac', 'underflow', PALETTE[0]], ['saturated_frac', 'saturated', PALETTE[1]],
  ['rel_rmse', 'rel. error', PALETTE[2]], ['scale_min_frac', 'scale at least', PALETTE[3]],
  ['scale_max_frac', 'scale at greatest', PALETTE[4]],
]);

/**
 * A statistic's value as its hover text.
 * @param {string} stat
 * @param {number | null} v
 */
function valueText(stat, v) {
  if (v === null || Number.isNaN(v)) return 'not measured';
  if (stat !== 'rel_rmse') return percent(v);
  const snr = snrDb(v);
  return `${numberText(v, 3)}${Number.isNaN(snr) ? '' : ` (SNR ${numberText(snr, 3)} dB)`}`;
}

const MARGIN = Object.freeze({ l: 64, r: 64, t: 28, b: 40 });

/** Where the blocks are: a share of them, from none (the background) to all. */
const SHARE_SCALE = DARK ? [[0, '#1c2128'], [0.001, '#1e3a5f'], [1, '#93c5fd']]
  : [[0, '#f8fafc'], [0.001, '#dbeafe'], [1, '#1d4ed8']];

/**
 * A log axis' ticks from `floor` (where an exact 0 is drawn, labelled "0") to `hi`, one per
 * decade, labelled as percents: every statistic drawn is a share (the error, of the operand's RMS).
 * @param {number} floor  a power of 10 (axis_scale.js logFloor)
 * @param {number} hi  the largest value (-Infinity: none)
 */
export function shareTicks(floor, hi) {
  const low = Math.round(Math.log10(floor));
  const high = Math.max(low + 1, Math.ceil(Math.log10(Number.isFinite(hi) ? hi : floor) - 1e-9));
  /** @type {number[]} */
  const tickvals = [];
  // The floor itself (where the zeros are drawn), then each decade as its literal: 10 ** -4 is not 1e-4.
  for (let k = low; k <= high; k += 1) tickvals.push(k === low ? floor : Number(`1e${k}`));
  const ticktext = tickvals.map((v, i) => (i === 0 ? '0' : percent(v)));
  return { tickmode: 'array', tickvals, ticktext };
}

/**
 * The step axis all three charts share, so that a step sits at the same x in each: from the
 * first step to the last, widened by half the mean spacing on each side, where the heatmap's
 * first and last columns end (one step: ±0.5, a column one step wide).
 * @param {number[]} steps  ascending
 * @returns {[number, number] | null}  null: no steps (plotly's autorange)
 */
export function stepRange(steps) {
  if (!steps.length) return null;
  const first = steps[0];
  const last = steps[steps.length - 1];
  const half = steps.length > 1 && last > first ? (last - first) / (steps.length - 1) / 2 : 0.5;
  return [first - half, last + half];
}

/**
 * The step axis of a chart: `stepRange` when there are steps.
 * @param {number[]} steps
 */
function stepAxis(steps) {
  const range = stepRange(steps);
  return { title: { text: 'step', standoff: 6 }, ...(range ? { range, autorange: false } : {}) };
}

/**
 * The matrix's step as a dotted vertical line (none: null).
 * @param {number | null} step
 */
function stepMark(step) {
  return step === null ? [] : [{ type: 'line', xref: 'x', yref: 'paper', x0: step, x1: step, y0: 0, y1: 1,
    line: { color: THEME.axis, width: 1.5, dash: 'dot' } }];
}

export class FormatTrendCharts {
  /**
   * @param {PlotDiv} statsDiv
   * @param {PlotDiv} operandDiv
   * @param {PlotDiv} scalesDiv
   * @param {HTMLElement} scalesNote  says when the steps carry no exponents
   * @param {string} runId
   */
  constructor(statsDiv, operandDiv, scalesDiv, scalesNote, runId) {
    this.statsDiv = statsDiv;
    this.operandDiv = operandDiv;
    this.scalesDiv = scalesDiv;
    this.scalesNote = scalesNote;
    this.runId = runId;
    /** @type {FormatTrend | null} the trend shown */
    this.trend = null;
  }

  /**
   * Draw `trend`, with the matrix's step marked.
   * @param {FormatTrend} trend
   * @param {number | null} step
   */
  async show(trend, step) {
    this.trend = trend;
    const x = trend.steps;
    const ticks = new LogTicks('yaxis', 10);
    for (const [stat] of LINES) ticks.widen(trend.values[stat] ?? []);
    const floor = logFloor(ticks);
    const stats = LINES.map(([stat, name, color]) => {
      const values = trend.values[stat] ?? [];
      return {
        x, y: values.map((v) => onLogAxis(v, floor)), type: 'scatter', mode: 'lines+markers', name, meta: stat,
        line: { color, width: 2 }, marker: { color, size: 6 }, connectgaps: false,
        customdata: values.map((v) => valueText(stat, v)), hovertemplate: `${name} %{customdata}<extra></extra>`,
      };
    });
    await Plotly.react(this.statsDiv, stats, themedLayout(`formats-trend-${this.runId}`, {
      height: 260, hovermode: 'x unified', shapes: stepMark(step), margin: MARGIN,
      xaxis: stepAxis(x), // the sampled steps', not the run's span
      yaxis: { type: 'log', title: { text: 'share of the operand', standoff: 6 },
        ...shareTicks(floor, ticks.hi) },
    }), CONFIG);
    const amax = trend.operand_values.amax ?? [];
    const kurtosis = trend.operand_values.kurtosis ?? [];
    const amaxTicks = new LogTicks('yaxis', 10).widen(amax);
    const operand = [
      { x, y: amax.map((v) => (typeof v === 'number' && v > 0 ? finiteOrNull(v) : null)), type: 'scatter',
        mode: 'lines+markers', name: `${trend.operand} amax`, meta: 'amax', line: { color: PALETTE[5], width: 2 },
        customdata: amax.map((v) => numberText(v)), hovertemplate: 'amax %{customdata}<extra></extra>' },
      { x, y: kurtosis.map(finiteOrNull), type: 'scatter', mode: 'lines+markers', yaxis: 'y2',
        name: 'kurtosis (right)', meta: 'kurtosis', line: { color: PALETTE[6], width: 2, dash: 'dash' },
        customdata: kurtosis.map((v) => numberText(v, 3)),
        hovertemplate: 'kurtosis %{customdata} (3: Gaussian)<extra></extra>' },
    ];
    await Plotly.react(this.operandDiv, operand, themedLayout(`formats-operand-${this.runId}`, {
      height: 260, hovermode: 'x unified', shapes: stepMark(step), margin: MARGIN,
      xaxis: stepAxis(x),
      yaxis: { type: 'log', title: { text: 'amax', standoff: 6 }, ...amaxTicks.attributes() },
      // tickmode auto: an overlaying axis' ticks otherwise follow the left one's (41.824, 40.824…)
      yaxis2: { overlaying: 'y', side: 'right', title: { text: 'kurtosis', standoff: 6 }, showgrid: false,
        tickmode: 'auto',
        zeroline: false, automargin: true, gridcolor: THEME.grid, linecolor: THEME.axis },
    }), CONFIG);
    await this.showScales(trend, step);
  }

  /**
   * The block scales' exponents per step; none sent (a hook before wire v8): a note instead.
   * @param {FormatTrend} trend
   * @param {number | null} step
   */
  async showScales(trend, step) {
    const grid = scaleGrid(trend.steps, trend.scales ?? []);
    this.scalesNote.hidden = grid.y.length > 0;
    this.scalesDiv.hidden = grid.y.length === 0;
    if (!grid.y.length) return; // hidden: the next cell with exponents redraws it whole
    const trace = { type: 'heatmap', x: trend.steps, y: grid.y, z: grid.z, text: grid.text,
      zmin: 0, zmax: 1, zauto: false, colorscale: SHARE_SCALE, showscale: false, xgap: 1, hoverongaps: false,
      hovertemplate: '%{text}<extra></extra>' };
    await Plotly.react(this.scalesDiv, [trace], themedLayout(`formats-scales-${this.runId}`, {
      height: Math.min(420, 120 + 12 * grid.y.length), shapes: stepMark(step), margin: MARGIN,
      xaxis: stepAxis(trend.steps),
      yaxis: { title: { text: `${trend.recipe} block scale, log2`, standoff: 6 }, dtick: 2 },
    }), CONFIG);
  }

  /**
   * Move the dotted line to the matrix's new step.
   * @param {number | null} step
   */
  markStep(step) {
    for (const div of [this.statsDiv, this.operandDiv, this.scalesDiv]) {
      if (div.data) Plotly.relayout(div, { shapes: stepMark(step) });
    }
  }
}
