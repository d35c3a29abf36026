// @ts-check
// The run page's admin action: delete the run, after a confirmation that names it.
// Shown only to a principal with the admin scope (anyone, on a server without auth), and only
// once the run has loaded (run_loaded.js): an unknown id gets no button.

import { runLoaded } from './run_loaded.js';
import { send, session } from './session.js';

function runId() {
  const parts = window.location.pathname.split('/');
  return decodeURIComponent(parts[parts.length - 1] || '');
}

/**
 * @param {string} id
 * @param {string} text
 * @param {string} className
 */
function makeButton(id, text, className) {
  const button = document.createElement('button');
  button.type = 'button';
  button.className = className;
  button.id = id;
  button.textContent = text;
  return button;
}

/**
 * The delete button and its confirmation dialog.
 * @param {string} id  the run's
 * @returns {[HTMLButtonElement, HTMLDialogElement]}
 */
function build(id) {
  const button = makeButton('delete-run', 'Delete run', 'button button-danger');

  const dialog = document.createElement('dialog');
  dialog.id = 'delete-dialog';
  const text = document.createElement('p');
  text.textContent = `Delete run ${id} and everything stored for it? This cannot be undone; `
    + 'a hook still sending to it will be refused.';
  const error = document.createElement('p');
  error.className = 'dialog-error';
  error.hidden = true;
  const confirmButton = makeButton('delete-confirm', 'Delete', 'button button-danger');
  const cancel = makeButton('delete-cancel', 'Cancel', 'button');
  dialog.append(text, error, confirmButton, cancel);

  button.addEventListener('click', () => dialog.showModal());
  cancel.addEventListener('click', () => dialog.close());
  confirmButton.addEventListener('click', async () => {
    confirmButton.disabled = true;
    try {
      await send('DELETE', `/api/runs/${encodeURIComponent(id)}`);
      window.location.assign('/');
    } catch (err) {
      error.textContent = /** @type {Error} */ (err).message;
      error.hidden = false;
      confirmButton.disabled = false;
    }
  });
  return [button, dialog];
}

async function init() {
  const [who] = await Promise.all([session(), runLoaded]);
  const head = document.querySelector('.run-head');
  if (!who || who.scope !== 'admin' || !head) return;
  head.append(...build(runId()));
}

init();
