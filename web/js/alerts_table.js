// @ts-check
// An alert history table (GET /api/runs/{id}/alerts or /api/alerts?project=P): newest first,
// each alert's level, event, title, steps and where it was delivered. Text only: titles quote
// run and layer names.

import { toDate } from './format.js';

/** @import { Severity } from './codec.js' */

/**
 * A delivery of an alert to one destination.
 * @typedef {{destination: string, status: 'pending' | 'delivered' | 'failed', attempts: number,
 *   last_error: string | null}} Delivery
 */

/**
 * An alert of the history (GET /api/alerts, /api/runs/{id}/alerts).
 * @typedef {object} Alert
 * @property {number} id
 * @property {'fired' | 'recovered' | 'test'} event
 * @property {Severity} severity
 * @property {string | null} run_id
 * @property {string} title
 * @property {number | null} step_start
 * @property {number | null} step_end
 * @property {number} created_at  seconds since the epoch
 * @property {Delivery[]} deliveries
 */

/** A page of alerts, newest first. @typedef {{alerts: Alert[], next_before: number | null}} AlertsPage */

/** @type {Readonly<Record<string, string>>} */
const EVENTS = { fired: 'alert', recovered: 'recovered', test: 'test' };
/** @param {number} seconds */
const utc = (seconds) => /** @type {Date} a number always makes one */ (toDate(seconds))
  .toISOString().slice(0, 19).replace('T', ' ');

/**
 * @param {HTMLTableRowElement} row
 * @param {string} text
 * @param {string} [className]
 */
function cell(row, text, className = '') {
  const td = document.createElement('td');
  td.textContent = text;
  if (className) td.className = className;
  row.append(td);
  return td;
}

/** @param {Alert} alert */
function delivered(alert) {
  if (!alert.deliveries.length) return 'no destination';
  return alert.deliveries.map((d) => {
    const tries = d.attempts === 1 ? '' : ` after ${d.attempts} attempts`;
    if (d.status === 'delivered') return `${d.destination}: delivered${tries}`;
    const why = d.last_error ? ` (${d.last_error})` : '';
    return `${d.destination}: ${d.status}${why}`;
  }).join('; ');
}

/**
 * Fill `body` (a tbody) with `alerts`, or one row saying there are none.
 * @param {HTMLElement} body
 * @param {Alert[]} alerts
 * @param {{withRun?: boolean}} [options]  withRun: a column linking each alert's run
 */
export function drawAlerts(body, alerts, { withRun = false } = {}) {
  const rows = alerts.map((alert) => {
    const row = document.createElement('tr');
    row.dataset.alertId = String(alert.id);
    cell(row, utc(alert.created_at));
    cell(row, alert.severity.toUpperCase(), `severity severity-${alert.severity}`);
    cell(row, EVENTS[alert.event] ?? alert.event);
    if (withRun) {
      const td = cell(row, '');
      if (alert.run_id) {
        const link = document.createElement('a');
        link.href = `/runs/${encodeURIComponent(alert.run_id)}`;
        link.textContent = alert.run_id.slice(0, 8);
        td.append(link);
      }
    }
    cell(row, alert.title, 'alert-title');
    cell(row, alert.step_start === null ? '' : alert.step_start === alert.step_end
      ? String(alert.step_start) : `${alert.step_start}–${alert.step_end}`, 'num');
    cell(row, delivered(alert), 'alert-delivery');
    return row;
  });
  if (!rows.length) {
    const row = document.createElement('tr');
    const td = cell(row, 'No alert yet.', 'empty');
    td.colSpan = withRun ? 7 : 6;
    rows.push(row);
  }
  body.replaceChildren(...rows);
}
