// @ts-check
// Grouping the runs list: by project, by tag (a run with several tags is in each of their
// groups), or by a hyperparameter (config key, dotted as on the run page). The choice is kept
// in the address (?group=project | tag | config:KEY). Group labels are user text: textContent.

import { configText, flattenConfig } from './config_table.js';
import { el } from './format.js';

/** @import { Run } from './codec.js' */

const NONE = '(none)';

/**
 * The group keys a run belongs to under `by` ('' : no grouping).
 * @param {Run} run
 * @param {string} by  'project', 'tag', 'config:KEY' or ''
 * @returns {string[]}
 */
function keysOf(run, by) {
  if (by === 'project') return [run.project ?? NONE];
  if (by === 'tag') return run.tags && run.tags.length ? run.tags : [NONE];
  if (by.startsWith('config:')) {
    const values = new Map(flattenConfig(run.config));
    const key = by.slice('config:'.length);
    return [values.has(key) ? configText(values.get(key)) : NONE];
  }
  return [''];
}

/**
 * [{label, runs}] in first-seen order of the (already sorted) runs; "(none)" last.
 * @param {Run[]} runs
 * @param {string} by
 * @returns {{label: string, runs: Run[]}[]}
 */
export function groupRuns(runs, by) {
  /** @type {Map<string, Run[]>} */
  const groups = new Map();
  for (const run of runs) {
    for (const key of keysOf(run, by)) {
      let members = groups.get(key);
      if (!members) {
        members = [];
        groups.set(key, members);
      }
      members.push(run);
    }
  }
  const out = [...groups].map(([label, members]) => ({ label, runs: members }));
  return [...out.filter((g) => g.label !== NONE), ...out.filter((g) => g.label === NONE)];
}

export class RunGroups {
  /**
   * @param {HTMLSelectElement} select  the "Group by" menu
   * @param {() => void} onChange  re-render
   */
  constructor(select, onChange) {
    this.select = select;
    this.by = new URLSearchParams(location.search).get('group') ?? '';
    this.offered = '';
    select.addEventListener('change', () => {
      this.by = select.value;
      const url = new URL(location.href);
      if (this.by) url.searchParams.set('group', this.by);
      else url.searchParams.delete('group');
      history.replaceState(null, '', url);
      onChange();
    });
  }

  /**
   * The menu's options: none, project, tag, and each config key of the runs loaded.
   * @param {Run[]} runs
   */
  offer(runs) {
    /** @type {Set<string>} */
    const keys = new Set();
    for (const run of runs) for (const [key] of flattenConfig(run.config)) keys.add(key);
    if (this.by.startsWith('config:')) keys.add(this.by.slice('config:'.length));
    const sorted = [...keys].sort();
    const signature = sorted.join('\n');
    if (signature === this.offered) return;
    this.offered = signature;
    /** @type {(value: string, text: string) => HTMLOptionElement} */
    const option = (value, text) => {
      const node = el('option', null, text);
      node.value = value;
      return node;
    };
    this.select.replaceChildren(option('', 'no grouping'), option('project', 'project'), option('tag', 'tag'),
      ...sorted.map((key) => option(`config:${key}`, `config: ${key}`)));
    this.select.value = this.by;
  }

  /**
   * The table rows: `rowOf(run)` for each run, under a header row per group when grouping.
   * @param {Run[]} runs
   * @param {(run: Run) => HTMLTableRowElement} rowOf
   * @param {number} columns  the table's, for a header row's span
   * @returns {HTMLTableRowElement[]}
   */
  rows(runs, rowOf, columns) {
    if (!this.by) return runs.map(rowOf);
    /** @type {HTMLTableRowElement[]} */
    const out = [];
    for (const group of groupRuns(runs, this.by)) {
      const head = el('tr', 'group-head');
      head.dataset.group = group.label;
      const cell = el('td');
      cell.colSpan = columns;
      cell.append(el('span', 'group-label', group.label),
        el('span', 'muted', ` · ${group.runs.length} run${group.runs.length === 1 ? '' : 's'}`));
      head.append(cell);
      out.push(head, ...group.runs.map(rowOf));
    }
    return out;
  }
}
