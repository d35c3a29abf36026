// @ts-check
// Who is signed in, a sign-out button, and state-changing requests with the session's CSRF token.
// Every page includes this; with auth off (a loopback server) it shows nothing.

/**
 * Who the requests act as (GET /api/session).
 * @typedef {object} Session
 * @property {string} name
 * @property {string} scope  'read', 'ingest' or 'admin'
 * @property {string | null} project  null: every project
 * @property {string} via  how the credential came: 'cookie' for a signed-in browser
 * @property {string | null} csrf  the token a state-changing request carries
 * @property {boolean} auth  false: a server without authentication
 */

/** @type {Promise<Session | null> | null} */
let current = null;

/**
 * GET /api/session once: {name, scope, project, via, csrf, auth}; null when unanswered.
 * @returns {Promise<Session | null>}
 */
export async function session() {
  if (current === null) {
    current = fetch('/api/session', { headers: { Accept: 'application/json' } })
      .then((response) => (response.ok ? response.json() : null))
      .catch(() => null);
  }
  return current;
}

/** A state-changing request (POST, PATCH, DELETE) carrying the CSRF token and, when given, a
 * JSON body; throws with the server's detail.
 * @param {string} method
 * @param {string} path
 * @param {unknown} [body]
 * @returns {Promise<Response>} */
export async function send(method, path, body = undefined) {
  const who = await session();
  /** @type {Record<string, string>} */
  const headers = { Accept: 'application/json' };
  if (who && who.csrf) headers['X-CSRF-Token'] = who.csrf;
  /** @type {RequestInit} */
  const init = { method, headers, credentials: 'same-origin' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) {
    let detail = response.statusText;
    try {
      detail = /** @type {{detail?: string}} */ (await response.json()).detail ?? detail;
    } catch {
      // not JSON: keep the status text
    }
    throw new Error(`${method} ${path} → ${response.status}: ${detail}`);
  }
  return response;
}

async function showSession() {
  const who = await session();
  const bar = document.querySelector('header.topbar');
  if (!bar || !who || !who.auth) return;
  const slot = document.createElement('span');
  slot.className = 'session';
  slot.id = 'session';
  bar.append(slot);
  const label = document.createElement('span');
  label.className = 'session-name';
  const where = who.project === null ? 'all projects' : `project ${who.project}`;
  label.textContent = `${who.name} · ${who.scope} · ${where}`;
  slot.append(label);
  if (who.via === 'cookie') {
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'button';
    button.id = 'sign-out';
    button.textContent = 'Sign out';
    button.addEventListener('click', async () => {
      await send('POST', '/api/logout').catch(() => null);
      window.location.assign('/login');
    });
    slot.append(button);
  }
}

showSession();
