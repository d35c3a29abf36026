// @ts-check
// The run's notes and tags, and, for a principal who may edit them (admin; anyone on a server
// without auth), an editor: PATCH /api/runs/{id}. Notes and tags are user text: textContent
// and form values only. The run comes from run.js (run_loaded.js).

import { el } from './format.js';
import { runLoaded } from './run_loaded.js';
import { send, session } from './session.js';

/** @import { RunDetail } from './codec.js' */

const MAX_NOTES = 4000; // the server's cap (schemas.MAX_NOTES)
/** @param {string} id */
const $ = (id) => /** @type {HTMLElement} run.html has each one */ (document.getElementById(id));
/** @param {string} id  a field of the notes form */
const field = (id) => /** @type {HTMLInputElement | HTMLTextAreaElement} */ ($(id));

/**
 * Tags typed as "a, b, c": trimmed, empty ones dropped, each once, in order.
 * @param {string} text
 * @returns {string[]}
 */
export function parseTags(text) {
  return [...new Set(text.split(',').map((t) => t.trim()).filter(Boolean))];
}

class RunNotes {
  /**
   * @param {RunDetail} run  its notes and tags follow the edits
   * @param {boolean} editable
   */
  constructor(run, editable) {
    this.run = run;
    this.editable = editable;
    $('notes-edit').hidden = !editable;
    $('notes-edit').addEventListener('click', () => this.edit(true));
    $('notes-cancel').addEventListener('click', () => this.edit(false));
    $('notes-form').addEventListener('submit', (event) => {
      event.preventDefault();
      this.save();
    });
    field('notes-text').maxLength = MAX_NOTES;
    this.render();
  }

  render() {
    const notes = this.run.notes ?? '';
    const shown = $('notes-view');
    shown.textContent = notes;
    shown.hidden = notes === '';
    $('notes-empty').hidden = notes !== '';
    $('notes-empty').textContent = this.editable ? 'No notes yet: “Edit” to write some.' : 'No notes.';
    // The header's tag chips follow the edit.
    const meta = $('run-meta');
    for (const chip of meta.querySelectorAll('.tag')) chip.remove();
    meta.append(...(this.run.tags ?? []).map((tag) => el('span', 'tag', tag)));
  }

  /** @param {boolean} on  show the editor, or the notes */
  edit(on) {
    $('notes-form').hidden = !on;
    $('notes-edit').hidden = on || !this.editable;
    $('notes-error').hidden = true;
    if (on) {
      field('notes-text').value = this.run.notes ?? '';
      field('notes-tags').value = (this.run.tags ?? []).join(', ');
      field('notes-text').focus();
    }
  }

  async save() {
    const button = /** @type {HTMLButtonElement} */ ($('notes-save'));
    button.disabled = true;
    try {
      const body = { notes: field('notes-text').value, tags: parseTags(field('notes-tags').value) };
      const response = await send('PATCH', `/api/runs/${encodeURIComponent(this.run.id)}`, body);
      const saved = /** @type {{notes: string, tags: string[]}} the run as saved */ (await response.json());
      this.run.notes = saved.notes;
      this.run.tags = saved.tags;
      this.render();
      this.edit(false);
    } catch (err) {
      $('notes-error').textContent = /** @type {Error} */ (err).message;
      $('notes-error').hidden = false;
    } finally {
      button.disabled = false;
    }
  }
}

async function main() {
  const [run, who] = await Promise.all([runLoaded, session()]);
  // No session answer: a server without auth, where everyone acts as an admin.
  const editable = !who || !who.auth || who.scope === 'admin';
  window.ampscopeNotes = new RunNotes(run, editable); // for the browser tests
}

main();
