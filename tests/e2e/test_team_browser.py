"""Team mode in a real browser (Debian's headless Chromium) over `ampscope serve --auth
required`: sign-in exchanges a token for an HttpOnly, SameSite=Strict cookie; pages need it; a
page of another origin cannot read the runs socket even though the browser sends it the cookie;
markup in run names stays text; an admin deletes a run after confirming; signing out ends the
session on the server. No console error, no dialog, no CSP violation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Route, ViewportSize

from tests.server.wire import batch, new_id, record
from tests.support.browser import Watched
from tests.support.servers import free_port
from tests.support.team import Team, team_server

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=alert(1)>"
WAIT_MS = 15_000


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    with team_server("sqlite", tmp_path_factory.mktemp("team-browser")) as team:
        yield team


@pytest.fixture
def viewport() -> ViewportSize:
    return {"width": 1400, "height": 900}


def sign_in(session: Watched, team: Team, token: str, path: str = "/") -> None:
    session.page.goto(f"{team.url}{path}")
    assert session.page.url.startswith(f"{team.url}/login?next=")
    session.page.fill("#token", team.tokens[token])
    session.page.click("#sign-in")
    session.page.wait_for_url(f"{team.url}{path}", timeout=WAIT_MS)


@pytest.fixture
def session(watched: Watched) -> Watched:
    """A fresh context (no cookie yet) and its watched page."""
    return watched


def _run(team: Team, name: str, token: str = "alpha-ingest", project: str = "alpha") -> str:
    run_id = new_id()
    with team.client(token) as client:
        response = client.post("/api/ingest", json=batch(
            [record(0), record(1)], run_id=run_id, project=project, name=name,
            tags=[HOSTILE, "team"]))
        assert response.status_code == 200, response.text
    return run_id


def test_sign_in_sets_a_strict_httponly_cookie_and_shows_the_projects_runs(
    team: Team, session: Watched
) -> None:
    mine, theirs = _run(team, HOSTILE), _run(team, "beta run", "beta-ingest", "beta")
    page = session.page
    page.goto(f"{team.url}/login")
    page.fill("#token", team.tokens["alpha-ingest"])
    page.click("#sign-in")
    page.wait_for_selector("#error:not([hidden])", timeout=WAIT_MS)
    assert page.text_content("#error") == (
        "Sign-in failed: an ingest token cannot sign in; use a read or admin token")
    page.fill("#token", "amps_" + "x" * 43)
    page.click("#sign-in")
    page.wait_for_function("() => document.getElementById('error').textContent.includes("
                           "'not valid')", timeout=WAIT_MS)
    # Chromium logs the two refused sign-ins (403, 401) as failed loads: they were the point.
    assert [e.split("(")[0] for e in session.errors] == [
        "console.error: Failed to load resource: the server responded with a status of 403 ",
        "console.error: Failed to load resource: the server responded with a status of 401 "]
    session.errors.clear()

    sign_in(session, team, "alpha-read", f"/runs/{mine}")
    cookies = {c["name"]: c for c in session.context.cookies()}
    cookie = cookies["ampscope_session"]
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert cookie["value"] not in team.tokens.values()
    assert page.evaluate("() => document.cookie") == ""  # not readable by scripts
    page.wait_for_function(f"() => document.getElementById('run-name').textContent === "
                           f"{json.dumps(HOSTILE)}", timeout=WAIT_MS)
    assert page.eval_on_selector_all("img[src='x']", "els => els.length") == 0
    assert "alpha-read · read · project alpha" in (page.text_content("#session") or "")
    assert page.query_selector("#delete-run") is None  # read scope: no delete

    page.goto(f"{team.url}/")
    page.wait_for_selector(f"tr[data-run-id='{mine}']", timeout=WAIT_MS)
    assert page.query_selector(f"tr[data-run-id='{theirs}']") is None
    session.screenshot("team-runs.png")
    session.assert_clean()


def test_a_foreign_origin_cannot_read_the_runs_socket(team: Team, session: Watched) -> None:
    """Another port on 127.0.0.1 is another origin but the same site: the browser sends the
    SameSite=Strict cookie along, so only the server's Origin check stands in the way."""
    _run(team, "socket target")
    sign_in(session, team, "alpha-read")
    foreign = f"http://127.0.0.1:{free_port()}"
    probe = f"""<!doctype html><script>
      window.result = {{}};
      const ws = new WebSocket('ws://127.0.0.1:{team.server.port}/api/runs/live');
      ws.onmessage = (e) => {{ window.result.message = e.data.slice(0, 80); }};
      ws.onclose = (e) => {{ window.result.closed = e.code; }};
      fetch('{team.url}/api/runs', {{credentials: 'include'}})
        .then((r) => r.text()).then((t) => {{ window.result.fetched = t.slice(0, 80); }})
        .catch((e) => {{ window.result.fetchError = String(e); }});
    </script>"""

    def serve(route: Route) -> None:
        route.fulfill(status=200, content_type="text/html", body=probe)

    session.page.route(f"{foreign}/**", serve)
    session.page.goto(f"{foreign}/evil.html")
    session.page.wait_for_function(
        "() => window.result.closed !== undefined && window.result.fetchError !== undefined",
        timeout=WAIT_MS)
    result: dict[str, Any] = session.page.evaluate("() => window.result")
    assert "message" not in result and "fetched" not in result, result
    assert result["closed"] in (1006, 1008)  # refused: the page learns nothing else
    log = team.server.log()
    assert "/api/runs/live" in log


