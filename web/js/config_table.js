// @ts-check
// A run's hyperparameters (`config`: what watch(config=...) sent, Lightning's hparams, HF's
// args) as a key/value table. Nested mappings become dotted keys ("optimizer.lr"); lists and
// other values are shown as JSON. Keys and values are user text: textContent only.

import { el } from './format.js';

/**
 * [[dotted key, value], ...] of `config`, keys sorted, nested objects flattened.
 * @param {Record<string, unknown> | null | undefined} config
 * @param {string} [prefix]
 * @returns {[string, unknown][]}
 */
export function flattenConfig(config, prefix = '') {
  /** @type {[string, unknown][]} */
  const out = [];
  for (const [key, value] of Object.entries(config ?? {})) {
    const name = prefix ? `${prefix}.${key}` : key;
    if (value !== null && typeof value === 'object' && !Array.isArray(value) && Object.keys(value).length) {
      out.push(...flattenConfig(/** @type {Record<string, unknown>} */ (value), name));
    } else out.push([name, value]);
  }
  return prefix ? out : out.sort((a, b) => (a[0] < b[0] ? -1 : (a[0] > b[0] ? 1 : 0)));
}

/**
 * A config value as text: strings as they are, everything else as JSON.
 * @param {unknown} value
 * @returns {string}
 */
export function configText(value) {
  return typeof value === 'string' ? value : JSON.stringify(value);
}

/**
 * Fill `body` (a <tbody>) with `config`'s rows; `note` says how many, or why there are none.
 * @param {HTMLElement} body
 * @param {HTMLElement} note
 * @param {Record<string, unknown> | null | undefined} config
 * @returns {number}  how many rows
 */
export function renderConfig(body, note, config) {
  const rows = flattenConfig(config);
  note.textContent = rows.length
    ? `${rows.length} ${rows.length === 1 ? 'key' : 'keys'}`
    : 'none sent: ampscope.watch(..., config={...}) records them (Lightning and the HF Trainer do it for you)';
  body.replaceChildren(...rows.map(([key, value]) => {
    const tr = el('tr');
    tr.dataset.key = key;
    const k = el('td', 'config-key', key);
    k.title = key;
    tr.append(k, el('td', 'config-value', configText(value)));
    return tr;
  }));
  return rows.length;
}
