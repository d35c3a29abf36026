// @ts-check
// The compare page's Formats panel (#33): two runs (the reference and the run of the pair the
// page shows, e.g. a BF16 run and its FP8 twin) lined up. Per recipe, the two verdicts side by
// side (a summary each, and the layers each keeps in BF16); under them, each run's layer × recipe
// matrix of the chosen operand and statistic, with the same rows and columns (merged by name,
// formats.js mergeNames): a layer or recipe only one run has is "absent" in the other's. Each
// run's latest sampled step. Lazy, as on the run page: fetched once the panel comes near the
// screen; a run's answer is kept while the page is open (a new pair or reference reads only the
// run it has not read).

import * as api from './api.js';
import { el } from './format.js';
import { DEFAULT_OPERAND, OPERANDS, STAT_VIEWS, keptCells, matrixGrid, mergeNames } from './formats.js';
import { drawMatrix, drawMatrixLegend } from './formats_matrix.js';
import { verdictParts } from './formats_verdicts.js';
import { fill, whenNear } from './formats_view.js';

/** @import { Formats } from './codec.js' */
/** @import { Grid } from './formats.js' */
/** @import { MatrixLegend } from './formats_matrix.js' */

const EMPTY = 'No formats samples: this run\'s hook did not send any (ampscope ≥ wire v7 sends them every 100 steps;'
  + ' formats_every=0 turns them off)';

/**
 * @typedef {object} Side  one run's column: its matrix's title, chart and "no samples" note
 * @property {HTMLElement} title
 * @property {PlotDiv} chart
 * @property {HTMLElement} empty
 */

export class CompareFormats {
  /**
   * @param {{panel: HTMLElement, operand: HTMLSelectElement, stat: HTMLSelectElement, note: HTMLElement,
   *   help: HTMLElement, head: HTMLElement, body: HTMLElement, sides: [Side, Side],
   *   legend: MatrixLegend & {node: HTMLElement}}} nodes
   * @param {{runName: (id: string) => string, swatch: (id: string) => HTMLElement}} page
   */
  constructor(nodes, page) {
    this.nodes = nodes;
    this.page = page;
    /** @type {Map<string, Promise<Formats>>} each run's /formats, read once */
    this.answers = new Map();
    /** @type {[string, string] | null} the runs shown, the reference first */
    this.pair = null;
    this.opened = false;
    this.request = 0;
    /** @type {(Grid | null)[]} the matrices drawn, for the tests */
    this.grids = [];
    this.draws = 0; // renders done, for the tests
    fill(nodes.operand, OPERANDS.map((o) => [o, o]));
    nodes.operand.value = DEFAULT_OPERAND;
    fill(nodes.stat, Object.entries(STAT_VIEWS).map(([stat, view]) => [stat, view.label]));
    nodes.stat.value = 'worst';
    for (const select of [nodes.operand, nodes.stat]) {
      select.addEventListener('change', () => { this.render().catch((err) => this.fail(err)); });
    }
    whenNear(nodes.panel, () => {
      this.opened = true;
      this.render().catch((err) => this.fail(err));
    });
  }

  /**
   * The runs to line up (the page's reference and the run of its pair); drawn now when the panel
   * has been opened.
   * @param {string} reference
   * @param {string} run
   */
  show(reference, run) {
    this.pair = [reference, run];
    if (this.opened) this.render().catch((err) => this.fail(err));
  }

  /** @param {Error} err */
  fail(err) {
    this.nodes.note.textContent = `could not load the formats: ${err.message}`;
  }

  /** @param {string} id */
  answer(id) {
    let answer = this.answers.get(id);
    if (!answer) {
      answer = api.getFormats(id);
      answer.catch(() => this.answers.delete(id)); // a failed read is tried again next time
      this.answers.set(id, answer);
    }
    return answer;
  }

  async render() {
    if (!this.pair) return;
    const request = ++this.request;
    const ids = this.pair;
    const bodies = await Promise.all(ids.map((id) => this.answer(id)));
    if (request !== this.request) return;
    const { nodes } = this;
    const operand = nodes.operand.value;
    const stat = nodes.stat.value;
    const matrices = bodies.map((b) => b.matrix);
    const names = matrices.map((m) => (m ? m.layers.map((l) => l.name) : []));
    const recipeLists = matrices.map((m) => (m ? m.recipes : []));
    const rows = mergeNames(names[0], names[1]);
    const recipes = mergeNames(recipeLists[0], recipeLists[1]);
    nodes.help.textContent = `${operand} · ${STAT_VIEWS[stat].help} · outlined: kept in BF16`;
    nodes.note.textContent = ids.map((id, i) => {
      const m = matrices[i];
      return `${this.page.runName(id)}: ${m ? `step ${m.step}` : 'no samples'}`;
    }).join(' · ');
    this.renderVerdicts(ids, bodies, recipes);
    nodes.legend.node.hidden = matrices.every((m) => !m);
    this.grids = [];
    for (const [i, side] of nodes.sides.entries()) {
      const id = ids[i];
      side.title.replaceChildren(this.page.swatch(id), el('span', null, this.page.runName(id)));
      const grid = matrixGrid(bodies[i], operand, stat, { rows, recipes });
      this.grids.push(grid);
      side.empty.textContent = EMPTY;
      side.empty.hidden = grid !== null;
      side.chart.hidden = grid === null; // shown before drawing: plotly must not draw into a hidden div
      if (grid) {
        await drawMatrix(side.chart, grid, stat, `compare-formats-${i}`, keptCells(grid, bodies[i].verdicts));
      }
    }
    drawMatrixLegend(nodes.legend, stat);
    this.draws += 1;
  }

  /**
   * One row per recipe (either run's): each run's verdict side by side, or why it has none.
   * @param {[string, string]} ids
   * @param {Formats[]} bodies
   * @param {string[]} recipes
   */
  renderVerdicts(ids, bodies, recipes) {
    const head = el('tr');
    head.append(el('th', null, 'Recipe'), ...ids.map((id) => {
      const th = el('th');
      th.dataset.runId = id;
      th.append(this.page.swatch(id), el('span', null, this.page.runName(id)));
      return th;
    }));
    this.nodes.head.replaceChildren(head);
    this.nodes.body.replaceChildren(...recipes.map((recipe) => {
      const tr = el('tr');
      tr.dataset.recipe = recipe;
      tr.append(el('td', 'verdict-recipe', recipe), ...bodies.map((body, i) => {
        const td = el('td');
        td.dataset.runId = ids[i];
        const verdict = body.verdicts.find((v) => v.recipe === recipe);
        if (verdict) td.append(...verdictParts(verdict));
        else td.append(el('span', 'muted', body.matrix ? 'not measured in this run' : 'no formats samples'));
        return td;
      }));
      return tr;
    }));
  }
}
