// The login page: POST the token in a JSON body (never a URL), then go where the user was headed.

/** Only a path on this server: never `//evil.example` or `https://…` (an open redirect). */
export function safeNext(raw) {
  if (typeof raw !== 'string' || !raw.startsWith('/') || raw.startsWith('//') || raw.includes('\\')) {
    return '/';
  }
  return raw;
}

async function signIn(event) {
  event.preventDefault();
  const banner = document.getElementById('error');
  const input = document.getElementById('token');
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
    banner.textContent = `The server is not reachable (${err.message}).`;
    banner.hidden = false;
    return;
  }
  if (!response.ok) {
    let detail = response.statusText;
    try {
      detail = (await response.json()).detail ?? detail;
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

document.getElementById('login-form').addEventListener('submit', signIn);