def test_an_admin_deletes_a_run_after_confirming(team: Team, session: Watched) -> None:
    run_id = _run(team, "to be deleted")
    sign_in(session, team, "alpha-admin", f"/runs/{run_id}")
    page = session.page
    page.wait_for_selector("#delete-run", timeout=WAIT_MS)
    page.click("#delete-run")
    assert page.is_visible("#delete-dialog")
    assert run_id in (page.text_content("#delete-dialog") or "")
    page.click("#delete-cancel")
    assert not page.is_visible("#delete-dialog")
    with team.client("root") as root:
        assert root.get(f"/api/runs/{run_id}").status_code == 200
    page.click("#delete-run")
    page.click("#delete-confirm")
    page.wait_for_url(f"{team.url}/", timeout=WAIT_MS)
    with team.client("root") as root:
        assert root.get(f"/api/runs/{run_id}").status_code == 404
    session.assert_clean()


def test_sign_out_ends_the_session_on_the_server(team: Team, session: Watched) -> None:
    sign_in(session, team, "alpha-read")
    cookie = next(c["value"] for c in session.context.cookies()
                  if c["name"] == "ampscope_session")
    page = session.page
    page.wait_for_selector("#sign-out", timeout=WAIT_MS)
    page.click("#sign-out")
    page.wait_for_url(f"{team.url}/login", timeout=WAIT_MS)
    assert all(c["name"] != "ampscope_session" for c in session.context.cookies())
    # The old cookie, replayed by hand, no longer works: the server forgot the session.
    with httpx.Client(base_url=team.url, timeout=30.0) as client:
        response = client.get("/api/runs", headers={"Cookie": f"ampscope_session={cookie}"})
    assert response.status_code == 401
    assert response.json() == {"detail": "the session has expired or was ended; sign in again"}
    page.goto(f"{team.url}/")
    assert page.url.startswith(f"{team.url}/login")
    session.assert_clean()


REDIRECTS = {
    "/%09/evil.example/": "/", "/%0a/evil.example/": "/", "/%0d/evil.example/": "/",
    "/%5Cevil.example/": "/", "/%5C%5Cevil.example/": "/", "%2F%2Fevil.example": "/",
    "/%2F%09evil.example": "/", "javascript:alert(1)": "/", "https://evil.example/": "/",
    "/settings?tab=tokens%23x": "/settings?tab=tokens#x",
}
"""`next` as it appears in the login page's URL -> where the browser must land after sign-in."""


def test_after_sign_in_the_browser_stays_on_the_servers_origin(team: Team,
                                                                session: Watched) -> None:
    """The browser strips TAB, LF and CR from a URL and reads a backslash as a slash, so
    `/%09/host` lands on `//host`: judged by the browser itself, in Chromium."""
    page = session.page
    landed = {}
    for raw in REDIRECTS:
        page.goto(f"{team.url}/login?next={raw}")
        page.fill("#token", team.tokens["alpha-read"])
        with page.expect_navigation(timeout=WAIT_MS):
            page.click("#sign-in")
        page.wait_for_load_state()
        landed[raw] = page.url.removeprefix(team.url)
    assert landed == {raw: expected for raw, expected in REDIRECTS.items()}


def test_notes_and_tags_are_edited_by_an_admin_only(team: Team, session: Watched) -> None:
    """A read session sees the notes and no editor; an admin edits notes and tags (with the
    session's CSRF token), hostile text stays text, and the edit is stored."""
    run_id = _run(team, "annotated")
    notes = f"{HOSTILE}\nlr 3e-4 diverged at step 1200"
    sign_in(session, team, "alpha-admin", f"/runs/{run_id}")
    page = session.page
    page.wait_for_selector("#notes-edit", state="visible", timeout=WAIT_MS)
    page.click("#notes-edit")
    page.fill("#notes-text", notes)
    page.fill("#notes-tags", f" team, {HOSTILE}, diverged ,, team")
    page.click("#notes-save")
    page.wait_for_selector("#notes-view", state="visible", timeout=WAIT_MS)
    assert page.inner_text("#notes-view") == notes
    assert page.locator("#notes-panel img, #run-meta img").count() == 0
    assert page.locator("#run-meta .tag").all_inner_texts() == ["team", HOSTILE, "diverged"]
    with team.client("root") as root:
        stored = root.get(f"/api/runs/{run_id}").json()
    assert (stored["notes"], stored["tags"]) == (notes, ["team", HOSTILE, "diverged"])
    session.screenshot("run-notes.png", full_page=False)
    session.assert_clean()


def test_a_read_session_cannot_edit_notes(team: Team, session: Watched) -> None:
    run_id = _run(team, "read only")
    with team.client("root") as root:
        assert root.patch(f"/api/runs/{run_id}", json={"notes": "kept"}).status_code == 200
    sign_in(session, team, "alpha-read", f"/runs/{run_id}")
    page = session.page
    page.wait_for_selector("#notes-view", state="visible", timeout=WAIT_MS)
    assert page.inner_text("#notes-view") == "kept"
    assert page.locator("#notes-edit").is_hidden()
    session.assert_clean()
