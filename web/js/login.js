// @ts-check
// The login page: POST the token in a JSON body (never a URL), then go where the user was headed.

/**
 * Only a path on this server (an open redirect otherwise). Judged by the browser's own URL
 * parser, which is what `location.assign` will use: it drops TAB, LF and CR and reads `\\` as
 * `/`, so `/%09/evil.example` decoded is `//evil.example`, another origin, which a check of the
 * raw text misses.
 * @param {string | null} raw  the `next` the address gave
 * @param {string} [origin]
 * @returns {string}
 */
export function safeNext(raw, origin = window.location.origin) {
  if (typeof raw !== 'string' || !raw.startsWith('/')) {
    return '/';
  }
  let url;
  try {
    url = new URL(raw, origin);
  } catch {
    return '/';
  }
  return url.origin === origin ? `${url.pathname}${url.search}${url.hash}` : '/';
}

/** @param {SubmitEvent} event */
async function signIn(event) {
  event.preventDefault();
  const banner = /** @type {HTMLElement} login.html has it */ (document.getElementById('error'));
  const input = /** @type {HTMLInputElement} */ (document.getElementById('token'));
  banner.hidden = true;
  let response;
  try {
    response = await fetch('/api/login', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
      body: JSON.stringify({ token: input.value.trim() }),
      credentials: 'same-origin',
    });
  } catch (err) {
    banner.textContent = `The server is not reachable (${/** @type {Error} */ (err).message}).`;
    banner.hidden = false;
    return;
  }
  if (!response.ok) {
    let detail = response.statusText;
    try {
      detail = /** @type {{detail?: string}} */ (await response.json()).detail ?? detail;
    } catch {
      // not JSON: keep the status text
    }
    banner.textContent = `Sign-in failed: ${detail}`;
    banner.hidden = false;
    return;
  }
  input.value = '';
  window.location.assign(safeNext(new URLSearchParams(window.location.search).get('next')));
}

const form = /** @type {HTMLFormElement} login.html has it */ (document.getElementById('login-form'));
form.addEventListener('submit', signIn);
