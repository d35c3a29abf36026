// @ts-check
// Number, time and status formatting shared by the pages. Everything returns text or DOM nodes
// built with textContent: user strings never reach innerHTML.

/**
 * Exponent k when x is an exact power of two, else null.
 * @param {number | null | undefined} x
 * @returns {number | null}
 */
export function exactLog2(x) {
  if (typeof x !== 'number' || !(x > 0) || !Number.isFinite(x)) return null;
  const k = Math.log2(x);
  return Number.isInteger(k) ? k : null;
}

/** @type {Readonly<Record<string, string>>} */
const SUPERSCRIPT = { '-': '⁻', 0: '⁰', 1: '¹', 2: '²', 3: '³', 4: '⁴', 5: '⁵', 6: '⁶', 7: '⁷', 8: '⁸', 9: '⁹' };

/**
 * "2¹⁶" in unicode superscripts (plotly draws <sup> with a style attribute, which the CSP blocks).
 * @param {number} base
 * @param {number} k  an integer
 * @returns {string}
 */
export function powerText(base, k) {
  return `${base}${String(k).split('').map((c) => SUPERSCRIPT[c]).join('')}`;
}

/**
 * A loss scale as text: "2¹⁶ (65536)" for powers of two, else a compact number.
 * @param {number | null | undefined} x
 * @returns {string}
 */
export function scaleText(x) {
  if (x === null || x === undefined) return '—';
  const k = exactLog2(x);
  return k === null ? numberText(x) : `${powerText(2, k)} (${numberText(x)})`;
}

/**
 * A loss scale as a node: 2<sup>16</sup>.
 * @param {number | null | undefined} x
 * @returns {HTMLSpanElement}
 */
export function scaleNode(x) {
  const k = exactLog2(x);
  const span = document.createElement('span');
  span.className = 'scale';
  if (k === null) {
    span.textContent = x === null || x === undefined ? '—' : numberText(x);
    return span;
  }
  const sup = document.createElement('sup');
  sup.textContent = String(k);
  span.append('2', sup);
  span.title = numberText(x);
  return span;
}

/**
 * A number as short text: integers whole, others to `digits` significant digits, very large or
 * small ones as "1.23e-5"; NaN, "+inf" and "-inf" spelled out (they are data); "—" for none.
 * @param {number | null | undefined} x
 * @param {number} [digits]
 * @returns {string}
 */
export function numberText(x, digits = 4) {
  if (x === null || x === undefined) return '—';
  if (Number.isNaN(x)) return 'NaN';
  if (x === Infinity) return '+inf';
  if (x === -Infinity) return '-inf';
  if (x === 0) return '0';
  const abs = Math.abs(x);
  if (Number.isInteger(x) && abs < 1e7) return String(x);
  if (abs >= 1e5 || abs < 1e-3) return x.toExponential(2).replace('e+', 'e');
  return String(Number(x.toPrecision(digits)));
}

/**
 * "4 ranks" for a distributed run's world size; "" for a single process (or none known).
 * @param {number | null | undefined} worldSize
 * @returns {string}
 */
export function ranksText(worldSize) {
  return typeof worldSize === 'number' && Number.isInteger(worldSize) && worldSize > 1 ? `${worldSize} ranks` : '';
}

/**
 * `part` of `whole` as "4.2%" (one decimal under 10%, else whole percents); "0%" of nothing.
 * @param {number} part
 * @param {number | null | undefined} whole
 * @returns {string}
 */
export function percentText(part, whole) {
  if (!whole) return '0%';
  const p = (100 * part) / whole;
  return `${p < 10 ? p.toFixed(1) : Math.round(p)}%`;
}

/**
 * Seconds since the epoch or an ISO string → Date (null when unparseable).
 * @param {number | string | null | undefined} value
 * @returns {Date | null}
 */
export function toDate(value) {
  if (value === null || value === undefined) return null;
  const d = typeof value === 'number' ? new Date(value * 1000) : new Date(value);
  return Number.isNaN(d.getTime()) ? null : d;
}

/**
 * "28s ago", "3m ago", "5h ago", else the date; "—" for no time.
 * @param {number | string | null | undefined} value  as toDate's
 * @param {number} [now]  milliseconds since the epoch
 * @returns {string}
 */
export function agoText(value, now = Date.now()) {
  const d = toDate(value);
  if (!d) return '—';
  const s = Math.max(0, Math.round((now - d.getTime()) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return d.toLocaleDateString();
}

/** @type {Readonly<Record<string, string>>} */
const STATUS_LABEL = { active: 'live', finished: 'finished', crashed: 'crashed' };

/**
 * The run status badge.
 * @param {string} status
 * @returns {HTMLSpanElement}
 */
export function statusBadge(status) {
  const badge = document.createElement('span');
  badge.className = `badge badge-${STATUS_LABEL[status] ? status : 'unknown'}`;
  badge.textContent = STATUS_LABEL[status] ?? String(status);
  return badge;
}

/**
 * A new element with a class and text (as textContent).
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {string | null} [className]
 * @param {string | null} [text]
 * @returns {HTMLElementTagNameMap[K]}
 */
export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = text;
  return node;
}
