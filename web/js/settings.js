// @ts-check
// The alert settings of one project (/settings?project=P): rules (turn on/off, add, delete),
// destinations (add, delete, send a test alert) and the project's alert history. Managing takes
// an admin token; the history only read access. All user text is rendered as text.

import { getJSON, showError } from './api.js';
import { drawAlerts } from './alerts_table.js';
import { el } from './format.js';
import { send, session } from './session.js';

/** @import { AlertsPage } from './alerts_table.js' */
/** @import { Severity } from './codec.js' */

/**
 * When a rule fires (alert_schemas.py).
 * @typedef {{kind: 'finding', finding_kind: string | null}
 *   | {kind: 'series', metric: 'skip_rate' | 'nonfinite_loss' | 'scale' | 'layer_lost', threshold: number,
 *      window: number}
 *   | {kind: 'state', state: 'crashed' | 'stalled' | 'finished', stall_factor: number, stall_min_s: number}} Condition
 */

/**
 * An alert rule (GET /api/alerts/rules).
 * @typedef {{id: string, name: string, condition: Condition, severity: Severity, cooldown_s: number,
 *   enabled: boolean, builtin: string | null}} Rule
 */

/**
 * Where alerts go (GET /api/alerts/destinations); `target` is the URL with its secret part hidden.
 * @typedef {{id: string, name: string, kind: string, target: string, min_severity: Severity,
 *   signed: boolean}} Destination
 */

const HISTORY_REFRESH_MS = 5000;
const STATES = new Set(['crashed', 'stalled', 'finished']);
/** @param {string} project */
const q = (project) => `project=${encodeURIComponent(project)}`;
/** @param {string} id */
const $ = (id) => /** @type {HTMLElement} settings.html has each one */ (document.getElementById(id));

/**
 * @param {Condition} c
 * @returns {string}
 */
function conditionText(c) {
  if (c.kind === 'finding') return `a finding${c.finding_kind ? ` of kind ${c.finding_kind}` : ''} at this level or above`;
  if (c.kind === 'series') {
    const over = `over the last ${c.window} steps`;
    return {
      skip_rate: `skip rate above ${c.threshold} ${over}`,
      nonfinite_loss: `a non-finite loss ${over}`,
      scale: `loss scale at or below ${c.threshold}`,
      layer_lost: `a layer losing more than ${c.threshold} of its gradient`,
    }[c.metric];
  }
  return c.state === 'stalled'
    ? `run stalled (${c.stall_factor}× its usual interval, at least ${c.stall_min_s} s)`
    : `run ${c.state}`;
}

/**
 * A button that runs `onClick`, disabled meanwhile; a failure goes to the error banner.
 * @param {string} text
 * @param {() => Promise<void>} onClick
 * @param {string} [className]
 */
function button(text, onClick, className = 'button button-small') {
  const b = el('button', className, text);
  b.type = 'button';
  b.addEventListener('click', async () => {
    b.disabled = true;
    try {
      await onClick();
    } catch (err) {
      showError(/** @type {Error} */ (err).message);
    } finally {
      b.disabled = false;
    }
  });
  return b;
}

class Settings {
  /** @param {string} project */
  constructor(project) {
    this.project = project;
  }

  async drawRules() {
    const rules = /** @type {Rule[]} */ (await getJSON(`/api/alerts/rules?${q(this.project)}`));
    const rows = rules.map((rule) => {
      const row = el('tr');
      row.dataset.ruleId = rule.id;
      const on = el('input');
      on.type = 'checkbox';
      on.checked = rule.enabled;
      on.setAttribute('aria-label', `rule ${rule.name} on`);
      on.addEventListener('change', async () => {
        try {
          await send('PATCH', `/api/alerts/rules/${encodeURIComponent(rule.id)}`, { enabled: on.checked });
        } catch (err) {
          on.checked = !on.checked;
          showError(/** @type {Error} */ (err).message);
        }
      });
      const onCell = el('td');
      onCell.append(on);
      const actions = el('td');
      actions.append(button('Delete', async () => {
        await send('DELETE', `/api/alerts/rules/${encodeURIComponent(rule.id)}`);
        await this.drawRules();
      }));
      row.append(onCell, el('td', '', rule.name + (rule.builtin ? ' (default)' : '')),
        el('td', '', conditionText(rule.condition)),
        el('td', `severity severity-${rule.severity}`, rule.severity.toUpperCase()),
        el('td', 'num', `${rule.cooldown_s} s`), actions);
      return row;
    });
    $('rules-body').replaceChildren(...rows);
    $('rules-note').textContent = rules.length
      ? '' : 'none yet: the project gets its default rules with its first run';
  }

