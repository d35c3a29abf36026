// @ts-check
// Keyboard shortcuts, on every page that includes this: `/` focuses the page's filter (the
// runs list's), `?` shows or hides the list of shortcuts, Escape hides it. Keys typed into a
// field are the field's.

import { el } from './format.js';

const SHORTCUTS = [
  ['/', 'filter the runs (runs list)'],
  ['?', 'show or hide this list'],
  ['Esc', 'close it'],
];

/** @param {EventTarget | null} target */
function typing(target) {
  return target instanceof HTMLElement
    && (target.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(target.tagName));
}

function panel() {
  let node = document.getElementById('shortcuts');
  if (node) return node;
  node = el('div', 'shortcuts-panel');
  node.id = 'shortcuts';
  node.setAttribute('role', 'dialog');
  node.setAttribute('aria-label', 'Keyboard shortcuts');
  node.hidden = true;
  const list = el('dl');
  for (const [key, what] of SHORTCUTS) list.append(el('dt', null, key), el('dd', null, what));
  node.append(el('strong', null, 'Keyboard shortcuts'), list);
  document.body.append(node);
  return node;
}

document.addEventListener('keydown', (event) => {
  if (event.ctrlKey || event.metaKey || event.altKey) return;
  if (event.key === 'Escape') {
    const node = document.getElementById('shortcuts');
    if (node) node.hidden = true;
    return;
  }
  if (typing(event.target)) return;
  if (event.key === '/') {
    const filter = document.getElementById('filter');
    if (filter instanceof HTMLInputElement) {
      event.preventDefault();
      filter.focus();
      filter.select();
    }
  } else if (event.key === '?') {
    const node = panel();
    node.hidden = !node.hidden;
  }
});
