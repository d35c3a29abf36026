// @ts-check
// The recipe verdicts of /formats as DOM (#33): could the run train in this recipe, and which
// layers must stay in BF16. The keep-lists are the product's answer, so each kept layer gets a
// line of its own with the number that decided it (formats.js keepReason). The run page lists a
// run's verdicts (formats_view.js), the compare page sets two runs' side by side per recipe
// (compare_formats.js). Text only: layer names are the user's.

import { el } from './format.js';
import { keepReason, normReason, verdictHeadline } from './formats.js';

/** @import { RecipeVerdict } from './codec.js' */

/**
 * One verdict: a mark ("fits", or how many layers stay in BF16), its summary, and under a recipe
 * that keeps layers each one ("keep in BF16: layer — operand, stat value vs median …"), then each
 * norm's affine weight a fully quantised run keeps ("if quantised, keep in BF16: norm — …").
 * @param {RecipeVerdict} v
 * @returns {HTMLElement[]}
 */
export function verdictParts(v) {
  const mark = v.keep.length ? el('span', 'verdict-mark verdict-keeps', `${v.keep.length} in BF16`)
    : v.uniform_loss ? el('span', 'verdict-mark verdict-keeps', 'loses everywhere')
      : el('span', 'verdict-mark verdict-fits', 'fits');
  /** @type {HTMLElement[]} */
  const parts = [mark, el('span', 'verdict-summary', v.summary)];
  if (v.keep.length || v.norms.length) {
    const keep = el('ul', 'formats-keep');
    const line = (/** @type {string} */ label, /** @type {string} */ layer, /** @type {string} */ why) => {
      const item = el('li');
      item.dataset.layer = layer;
      item.append(el('span', 'keep-label', label), el('span', 'keep-layer', layer), ` — ${why}`);
      return item;
    };
    for (const k of v.keep) keep.append(line('keep in BF16: ', k.layer, keepReason(k)));
    for (const k of v.norms) {
      const item = line('if quantised, keep in BF16: ', k.layer, normReason(k));
      item.classList.add('keep-norm');
      keep.append(item);
    }
    parts.push(keep);
  }
  return parts;
}

/**
 * A run's verdicts: the headline (which recipes fit as they are, which need BF16 layers), then
 * one line per recipe.
 * @param {RecipeVerdict[]} verdicts
 * @returns {HTMLElement[]}
 */
export function verdictNodes(verdicts) {
  const headline = el('p', 'formats-headline', verdictHeadline(verdicts));
  const list = el('ul', 'formats-verdicts');
  for (const v of verdicts) {
    const li = el('li', 'formats-verdict');
    li.dataset.recipe = v.recipe;
    li.append(...verdictParts(v));
    list.append(li);
  }
  return [headline, list];
}