  async drawDestinations() {
    const destinations = /** @type {Destination[]} */ (await getJSON(`/api/alerts/destinations?${q(this.project)}`));
    const rows = destinations.map((dest) => {
      const row = el('tr');
      row.dataset.destinationId = dest.id;
      const actions = el('td');
      actions.append(
        button('Send test alert', async () => {
          await send('POST', `/api/alerts/destinations/${encodeURIComponent(dest.id)}/test`);
          await this.drawHistory();
        }),
        button('Delete', async () => {
          await send('DELETE', `/api/alerts/destinations/${encodeURIComponent(dest.id)}`);
          await this.drawDestinations();
        }),
      );
      row.append(el('td', '', dest.name), el('td', '', dest.kind + (dest.signed ? ' (signed)' : '')),
        el('td', '', dest.target), el('td', '', dest.min_severity), actions);
      return row;
    });
    if (!rows.length) {
      const row = el('tr');
      const td = el('td', 'empty', 'No destination: alerts are decided and kept in the history, sent nowhere.');
      td.colSpan = 5;
      row.append(td);
      rows.push(row);
    }
    $('destinations-body').replaceChildren(...rows);
  }

  async drawHistory() {
    const page = /** @type {AlertsPage} */ (await getJSON(`/api/alerts?${q(this.project)}&limit=50`));
    drawAlerts($('history-body'), page.alerts, { withRun: true });
    $('history-note').textContent = page.next_before === null ? '' : 'the 50 newest';
  }

  /** @param {HTMLFormElement} form */
  async addRule(form) {
    const data = new FormData(form);
    const when = /** @type {string} the form's select */ (data.get('when'));
    let condition;
    if (when === 'finding') condition = { kind: 'finding', finding_kind: null };
    else if (STATES.has(when)) condition = { kind: 'state', state: when };
    else {
      condition = { kind: 'series', metric: when, threshold: Number(data.get('threshold')),
        window: Number(data.get('window')) };
    }
    await send('POST', '/api/alerts/rules', {
      project: this.project, name: data.get('name'), condition, severity: data.get('severity'),
      cooldown_s: Number(data.get('cooldown_s')),
    });
    await this.drawRules();
  }

  /** @param {HTMLFormElement} form */
  async addDestination(form) {
    const data = new FormData(form);
    const response = await send('POST', '/api/alerts/destinations', {
      project: this.project, name: data.get('name'), kind: data.get('kind'), url: data.get('url'),
      min_severity: data.get('min_severity'),
    });
    const made = /** @type {{name: string, signing_secret: string | null}} */ (await response.json());
    const url = /** @type {HTMLInputElement} */ (form.elements.namedItem('url'));
    url.value = '';
    const secret = $('secret');
    secret.hidden = !made.signing_secret;
    secret.textContent = made.signing_secret
      ? `Signing secret of “${made.name}” (shown once: the receiver checks X-Ampscope-Signature-256 with it): ${made.signing_secret}`
      : '';
    await this.drawDestinations();
  }
}

/**
 * @param {string} id  a form's
 * @param {(form: HTMLFormElement) => Promise<void>} handler
 */
function onSubmit(id, handler) {
  $(id).addEventListener('submit', async (event) => {
    event.preventDefault();
    showError(null);
    try {
      await handler(/** @type {HTMLFormElement} */ (event.target));
    } catch (err) {
      showError(/** @type {Error} */ (err).message);
    }
  });
}

async function main() {
  const params = new URLSearchParams(window.location.search);
  const who = await session();
  const project = params.get('project') || (who && who.project) || 'default';
  const projectField = /** @type {HTMLInputElement} */ ($('project'));
  projectField.value = project;
  const settings = new Settings(project);
  window.ampscope = { settings };
  onSubmit('project-form', async (form) => {
    window.location.search = `?${q(/** @type {HTMLInputElement} */ (form.elements.namedItem('project')).value)}`;
  });
  onSubmit('rule-form', (form) => settings.addRule(form));
  onSubmit('destination-form', (form) => settings.addDestination(form));
  const results = await Promise.allSettled([settings.drawRules(), settings.drawDestinations(),
    settings.drawHistory()]);
  const failed = results.filter((r) => r.status === 'rejected');
  if (failed.length) {
    const forbidden = failed.some((r) => r.reason.status === 403);
    showError(forbidden ? 'Managing alerts takes an admin token of this project.' : failed[0].reason.message);
  }
  document.body.dataset.ready = 'true';
  setInterval(() => settings.drawHistory().catch(() => null), HISTORY_REFRESH_MS);
}

main();
