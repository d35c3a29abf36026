// @ts-check
// The run page's Formats section (#33, "Beyond FP16"): could this run train in FP8, MXFP8 or
// NVFP4, and which layers must stay in BF16? GET /api/runs/{id}/formats gives one sampled step's
// layer × operand × recipe statistics and each recipe's verdict; the section shows the verdicts
// first (the keep-lists are the answer), then the layer × recipe matrix of one operand and
// statistic, and a cell's trend over the run on a click (/formats/trend). Lazy: nothing is
// fetched until the section comes near the screen (or its link in the section bar is followed).
// Live: fetched again while steps arrive (at most every REFETCH_MS) unless the user picked a step.

import * as api from './api.js';
import { el } from './format.js';
import { DEFAULT_OPERAND, OPERANDS, STAT_VIEWS, keptCells, matrixGrid, trainedLines } from './formats.js';
import { clickedCell, drawMatrix, drawMatrixLegend } from './formats_matrix.js';
import { FormatTrendCharts } from './formats_trend.js';
import { verdictNodes } from './formats_verdicts.js';

/** @import { Formats } from './codec.js' */
/** @import { Grid } from './formats.js' */
/** @import { MatrixLegend } from './formats_matrix.js' */

const REFETCH_MS = 30000; // samples come every formats_every steps (100): no need to ask often
const NEAR_PX = 400; // fetch once the section is this close to the screen

/**
 * Call `open` once, when `node` first comes within NEAR_PX of the screen.
 * @param {HTMLElement} node
 * @param {() => void} open
 */
export function whenNear(node, open) {
  const observer = new IntersectionObserver((entries) => {
    if (!entries.some((e) => e.isIntersecting)) return;
    observer.disconnect();
    open();
  }, { rootMargin: `${NEAR_PX}px 0px` });
  observer.observe(node);
}

/**
 * Options of a select: [value, label] pairs.
 * @param {HTMLSelectElement} select
 * @param {[string, string][]} options
 */
export function fill(select, options) {
  select.replaceChildren(...options.map(([value, label]) => {
    const option = el('option', null, label);
    option.value = value;
    return option;
  }));
}

export class FormatsView {
  /**
   * @param {string} runId
   * @param {{panel: HTMLElement, body: HTMLElement, empty: HTMLElement, note: HTMLElement,
   *   operand: HTMLSelectElement, stat: HTMLSelectElement, step: HTMLSelectElement, help: HTMLElement,
   *   verdicts: HTMLElement, matrix: PlotDiv, legend: MatrixLegend & {node: HTMLElement},
   *   trend: HTMLElement, trendNote: HTMLElement, trendStats: PlotDiv, trendOperand: PlotDiv,
   *   trendScales: PlotDiv, trendScalesNone: HTMLElement}} nodes
   */
  constructor(runId, nodes) {
    this.runId = runId;
    this.nodes = nodes;
    /** @type {Formats | null} the answer shown */
    this.body = null;
    /** @type {Grid | null} the matrix drawn */
    this.grid = null;
    /** @type {{layer: number, name: string, recipe: string} | null} the cell whose trend is shown */
    this.picked = null;
    this.opened = false;
    this.pinned = false; // the user chose a step: live updates leave it
    this.request = 0;
    this.trendRequest = 0;
    this.loads = 0; // answers of /formats shown, for the tests
    this.lastFetch = -Infinity;
    /** @type {number | null} */
    this.timer = null;
    this.trendCharts = new FormatTrendCharts(nodes.trendStats, nodes.trendOperand, nodes.trendScales,
      nodes.trendScalesNone, runId);
    fill(nodes.operand, OPERANDS.map((o) => [o, o]));
    nodes.operand.value = DEFAULT_OPERAND;
    fill(nodes.stat, Object.entries(STAT_VIEWS).map(([stat, view]) => [stat, view.label]));
    nodes.stat.value = 'worst';
    nodes.operand.addEventListener('change', () => {
      this.draw().catch((err) => this.fail(err));
      this.showTrend().catch((err) => this.fail(err)); // the picked cell, for this operand
    });
    nodes.stat.addEventListener('change', () => { this.draw().catch((err) => this.fail(err)); });
    nodes.step.addEventListener('change', () => {
      this.pinned = true;
      this.load(Number(nodes.step.value)).catch((err) => this.fail(err));
    });
    this.clicks = false; // the matrix's click handler is on (plotly gives its div `on` once drawn)
  }

  get operand() { return this.nodes.operand.value; }

