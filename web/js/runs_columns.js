// @ts-check
// The runs list's optional columns: any hyperparameter key (`config`, dotted as on the run page)
// of the runs loaded, picked in the "Columns" menu. The choice is kept in the address
// (?columns=a,b: a link shows the same columns) and, for the next visit, in localStorage.
// Keys and values are user text: textContent only.

import { configText, flattenConfig } from './config_table.js';
import { el } from './format.js';

/** @import { Run } from './codec.js' */

const STORAGE_KEY = 'ampscope.runs.columns';
const MAX_KEYS = 300; // keys offered at most (a run's config is capped at ingest, not its keys)

/**
 * The columns the address asks for, else those of the last visit.
 * @returns {string[]}
 */
function initialChoice() {
  const columns = new URLSearchParams(location.search).get('columns');
  if (columns !== null) return columns.split(',').filter(Boolean);
  try {
    /** @type {unknown[]} */
    const stored = JSON.parse(localStorage.getItem(STORAGE_KEY) ?? '[]');
    return stored.filter((k) => typeof k === 'string');
  } catch {
    return [];
  }
}

export class ConfigColumns {
  /**
   * @param {HTMLTableRowElement} headRow  the runs table's header row (columns are appended)
   * @param {HTMLElement} list  where the menu's checkboxes go
   * @param {() => void} onChange  re-render the rows
   */
  constructor(headRow, list, onChange) {
    this.headRow = headRow;
    this.list = list;
    this.onChange = onChange;
    this.chosen = initialChoice();
    this.offered = '';
    this.renderHead();
  }

  /**
   * Offer every key of the runs' configs (the chosen ones stay, even when no run has them).
   * @param {Run[]} runs
   */
  offer(runs) {
    const keys = new Set(this.chosen);
    for (const run of runs) {
      for (const [key] of flattenConfig(run.config)) {
        if (keys.size >= MAX_KEYS) break;
        keys.add(key);
      }
    }
    const sorted = [...keys].sort();
    const signature = sorted.join('\n');
    if (signature === this.offered) return;
    this.offered = signature;
    if (!sorted.length) {
      this.list.replaceChildren(el('p', 'muted', 'No run loaded has hyperparameters (config).'));
      return;
    }
    this.list.replaceChildren(...sorted.map((key) => {
      const label = el('label', 'column-choice');
      const box = el('input');
      box.type = 'checkbox';
      box.value = key;
      box.checked = this.chosen.includes(key);
      box.addEventListener('change', () => this.toggle(key, box.checked));
      label.append(box, el('span', null, key));
      label.title = key;
      return label;
    }));
  }

  /**
   * @param {string} key
   * @param {boolean} on
   */
  toggle(key, on) {
    this.chosen = on ? [...this.chosen.filter((k) => k !== key), key] : this.chosen.filter((k) => k !== key);
    try {
      localStorage.setItem(STORAGE_KEY, JSON.stringify(this.chosen));
    } catch {
      // storage off (private mode): the address still keeps the choice
    }
    const url = new URL(location.href);
    if (this.chosen.length) url.searchParams.set('columns', this.chosen.join(','));
    else url.searchParams.delete('columns');
    history.replaceState(null, '', url);
    this.renderHead();
    this.onChange();
  }

  renderHead() {
    for (const th of this.headRow.querySelectorAll('th.config-col')) th.remove();
    for (const key of this.chosen) {
      const th = el('th', 'config-col', key);
      th.title = `Hyperparameter ${key} (config)`;
      th.dataset.key = key;
      this.headRow.append(th);
    }
  }

  /**
   * The run's cells for the chosen keys ("—" where it has no such key).
   * @param {Run} run
   */
  cells(run) {
    const values = new Map(flattenConfig(run.config));
    return this.chosen.map((key) => {
      const td = el('td', 'config-col');
      td.dataset.key = key;
      if (values.has(key)) {
        td.textContent = configText(values.get(key));
        td.title = td.textContent;
      } else td.append(el('span', 'muted', '—'));
      return td;
    });
  }
}
