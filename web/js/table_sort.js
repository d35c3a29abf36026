// @ts-check
// Sortable table headers: click a <th data-sort="key"> to sort by it, click again to reverse.
// The state is shown with aria-sort (the CSS draws the arrow); empty values always sort last.

/** A row's value in a sort: empty (null, undefined or NaN) ones sort last. @typedef {number | string | null | undefined} SortValue */
/** @typedef {'asc' | 'desc'} SortDirection */

/**
 * Compare two sort values (numbers or strings), nulls/NaN last whatever the direction.
 * @param {SortValue} a
 * @param {SortValue} b
 * @param {SortDirection} direction
 * @returns {number}
 */
export function compareValues(a, b, direction) {
  /**
   * @param {SortValue} v
   * @returns {v is null | undefined}  or NaN, which no type tells apart: only `false` narrows here
   */
  const missing = (v) => v === null || v === undefined || (typeof v === 'number' && Number.isNaN(v));
  if (missing(a) || missing(b)) return Number(missing(a)) - Number(missing(b));
  const order = typeof a === 'string' || typeof b === 'string'
    ? String(a).localeCompare(String(b), undefined, { numeric: true, sensitivity: 'base' })
    : Number(a > b) - Number(a < b);
  return direction === 'desc' ? -order : order;
}

export class TableSort {
  /**
   * @param {HTMLTableSectionElement} thead
   * @param {{key: string, direction: SortDirection}} initial
   * @param {() => void} onChange
   */
  constructor(thead, initial, onChange) {
    this.key = initial.key;
    this.direction = initial.direction;
    this.headers = /** @type {HTMLTableCellElement[]} */ ([...thead.querySelectorAll('th[data-sort]')]);
    for (const th of this.headers) {
      th.tabIndex = 0;
      const activate = () => {
        const key = /** @type {string} the selector's data-sort */ (th.dataset.sort);
        if (key === this.key) this.direction = this.direction === 'asc' ? 'desc' : 'asc';
        else { this.key = key; this.direction = th.dataset.first === 'desc' ? 'desc' : 'asc'; }
        this.render();
        onChange();
      };
      th.addEventListener('click', activate);
      th.addEventListener('keydown', (event) => {
        if (event.key === 'Enter' || event.key === ' ') { event.preventDefault(); activate(); }
      });
    }
    this.render();
  }

  render() {
    for (const th of this.headers) {
      if (th.dataset.sort === this.key) th.setAttribute('aria-sort', this.direction === 'asc' ? 'ascending' : 'descending');
      else th.removeAttribute('aria-sort');
    }
  }

  /**
   * A sorted copy of `rows`, `valueOf(row, key)` giving each row's sort value.
   * @template T
   * @param {T[]} rows
   * @param {(row: T, key: string) => SortValue} valueOf
   * @returns {T[]}
   */
  sorted(rows, valueOf) {
    return [...rows].sort((a, b) => compareValues(valueOf(a, this.key), valueOf(b, this.key), this.direction));
  }
}