  get stat() { return this.nodes.stat.value; }

  /** Fetch once the section comes near the screen. */
  observe() {
    whenNear(this.nodes.panel, () => this.open());
  }

  open() {
    if (this.opened) return;
    this.opened = true;
    this.load().catch((err) => this.fail(err));
  }

  /** @param {Error} err */
  fail(err) {
    this.nodes.note.textContent = `could not load the formats: ${err.message}`;
  }

  /**
   * Show sampled step `step` (null: the newest).
   * @param {number | null} [step]
   */
  async load(step = null) {
    const request = ++this.request;
    this.lastFetch = performance.now();
    const body = await api.getFormats(this.runId, step);
    if (request !== this.request) return; // a newer choice is on its way
    this.body = body;
    const { nodes } = this;
    const m = body.matrix;
    nodes.empty.hidden = m !== null;
    nodes.body.hidden = m === null;
    nodes.legend.node.hidden = m === null;
    fill(nodes.step, body.steps.slice().reverse().map((s) => [String(s.step), `step ${s.step}`]));
    nodes.step.disabled = body.steps.length < 2;
    nodes.verdicts.replaceChildren(...(m ? verdictNodes(body.verdicts) : []),
      ...(m ? trainedLines(m, body.operand_names).map((line) => el('p', 'formats-trained', line))
        : []));
    if (!m) {
      nodes.note.textContent = '';
      this.loads += 1;
      return;
    }
    nodes.step.value = String(m.step);
    const every = body.downsampled ? `${body.steps.length} of ${body.sampled} sampled steps listed`
      : `${body.sampled} sampled step${body.sampled === 1 ? '' : 's'}`;
    nodes.note.textContent = `step ${m.step} · ${m.layers.length} layers × ${m.recipes.length} recipes · ${every}`
      + ' · verdicts over the last 3 samples';
    await this.draw();
    this.trendCharts.markStep(m.step);
    this.loads += 1;
  }

  /** The matrix of the chosen operand and statistic (from the answer held: nothing is fetched). */
  async draw() {
    if (!this.body || !this.body.matrix) return;
    const stat = this.stat;
    this.nodes.help.textContent = `${this.operand} · ${STAT_VIEWS[stat].help} · outlined: kept in BF16 · click a cell for its trend`;
    this.grid = matrixGrid(this.body, this.operand, stat);
    if (!this.grid) return;
    await drawMatrix(this.nodes.matrix, this.grid, stat, `formats-${this.runId}`,
      keptCells(this.grid, this.body.verdicts));
    drawMatrixLegend(this.nodes.legend, stat);
    if (!this.clicks) {
      this.clicks = true;
      this.nodes.matrix.on('plotly_click', (event) => this.onClick(event));
    }
  }

  /** @param {PlotClickEvent | undefined} event */
  onClick(event) {
    const cell = clickedCell(event);
    if (!cell || !this.grid) return;
    const [row, column] = cell;
    const layer = this.grid.indices[row];
    if (layer === null || layer === undefined) return;
    this.picked = { layer, name: this.grid.rows[row], recipe: this.grid.recipes[column] };
    this.showTrend().catch((err) => this.fail(err));
  }

  /** The picked cell's trend for the operand chosen now (nothing picked: nothing). */
  async showTrend() {
    const picked = this.picked;
    if (!picked) return;
    const request = ++this.trendRequest;
    const operand = this.operand;
    const trend = await api.getFormatTrend(this.runId, { layer: picked.layer, operand, recipe: picked.recipe });
    if (request !== this.trendRequest) return;
    this.nodes.trend.hidden = false; // before drawing: plotly must not draw into a hidden div
    const over = trend.downsampled ? `${trend.steps.length} of ${trend.sampled} sampled steps`
      : `${trend.steps.length} sampled step${trend.steps.length === 1 ? '' : 's'}`;
    this.nodes.trendNote.textContent = `${picked.name} · ${operand} · ${picked.recipe} · over ${over}`;
    await this.trendCharts.show(trend, this.body && this.body.matrix ? this.body.matrix.step : null);
  }

  /** Steps arrived: fetch again (throttled) once opened, unless the user pinned a step. */
  stepsArrived() {
    if (!this.opened || this.pinned || this.timer !== null) return;
    const wait = Math.max(0, this.lastFetch + REFETCH_MS - performance.now());
    this.timer = setTimeout(() => {
      this.timer = null;
      this.load().catch((err) => this.fail(err));
    }, wait);
  }
}
