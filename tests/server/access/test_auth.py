"""Team mode (`auth="required"`, the app in process behind its gate): every route of the app,
enumerated, denies without credentials, checks the scope and hides other projects' runs
(DESIGN.md §7). How `ampscope serve` runs in team mode (uvicorn, the proxy header, slow
clients): test_serving."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from fastapi.routing import APIRoute, APIWebSocketRoute, iter_route_contexts
from starlette.routing import Mount
from starlette.testclient import TestClient

from ampscope_server.access import tokens
from ampscope_server.access.principal import Scope
from ampscope_server.api.app import create_app
from ampscope_server.config import Settings
from ampscope_server.store import db
from tests.server.wire import batch, new_id, record
from tests.support.app import BASE_URL, WS_BASE_URL, TeamApp, team_app
from tests.support.databases import migrated_database


class Needs(enum.Enum):
    PUBLIC = "public"  # no credentials needed
    ANYONE = "anyone"  # any valid credentials, whatever the scope
    READ = "read"
    INGEST = "ingest"
    ADMIN = "admin"


# Every route of the app: (method, path) → (what it needs, a concrete URL for the test, with
# RUN standing for a run of project alpha). A new route fails `test_the_table_is_every_route`.
ROUTES: dict[tuple[str, str], tuple[Needs, str]] = {
    ("GET", "/api/health"): (Needs.PUBLIC, "/api/health"),
    ("GET", "/login"): (Needs.PUBLIC, "/login"),
    ("POST", "/api/login"): (Needs.PUBLIC, "/api/login"),
    ("GET", "/static/vendor/plotly.min.js"): (Needs.PUBLIC, "/static/vendor/plotly.min.js"),
    ("GET", "/static/vendor/swagger-ui/{name}"): (
        Needs.PUBLIC, "/static/vendor/swagger-ui/swagger-ui.css"),
    ("MOUNT", "/static"): (Needs.PUBLIC, "/static/js/api.js"),
    ("POST", "/api/logout"): (Needs.ANYONE, "/api/logout"),
    ("GET", "/api/session"): (Needs.ANYONE, "/api/session"),
    ("GET", "/openapi.json"): (Needs.ANYONE, "/openapi.json"),
    ("GET", "/api/runs"): (Needs.READ, "/api/runs"),
    ("GET", "/api/runs/{run_id}"): (Needs.READ, "/api/runs/RUN"),
    ("GET", "/api/runs/{run_id}/layers"): (Needs.READ, "/api/runs/RUN/layers"),
    ("GET", "/api/runs/{run_id}/steps"): (Needs.READ, "/api/runs/RUN/steps"),
    ("GET", "/api/runs/{run_id}/ranks"): (Needs.READ, "/api/runs/RUN/ranks"),
    ("GET", "/api/runs/{run_id}/export"): (Needs.READ, "/api/runs/RUN/export"),
    ("GET", "/api/runs/{run_id}/series/{name}"): (Needs.READ, "/api/runs/RUN/series/loss"),
    ("GET", "/api/runs/{run_id}/events"): (Needs.READ, "/api/runs/RUN/events"),
    ("GET", "/api/runs/{run_id}/skip-rate"): (Needs.READ, "/api/runs/RUN/skip-rate"),
    ("GET", "/api/runs/{run_id}/optimizers"): (Needs.READ, "/api/runs/RUN/optimizers"),
    ("GET", "/api/runs/{run_id}/layer-stats"): (
        Needs.READ, "/api/runs/RUN/layer-stats?stat=amax"),
    ("GET", "/api/runs/{run_id}/formats"): (Needs.READ, "/api/runs/RUN/formats"),
    ("GET", "/api/runs/{run_id}/formats/trend"): (
        Needs.READ, "/api/runs/RUN/formats/trend?layer=0&operand=input&recipe=mxfp8"),
    ("GET", "/api/runs/{run_id}/findings"): (Needs.READ, "/api/runs/RUN/findings"),
    ("GET", "/api/runs/{run_id}/histogram"): (Needs.READ, "/api/runs/RUN/histogram"),
    ("GET", "/api/compare"): (Needs.READ, "/api/compare?runs=RUN,RUN2"),
    ("GET", "/"): (Needs.READ, "/"),
    ("GET", "/runs/{run_id}"): (Needs.READ, "/runs/RUN"),
    ("GET", "/compare"): (Needs.READ, "/compare"),
    ("GET", "/settings"): (Needs.READ, "/settings"),
    ("GET", "/docs"): (Needs.READ, "/docs"),
    ("DELETE", "/api/runs/{run_id}"): (Needs.ADMIN, "/api/runs/RUN"),
    ("PATCH", "/api/runs/{run_id}"): (Needs.ADMIN, "/api/runs/RUN"),
    ("POST", "/api/ingest"): (Needs.INGEST, "/api/ingest"),
    ("GET", "/api/tokens"): (Needs.ADMIN, "/api/tokens"),
    ("POST", "/api/tokens"): (Needs.ADMIN, "/api/tokens"),
    ("DELETE", "/api/tokens/{token_id}"): (Needs.ADMIN, "/api/tokens/TOKEN"),
    ("GET", "/api/alerts/rules"): (Needs.ADMIN, "/api/alerts/rules"),
    ("POST", "/api/alerts/rules"): (Needs.ADMIN, "/api/alerts/rules"),
    ("PATCH", "/api/alerts/rules/{rule_id}"): (Needs.ADMIN, "/api/alerts/rules/RULE"),
    ("DELETE", "/api/alerts/rules/{rule_id}"): (Needs.ADMIN, "/api/alerts/rules/RULE"),
    ("GET", "/api/alerts/destinations"): (Needs.ADMIN, "/api/alerts/destinations"),
    ("POST", "/api/alerts/destinations"): (Needs.ADMIN, "/api/alerts/destinations"),
    ("DELETE", "/api/alerts/destinations/{destination_id}"): (
        Needs.ADMIN, "/api/alerts/destinations/DEST"),
    ("POST", "/api/alerts/destinations/{destination_id}/test"): (
        Needs.ADMIN, "/api/alerts/destinations/DEST/test"),
    ("GET", "/api/alerts"): (Needs.READ, "/api/alerts"),
    ("GET", "/api/runs/{run_id}/alerts"): (Needs.READ, "/api/runs/RUN/alerts"),
    ("WS", "/api/runs/{run_id}/live"): (Needs.READ, "/api/runs/RUN/live"),
    ("WS", "/api/runs/live"): (Needs.READ, "/api/runs/live"),
}
# The run's data routes (the run page itself is the same static shell for any id).
RUN_ROUTES = [key for key, (_, url) in ROUTES.items()
              if url.startswith("/api/") and "RUN" in url and key[0] not in ("DELETE", "PATCH")]


def app_routes() -> set[tuple[str, str]]:
    """(method, path) of every route, through FastAPI's view of included routers."""
    found: set[tuple[str, str]] = set()
    for context in iter_route_contexts(create_app(Settings()).routes):
        route, path = context.original_route, context.path
        assert path is not None
        if isinstance(route, APIWebSocketRoute):
            found.add(("WS", path))
        elif isinstance(route, Mount):
            found.add(("MOUNT", path))
        else:  # API routes, and the OpenAPI document (a plain starlette Route)
            methods = route.methods if isinstance(route, APIRoute) else getattr(
                route, "methods", set())
            found |= {(method, path) for method in methods or () if method != "HEAD"}
    return found


