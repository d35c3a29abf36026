// @ts-check
// The recipe verdicts of /formats as DOM (#33): could the run train in this recipe, and which
// layers must stay in BF16. The keep-lists are the product's answer, so each kept layer gets a
// line of its own with the number that decided it (formats.js keepReason). The run page lists a
// run's verdicts (formats_view.js), the compare page sets two runs' side by side per recipe
// (compare_formats.js). Text only: layer names are the user's.

import { el } from './format.js';
import { keepReason, verdictHeadline } from './formats.js';

/** @import { RecipeVerdict } from './codec.js' */

/**
 * One verdict: a mark ("fits", or how many layers stay in BF16), its summary, and under a recipe
 * that keeps layers each one ("keep in BF16: layer — operand, stat value vs median …").
 * @param {RecipeVerdict} v
 * @returns {HTMLElement[]}
 */
export function verdictParts(v) {
  const mark = v.keep.length ? el('span', 'verdict-mark verdict-keeps', `${v.keep.length} in BF16`)
    : v.uniform_loss ? el('span', 'verdict-mark verdict-keeps', 'loses everywhere')
      : el('span', 'verdict-mark verdict-fits', 'fits');
  /** @type {HTMLElement[]} */
  const parts = [mark, el('span', 'verdict-summary', v.summary)];
  if (v.keep.length) {
    const keep = el('ul', 'formats-keep');
    for (const k of v.keep) {
      const item = el('li');
      item.dataset.layer = k.layer;
      item.append(el('span', 'keep-label', 'keep in BF16: '), el('span', 'keep-layer', k.layer),
        ` — ${keepReason(k)}`);
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
