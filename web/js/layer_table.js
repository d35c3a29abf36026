// @ts-check
// The layer table: every layer's statistics at the last step that carries them, sortable by each
// (web/js/table_sort.js). Loaded from /layer-stats (one column per statistic at that step), then
// refreshed from live steps at most once a second.

import { el, numberText } from './format.js';
import { columnOf } from './heatmap.js';
import { TableSort } from './table_sort.js';

/** @import { LayerStats, Step } from './codec.js' */
/** @import { SortValue } from './table_sort.js' */

/** How a column's values read: percents, one decimal, exponent, whole. @typedef {'pct' | 'fixed' | 'exp' | 'int'} CellKind */

/** [statistic, header, kind] of each column after the index and the name. @type {ReadonlyArray<readonly [string, string, CellKind]>} */
export const COLUMNS = Object.freeze([
  ['lost_frac', 'zeros+flushed', 'pct'], ['zero_frac', 'zero', 'pct'], ['underflow_frac', 'underflow', 'pct'],
  ['subnormal_frac', 'subnormal', 'pct'], ['headroom_bits', 'headroom bits', 'fixed'],
  ['amax', 'amax', 'exp'], ['amin_nz', 'amin≠0', 'exp'], ['l2', 'l2', 'exp'],
  ['nan_count', 'NaN', 'int'], ['inf_count', 'inf', 'int'],
]);
const REFRESH_MS = 1000;

/**
 * @param {number | null | undefined} value
 * @param {CellKind} kind
 * @returns {string}
 */
function cellText(value, kind) {
  if (value === null || value === undefined) return '—';
  if (!Number.isFinite(value)) return numberText(value);
  if (kind === 'pct') return `${numberText(100 * value, 3)}%`;
  if (kind === 'fixed') return value.toFixed(1);
  if (kind === 'exp') return value === 0 ? '0' : value.toExponential(2);
  return String(value);
}

export class LayerTable {
  /**
   * @param {HTMLTableSectionElement} thead
   * @param {HTMLTableSectionElement} tbody
   * @param {HTMLElement} stepNode  says which step the table shows
   * @param {{layerNames: string[], rawNames?: string[] | null, formatMax: number}} layers
   *   the canonical and the model's names; the format's largest value (heatmap.js columnOf)
   */
  constructor(thead, tbody, stepNode, { layerNames, rawNames, formatMax }) {
    this.tbody = tbody;
    this.stepNode = stepNode;
    this.layerNames = layerNames;
    // The model's own names (wrappers' `module.`, `_orig_mod.` kept), shown on hover where
    // they differ from the canonical name the table lists.
    this.rawNames = rawNames ?? layerNames;
    this.formatMax = formatMax;
    /** @type {number | null} */
    this.step = null;
    /** @type {Record<string, (number | null)[] | null>} stat → [value per layer] */
    this.values = {};
    /** @type {number | null} */
    this.timer = null;
    /** @type {Step | null} */
    this.pendingStep = null;
    const row = el('tr');
    /** @type {(key: string, label: string, first?: string) => HTMLTableCellElement} */
    const th = (key, label, first) => {
      const cell = el('th', key === 'name' ? null : 'num', label);
      cell.dataset.sort = key;
      if (first) cell.dataset.first = first;
      return cell;
    };
    row.append(th('index', '#'), th('name', 'layer'), ...COLUMNS.map(([key, label]) => th(key, label, 'desc')));
    thead.replaceChildren(row);
    this.sort = new TableSort(thead, { key: 'index', direction: 'asc' }, () => this.render());
  }

  /**
   * bodies: stat → /layer-stats answer covering just the last step.
   * @param {number} step
   * @param {Record<string, LayerStats>} bodies
   */
  load(step, bodies) {
    this.step = step;
    for (const [stat, body] of Object.entries(bodies)) {
      this.values[stat] = body.z.map((row) => (row.length ? row[row.length - 1] : null));
    }
    this.render();
  }

  /**
   * Live steps with per-layer stats: the newest is shown, at most once per REFRESH_MS.
   * @param {Step[]} steps
   */
  append(steps) {
    const last = steps[steps.length - 1];
    if (!last || (this.step !== null && last.step <= this.step)) return;
    this.pendingStep = last;
    if (this.timer !== null) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      const step = /** @type {Step} set with this timer */ (this.pendingStep);
      this.pendingStep = null;
      this.step = step.step;
      for (const [stat] of COLUMNS) this.values[stat] = columnOf(step, stat, this.formatMax);
      this.render();
    }, REFRESH_MS);
  }

  /**
   * A row's value of a column: its index, its name or a statistic's value.
   * @param {number} index
   * @param {string} key
   * @returns {SortValue}
   */
  valueOf(index, key) {
    if (key === 'index') return index;
    if (key === 'name') return this.layerNames[index];
    return this.statOf(index, key);
  }

  /**
   * @param {number} index
   * @param {string} stat
   * @returns {number | null}
   */
  statOf(index, stat) {
    const column = this.values[stat];
    return column ? column[index] : null;
  }

  render() {
    this.stepNode.textContent = this.step === null ? 'no layer statistics yet' : `at step ${this.step}`;
    const order = this.sort.sorted(this.layerNames.map((_, i) => i), (i, key) => this.valueOf(i, key));
    const rows = order.map((i) => {
      const tr = el('tr');
      tr.dataset.index = String(i);
      const name = el('td', 'layer-cell', this.layerNames[i]);
      if (this.rawNames[i] !== this.layerNames[i]) name.title = `in the model: ${this.rawNames[i]}`;
      tr.append(el('td', 'num muted', String(i)), name);
      for (const [key, , kind] of COLUMNS) {
        const v = this.statOf(i, key);
        const td = el('td', 'num', cellText(v, kind));
        td.dataset.stat = key;
        if (v !== null && ((key === 'lost_frac' && v >= 0.01) || (key === 'headroom_bits' && v < 2))) td.classList.add('warn');
        if ((key === 'nan_count' || key === 'inf_count') && v !== null && v > 0) td.classList.add('bad');
        tr.append(td);
      }
      return tr;
    });
    this.tbody.replaceChildren(...rows);
  }
}