def test_the_table_is_every_route() -> None:
    assert app_routes() == set(ROUTES)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def team(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[TeamApp]:
    tmp = tmp_path_factory.mktemp("team")
    with migrated_database(request.param, tmp) as url, team_app(url) as team:
        yield team


def _ingest(team: TeamApp, token: str, run_id: str, project: str, **kwargs: Any
            ) -> httpx2.Response:
    return team.client.post("/api/ingest", headers=team.bearer(token), json=batch(
        [record(0), record(1)], run_id=run_id, project=project, **kwargs))


@pytest.fixture(scope="module")
def runs(team: TeamApp) -> dict[str, str]:
    ids = {"RUN": new_id(), "RUN2": new_id(), "BETA": new_id()}
    assert _ingest(team, "alpha-ingest", ids["RUN"], "alpha").status_code == 200
    assert _ingest(team, "alpha-ingest", ids["RUN2"], "alpha").status_code == 200
    assert _ingest(team, "beta-ingest", ids["BETA"], "beta").status_code == 200
    return ids


def _fresh_token(team: TeamApp, project: str) -> str:
    """The id of a new read token of `project`, made through the API by the root admin."""
    response = team.client.post("/api/tokens", headers=team.bearer("root"),
                                json={"project": project, "scope": "read"})
    assert response.status_code == 201, response.text
    token_id: str = response.json()["id"]
    return token_id


RULE_BODY = {"project": "alpha", "name": "matrix", "condition": {"kind": "state",
                                                                  "state": "finished"}}
DESTINATION_BODY = {"project": "alpha", "name": "matrix", "kind": "webhook",
                    "url": "http://127.0.0.1:9/matrix", "enabled": False}


def _fresh(team: TeamApp, what: str) -> str:
    """The id of a new alert rule or destination of project alpha, made by the root admin."""
    body = RULE_BODY if what == "rules" else DESTINATION_BODY
    response = team.client.post(f"/api/alerts/{what}", headers=team.bearer("root"), json=body)
    assert response.status_code == 201, response.text
    made: str = response.json()["id"]
    return made


def _url(template: str, runs: dict[str, str], run: str | None = None) -> str:
    url = template.replace("RUN2", runs["RUN2"])
    return url.replace("RUN", run or runs["RUN"])


def _call(team: TeamApp, key: tuple[str, str], url: str, token: str | None,
          headers: dict[str, str] | None = None) -> int:
    """The HTTP status of one call, or for a WebSocket the close code (1000 when it stayed
    open long enough to send its first message)."""
    method = key[0]
    auth = team.bearer(token)
    auth.update(headers or {})
    if method == "WS":
        return _ws_close_code(team.client, url, auth)
    body: dict[str, Any] | None = None
    if url == "/api/ingest":
        body = batch([record(5)], run_id=new_id(), project="alpha")
    elif url == "/api/tokens" and method == "POST":
        body = {"project": "alpha", "scope": "read", "name": "matrix"}
    elif url == "/api/alerts/rules" and method == "POST":
        body = RULE_BODY
    elif url == "/api/alerts/destinations" and method == "POST":
        body = DESTINATION_BODY
    elif method == "PATCH" and url.startswith("/api/runs/"):
        body = {"notes": "from the route matrix"}
    elif method == "PATCH":
        body = {"enabled": False}
    team.client.cookies.clear()  # credentials are the call's own, never a cookie left behind
    return team.client.request("GET" if method == "MOUNT" else method, url, json=body,
                               headers=auth).status_code


def _ws_close_code(client: TestClient, path: str, headers: dict[str, str]) -> int:
    """The close code of the first message the app sends after accepting the socket, or 1000
    for a data message. Every socket sends one at once (a refusal, the runs snapshot, a run's
    status), so the wait needs no bound; a socket refused before it is accepted (which uvicorn
    would answer with an HTTP error) raises `WebSocketDisconnect` and fails the test."""
    with client.websocket_connect(f"{WS_BASE_URL}{path}", headers=headers) as ws:
        message = ws.receive()
    if message["type"] == "websocket.close":
        return int(message["code"])
    assert message["type"] == "websocket.send", message
    return 1000


@pytest.mark.parametrize("key", list(ROUTES), ids=lambda key: f"{key[0]} {key[1]}")
class TestEveryRoute:
    def test_no_credentials(self, team: TeamApp, runs: dict[str, str], key: tuple[str, str]
                            ) -> None:
        needs, template = ROUTES[key]
        status = _call(team, key, _url(template, runs), None)
        if needs is Needs.PUBLIC:
            assert status not in (401, 403), status
        elif key[0] == "WS":
            assert status == 1008
        else:
            assert status == 401
            # A browser asking for a page is sent to sign in instead.
            browser = _call(team, key, _url(template, runs), None, {"Accept": "text/html"})
            assert browser == (303 if key[0] == "GET" else 401)

    def test_each_scope(self, team: TeamApp, runs: dict[str, str], key: tuple[str, str]) -> None:
        needs, template = ROUTES[key]
        for token, scope in (("alpha-read", "read"), ("alpha-ingest", "ingest"),
                             ("alpha-admin", "admin")):
            run = None
            url = _url(template, runs)
            if key == ("DELETE", "/api/runs/{run_id}"):  # each scope on a run of its own
                run = new_id()
                assert _ingest(team, "alpha-ingest", run, "alpha").status_code == 200
                url = _url(template, runs, run)
            elif key == ("DELETE", "/api/tokens/{token_id}"):  # and on a token of its own
                url = template.replace("TOKEN", _fresh_token(team, "alpha"))
            elif "RULE" in template:  # an alert rule or destination of its own
                url = template.replace("RULE", _fresh(team, "rules"))
            elif "DEST" in template:
                url = template.replace("DEST", _fresh(team, "destinations"))
            status = _call(team, key, url, token)
            allowed = (needs in (Needs.PUBLIC, Needs.ANYONE) or scope == "admin"
                       or needs.value == scope)
            if key[0] == "WS":
                assert status == (1000 if allowed else 1008), (token, status)
            elif allowed:
                assert status not in (401, 403, 404, 500), (token, status)
            else:
                assert status == 403, (token, status)


    def test_a_foreign_host(self, team: TeamApp, runs: dict[str, str], key: tuple[str, str]
                            ) -> None:
        """DNS rebinding: whatever the route and the credentials, another Host is refused."""
        status = _call(team, key, _url(ROUTES[key][1], runs), "root",
                       {"Host": "rebound.example:8765"})
        assert status == (1008 if key[0] == "WS" else 400)

    def test_a_foreign_origin(self, team: TeamApp, runs: dict[str, str], key: tuple[str, str]
                              ) -> None:
        """Sockets and state-changing requests from another origin are refused; plain reads
        are left to the browser's same-origin policy (no CORS headers are ever sent)."""
        status = _call(team, key, _url(ROUTES[key][1], runs), "root",
                       {"Origin": "http://127.0.0.1:1"})
        if key[0] == "WS":
            assert status == 1008
        elif key[0] in ("POST", "PATCH", "DELETE"):
            assert status == 403
        else:
            assert status not in (401, 403)


def test_another_projects_run_cannot_be_edited(team: TeamApp, runs: dict[str, str]) -> None:
    """A project's admin edits its own runs' notes, not another project's (404, not 403: the
    run is not confirmed to exist)."""
    own = _call(team, ("PATCH", "/api/runs/{run_id}"), f"/api/runs/{runs['RUN']}", "alpha-admin")
    other = _call(team, ("PATCH", "/api/runs/{run_id}"), f"/api/runs/{runs['BETA']}",
                  "alpha-admin")
    assert (own, other) == (200, 404)


@pytest.mark.parametrize("key", RUN_ROUTES, ids=lambda key: f"{key[0]} {key[1]}")
def test_another_projects_run_is_not_found(team: TeamApp, runs: dict[str, str],
                                           key: tuple[str, str]) -> None:
    _, template = ROUTES[key]
    status = _call(team, key, _url(template, runs, runs["BETA"]), "alpha-read")
    assert status == (4404 if key[0] == "WS" else 404)


ID_ROUTES = [key for key, (_, url) in ROUTES.items()
             if any(slot in url for slot in ("RUN", "TOKEN", "RULE", "DEST"))]
"""Every route that takes an id (in its path, or the compare's query)."""
HOSTILE_IDS = {"nul": "a%00b", "long": "f" * 65, "quote": "x%27%3B--%20", "upper": "ABCDEF"}


def _bad_id_answer(key: tuple[str, str], template: str) -> int:
    """What a malformed id gets: ids the server makes (tokens, rules, destinations) are
    checked by form (422); a run id is any client's text up to 64 characters, so a malformed
    one is just no run (404; 4404 on a socket; the run page too, which then says so)."""
    if key[0] == "WS":
        return 4404
    return 404 if "RUN" in template else 422


@pytest.mark.parametrize("bad", list(HOSTILE_IDS))
@pytest.mark.parametrize("key", ID_ROUTES, ids=lambda key: f"{key[0]} {key[1]}")
def test_a_malformed_id_is_refused_before_sql(team: TeamApp, runs: dict[str, str],
                                              key: tuple[str, str], bad: str) -> None:
    """A NUL (which Postgres refuses in a query parameter), an over-long id, SQL quoting and
    the wrong case, on every route that takes an id, as the all-projects admin."""
    _, template = ROUTES[key]
    url = template.replace("RUN2", runs["RUN2"])
    for slot in ("RUN", "TOKEN", "RULE", "DEST"):
        url = url.replace(slot, HOSTILE_IDS[bad])
    expected = _bad_id_answer(key, template)
    if bad == "upper" and "RUN" not in template:
        expected = 422  # the server's hex ids are lower-case
    assert _call(team, key, url, "root") == expected


def test_a_revoked_token_stops_working(team: TeamApp, runs: dict[str, str]) -> None:
    """Made and revoked through the service the CLI calls, on a connection of its own
    (test_cli_admin runs `ampscope token create | list | revoke` themselves)."""
    engine = db.make_engine(team.db_url)
    try:
        factory = db.make_session_factory(engine)
        with db.unit_of_work(factory) as session:
            made = tokens.create_token(session, Scope.READ, "alpha", "short-lived")
        headers = {"Authorization": f"Bearer {made.secret}"}
        assert team.client.get("/api/runs", headers=headers).status_code == 200
        with db.unit_of_work(factory) as session:
            tokens.revoke_token(session, made.token.id)
    finally:
        engine.dispose()
    # No cache anywhere: the very next request fails.
    response = team.client.get("/api/runs", headers=headers)
    assert response.status_code == 401
    assert response.json() == {"detail": "the token has been revoked"}


class TestCredentials:
    def test_a_wrong_token_is_401_and_names_no_secret(self, team: TeamApp) -> None:
        client = team.client
        bad = "amps_" + "A" * 43
        response = client.get("/api/runs", headers={"Authorization": f"Bearer {bad}"})
        assert response.status_code == 401
        assert response.json() == {"detail": "the token is not valid"}
        assert response.headers["www-authenticate"] == 'Bearer realm="ampscope"'
        response = client.get("/api/runs", headers={"Authorization": "Basic dXNlcjpwYXNz"})
        assert response.json() == {
            "detail": "send the token as `Authorization: Bearer <token>`"}

    def test_a_token_in_the_query_string_is_refused(self, team: TeamApp) -> None:
        response = team.client.get("/api/runs", params={"token": team.tokens["root"]})
        assert response.status_code == 400
        assert "never accepted in a URL" in response.json()["detail"]

    def test_the_listing_shows_only_the_tokens_project(self, team: TeamApp,
                                                       runs: dict[str, str]) -> None:
        alpha_ids = {run["id"] for run in team.client.get(
            "/api/runs", headers=team.bearer("alpha-read")).json()}
        all_ids = {run["id"] for run in team.client.get(
            "/api/runs", headers=team.bearer("root")).json()}
        assert {runs["RUN"], runs["RUN2"]} <= alpha_ids and runs["BETA"] not in alpha_ids
        assert runs["BETA"] in all_ids


class TestIngestScoping:
    def test_a_new_run_in_another_project_is_403(self, team: TeamApp) -> None:
        response = _ingest(team, "alpha-ingest", new_id(), "beta")
        assert response.status_code == 403
        assert response.json() == {"detail": (
            "this token writes to project 'alpha', but the batch's run is in project 'beta' "
            "(pass project='alpha' to watch)")}

    def test_an_attempt_on_another_projects_run_is_404(self, team: TeamApp,
                                                       runs: dict[str, str]) -> None:
        response = _ingest(team, "alpha-ingest", runs["BETA"], "alpha",
                           attempt_id=new_id(), final=True)
        assert response.status_code == 404
        assert response.json() == {"detail": f"run '{runs['BETA']}' not found"}
        run = team.client.get(f"/api/runs/{runs['BETA']}", headers=team.bearer("root"))
        assert run.json()["status"] == "active"

    def test_a_deleted_run_takes_no_more_data(self, team: TeamApp) -> None:
        run_id = new_id()
        assert _ingest(team, "alpha-ingest", run_id, "alpha").status_code == 200
        admin = team.bearer("alpha-admin")
        deleted = team.client.delete(f"/api/runs/{run_id}", headers=admin)
        assert deleted.status_code == 200
        assert deleted.json()["steps"] == 2 and deleted.json()["project"] == "alpha"
        assert team.client.get(f"/api/runs/{run_id}", headers=admin).status_code == 404
        again = _ingest(team, "alpha-ingest", run_id, "alpha")
        assert again.status_code == 410
        assert again.json() == {"detail": (
            f"run '{run_id}' was deleted by an admin; it takes no more data (start a new run)")}


class TestBrowsersAndHosts:
    def test_a_foreign_host_is_refused(self, team: TeamApp) -> None:
        response = team.client.get("/api/health", headers={"Host": "evil.example:8765"})
        assert response.status_code == 400
        assert response.json()["detail"].startswith(
            "the Host header 'evil.example:8765' is not one this server answers to")

    def test_a_foreign_origin_cannot_open_the_runs_socket(self, team: TeamApp) -> None:
        status = _call(team, ("WS", "/api/runs/live"), "/api/runs/live", "root",
                       {"Origin": "https://evil.example"})
        assert status == 1008
        own = _call(team, ("WS", "/api/runs/live"), "/api/runs/live", "root",
                    {"Origin": BASE_URL})
        assert own == 1000

    def test_a_foreign_origin_cannot_post(self, team: TeamApp) -> None:
        response = team.client.post(
            "/api/ingest", headers={**team.bearer("alpha-ingest"), "Origin": "https://evil.example"},
            json=batch([record(0)], run_id=new_id(), project="alpha"))
        assert response.status_code == 403
        assert response.json() == {
            "detail": "requests from the origin 'https://evil.example' are not allowed"}


class TestTokenApi:
    def test_an_admin_manages_its_projects_tokens(self, team: TeamApp) -> None:
        client, admin = team.client, team.bearer("alpha-admin")
        created = client.post("/api/tokens", headers=admin,
                              json={"project": "alpha", "scope": "ingest", "name": "ci"})
        assert created.status_code == 201
        body = created.json()
        assert set(body) == {"id", "name", "project", "scope", "created_at",
                             "last_used_at", "revoked_at", "secret"}
        assert (body["project"], body["scope"], body["name"]) == ("alpha", "ingest", "ci")
        listed = client.get("/api/tokens", headers=admin).json()
        assert {t["project"] for t in listed} == {"alpha"}
        assert body["id"] in {t["id"] for t in listed}
        assert body["secret"] not in created.request.url.query.decode() + str(listed)
        ci = {"Authorization": f"Bearer {body['secret']}"}
        payload = batch([record(0)], run_id=new_id(), project="alpha")
        assert client.post("/api/ingest", headers=ci, json=payload).status_code == 200
        revoked = client.delete(f"/api/tokens/{body['id']}", headers=admin)
        assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
        assert client.post("/api/ingest", headers=ci, json=payload).status_code == 401

    def test_not_beyond_its_project(self, team: TeamApp) -> None:
        client, admin, root = team.client, team.bearer("alpha-admin"), team.bearer("root")
        for project in ("beta", None):
            response = client.post("/api/tokens", headers=admin,
                                   json={"project": project, "scope": "read"})
            assert response.status_code == 403
            assert response.json() == {
                "detail": "this admin token manages project 'alpha' only"}
        beta = client.post("/api/tokens", headers=root,
                           json={"project": "beta", "scope": "read"}).json()
        assert client.delete(f"/api/tokens/{beta['id']}", headers=admin).status_code == 404
        assert beta["id"] not in {t["id"] for t in client.get("/api/tokens",
                                                               headers=admin).json()}
        everyone = client.post("/api/tokens", headers=root,
                               json={"project": None, "scope": "admin"})
        assert everyone.status_code == 201 and everyone.json()["project"] is None

    def test_bad_input(self, team: TeamApp) -> None:
        client, root = team.client, team.bearer("root")
        bad = client.post("/api/tokens", headers=root, json={"project": "a b", "scope": "read"})
        assert bad.status_code == 422
        assert bad.json()["detail"].startswith("project name 'a b' is not valid")
        assert client.post("/api/tokens", headers=root,
                           json={"project": "p", "scope": "write"}).status_code == 422
        assert client.delete("/api/tokens/0ace", headers=root).json() == {
            "detail": "token '0ace' not found"}
        assert client.delete("/api/tokens/nope", headers=root).json() == {
            "detail": "path.token_id: String should match pattern '^[0-9a-f]{1,32}$'"}
