// @ts-check
// A layer × recipe matrix of one operand and statistic (formats.js's Grid) as a plotly heatmap:
// rows the layers in table order (the first on top), columns the recipes, each cell coloured by
// the statistic and labelled with its value, its hover all five numbers. A cell the hook did not
// measure (NaN) is a gap in that trace, drawn by a second one in a colour of its own and labelled
// "not measured", never as 0; a layer or recipe a compared run lacks, by a third: "absent". The
// run page and the compare page draw theirs with it (formats_view.js, compare_formats.js). No <b>
// in the hovers: plotly draws it with a style attribute, which the CSP blocks.

import { FORMAT_COLORS } from './colors.js';
import { numberText } from './format.js';
import {
  STAT_VIEWS, WORST_CAP, WORST_FLOOR, colourRange, colourValue, hoverText, keepReason, statText,
} from './formats.js';
import { uniqueNames } from './heatmap.js';
import { CONFIG, DARK, Plotly, THEME, plotText, themedLayout } from './plot.js';

/** @import { Keep } from './codec.js' */
/** @import { Cell, Grid } from './formats.js' */

export const COLORS = DARK ? FORMAT_COLORS.dark : FORMAT_COLORS.light;
const ROW_PX = 26;
const TEXT_ROWS = 80; // past this many layers a cell is too short for its label: hover only
/** The trace of each kind of cell, by index (a click's curveNumber). */
export const TRACE = Object.freeze({ measured: 0, nan: 1, absent: 2 });

/** The legend's elements (HTML: plotly's colorbar sets style attributes, which the CSP blocks).
 * @typedef {{bar: HTMLElement, min: HTMLElement, max: HTMLElement, notMeasured: HTMLElement,
 *   absent?: HTMLElement}} MatrixLegend */

/**
 * The matrix's height for `rows` layers.
 * @param {number} rows
 */
export function matrixHeight(rows) {
  return Math.max(200, Math.min(1600, 90 + ROW_PX * rows));
}

/**
 * Draw `grid` coloured by `stat` (a STAT_VIEWS key) into `div`; the cells of `kept` (formats.js
 * keptCells: a layer a verdict keeps in BF16 under that recipe) are outlined and say so.
 * @param {PlotDiv} div
 * @param {Grid} grid
 * @param {string} stat
 * @param {string} uirevision  the chart's (plotly keeps the user's zoom across redraws)
 * @param {[number, number, Keep][]} [kept]
 */
export async function drawMatrix(div, grid, stat, uirevision, kept = []) {
  const x = grid.recipes.map(plotText);
  const y = uniqueNames(grid.rows);
  const labels = grid.rows.length <= TEXT_ROWS;
  /** @type {Map<string, Keep>} */
  const keeps = new Map(kept.map(([row, column, k]) => [`${row},${column}`, k]));
  /** @type {(keep: (c: Cell) => boolean, text: (c: Cell) => string) => string[][]} */
  const texts = (keep, text) => grid.cells.map((row, r) => row.map((c, j) => {
    if (!labels || !keep(c)) return '';
    return keeps.has(`${r},${j}`) ? `${text(c)} · BF16` : text(c);
  }));
  const hover = grid.cells.map((row, r) => row.map((c, j) => {
    const k = keeps.get(`${r},${j}`);
    const why = k ? `<br>KEEP IN BF16: ${plotText(keepReason(k))}` : '';
    return `${c.stats ? hoverText(c.stats) : ''}${why}`;
  }));
  /** @type {(state: Cell['state']) => (number | null)[][]} 1 where a cell is in this state, else a gap */
  const where = (state) => grid.cells.map((row) => row.map((c) => (c.state === state ? 1 : null)));
  // A fixed text size: plotly would shrink every label of a trace to fit its longest one.
  const common = { type: 'heatmap', x, y, showscale: false, hoverongaps: false, xgap: 2, ygap: 2, texttemplate: '%{text}',
    textfont: { size: 11 } };
  /** @type {(color: string) => [number, string][]} */
  const flat = (color) => [[0, color], [1, color]];
  const [zmin, zmax] = colourRange(stat);
  const traces = [
    { ...common, z: grid.cells.map((row) => row.map((c) => (c.state === 'measured' ? colourValue(stat, c.value) : null))),
      zmin, zmax, zauto: false, colorscale: STAT_VIEWS[stat].kind === 'worst' ? COLORS.worst : COLORS.fraction,
      text: texts((c) => c.state === 'measured', (c) => statText(stat, c.value)), customdata: hover,
      hovertemplate: '%{y} · %{x}<br>%{customdata}<extra></extra>' },
    { ...common, z: where('nan'), zmin: 0, zmax: 1, colorscale: flat(COLORS.notMeasured),
      text: texts((c) => c.state === 'nan', () => 'not measured'), customdata: hover,
      hovertemplate: '%{y} · %{x}<br>not measured<br>%{customdata}<extra></extra>' },
    { ...common, z: where('absent'), zmin: 0, zmax: 1, colorscale: flat(COLORS.absent),
      text: texts((c) => c.state === 'absent', () => 'absent'),
      hovertemplate: '%{y} · %{x}<br>absent: this run has no such layer or recipe<extra></extra>' },
  ];
  const height = matrixHeight(grid.rows.length);
  const shapes = kept.map(([row, column]) => ({
    type: 'rect', xref: 'x', yref: 'y', x0: column - 0.5, x1: column + 0.5, y0: row - 0.5, y1: row + 0.5,
    line: { color: THEME.text, width: 2.5 },
  }));
  const layout = themedLayout(uirevision, {
    height, showlegend: false, margin: { l: 8, r: 8, t: 32, b: 8 }, shapes,
    plot_bgcolor: THEME.gap,
    xaxis: { title: { text: '' }, type: 'category', side: 'top', showgrid: false, ticks: '', fixedrange: true },
    yaxis: { type: 'category', autorange: 'reversed', showgrid: false, ticks: '', automargin: true },
  });
  div.style.height = `${height}px`; // responsive plots fill their div: size the div
  await Plotly.react(div, traces, layout, CONFIG);
}

/**
 * The colour legend of `stat`, and the "not measured" (and "absent") swatches.
 * @param {MatrixLegend} legend
 * @param {string} stat
 */
export function drawMatrixLegend(legend, stat) {
  const worst = STAT_VIEWS[stat].kind === 'worst';
  const stops = (worst ? COLORS.worst : COLORS.fraction).map(([at, color]) => `${color} ${(100 * at).toFixed(2)}%`);
  legend.bar.style.background = `linear-gradient(to right, ${stops.join(', ')})`;
  legend.min.textContent = worst ? `≤${numberText(WORST_FLOOR)}×` : '0%';
  legend.max.textContent = worst ? `≥${WORST_CAP}×` : '100%';
  legend.notMeasured.style.background = COLORS.notMeasured;
  if (legend.absent) legend.absent.style.background = COLORS.absent;
}

/**
 * The cell a click on the matrix hit, as [row, column], or null.
 * @param {PlotClickEvent | undefined} event
 * @returns {[number, number] | null}
 */
export function clickedCell(event) {
  const point = event && event.points && event.points[0];
  if (!point || !Array.isArray(point.pointNumber)) return null;
  const [row, column] = point.pointNumber;
  return [row, column];
}
