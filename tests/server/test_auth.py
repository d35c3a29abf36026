"""Team mode on a real server with `--auth required`: every route of the app, enumerated, denies
without credentials, checks the scope and hides other projects' runs (DESIGN.md §7)."""

from __future__ import annotations

import enum
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute, APIWebSocketRoute, iter_route_contexts
from starlette.routing import Mount
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from ampscope_server.app import create_app
from ampscope_server.config import Settings
from tests.server.wire import batch, new_id, record
from tests.support.team import Team, team_server


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
    ("GET", "/api/runs/{run_id}/findings"): (Needs.READ, "/api/runs/RUN/findings"),
    ("GET", "/api/runs/{run_id}/histogram"): (Needs.READ, "/api/runs/RUN/histogram"),
    ("GET", "/api/compare"): (Needs.READ, "/api/compare?runs=RUN,RUN2"),
    ("GET", "/"): (Needs.READ, "/"),
    ("GET", "/runs/{run_id}"): (Needs.READ, "/runs/RUN"),
    ("GET", "/compare"): (Needs.READ, "/compare"),
    ("GET", "/settings"): (Needs.READ, "/settings"),
    ("GET", "/docs"): (Needs.READ, "/docs"),
    ("DELETE", "/api/runs/{run_id}"): (Needs.ADMIN, "/api/runs/RUN"),
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
              if url.startswith("/api/") and "RUN" in url and key[0] != "DELETE"]


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
         ) -> Iterator[Team]:
    with team_server(request.param, tmp_path_factory.mktemp("team")) as team:
        yield team


def _ingest(team: Team, token: str, run_id: str, project: str, **kwargs: Any
            ) -> httpx.Response:
    with team.client(token) as client:
        return client.post("/api/ingest", json=batch([record(0), record(1)], run_id=run_id,
                                                     project=project, **kwargs))


@pytest.fixture(scope="module")
def runs(team: Team) -> dict[str, str]:
    ids = {"RUN": new_id(), "RUN2": new_id(), "BETA": new_id()}
    assert _ingest(team, "alpha-ingest", ids["RUN"], "alpha").status_code == 200
    assert _ingest(team, "alpha-ingest", ids["RUN2"], "alpha").status_code == 200
    assert _ingest(team, "beta-ingest", ids["BETA"], "beta").status_code == 200
    return ids


def _fresh_token(team: Team, project: str) -> str:
    """The id of a new read token of `project`, made through the API by the root admin."""
    with team.client("root") as root:
        response = root.post("/api/tokens", json={"project": project, "scope": "read"})
    assert response.status_code == 201, response.text
    token_id: str = response.json()["id"]
    return token_id


RULE_BODY = {"project": "alpha", "name": "matrix", "condition": {"kind": "state",
                                                                  "state": "finished"}}
DESTINATION_BODY = {"project": "alpha", "name": "matrix", "kind": "webhook",
                    "url": "http://127.0.0.1:9/matrix", "enabled": False}


def _fresh(team: Team, what: str) -> str:
    """The id of a new alert rule or destination of project alpha, made by the root admin."""
    body = RULE_BODY if what == "rules" else DESTINATION_BODY
    with team.client("root") as root:
        response = root.post(f"/api/alerts/{what}", json=body)
    assert response.status_code == 201, response.text
    made: str = response.json()["id"]
    return made


def _url(template: str, runs: dict[str, str], run: str | None = None) -> str:
    url = template.replace("RUN2", runs["RUN2"])
    return url.replace("RUN", run or runs["RUN"])


def _call(team: Team, key: tuple[str, str], url: str, token: str | None,
          headers: dict[str, str] | None = None) -> int:
    """The HTTP status of one call, or for a WebSocket the close code (1000 when it stayed
    open long enough to send its first message)."""
    method = key[0]
    auth = {} if token is None else {"Authorization": f"Bearer {team.tokens[token]}"}
    auth.update(headers or {})
    if method == "WS" and "Host" in auth:
        return _raw_ws_close_code(team.server.port, url, auth)
    if method == "WS":
        ws_url = f"ws://127.0.0.1:{team.server.port}{url}"
        with connect(ws_url, additional_headers=auth, open_timeout=10) as ws:
            try:
                ws.recv(timeout=10)
            except ConnectionClosed as closed:
                assert closed.rcvd is not None
                return closed.rcvd.code
            return 1000
    body: dict[str, Any] | None = None
    if url == "/api/ingest":
        body = batch([record(5)], run_id=new_id(), project="alpha")
    elif url == "/api/tokens" and method == "POST":
        body = {"project": "alpha", "scope": "read", "name": "matrix"}
    elif url == "/api/alerts/rules" and method == "POST":
        body = RULE_BODY
    elif url == "/api/alerts/destinations" and method == "POST":
        body = DESTINATION_BODY
    elif method == "PATCH":
        body = {"enabled": False}
    with httpx.Client(base_url=team.url, timeout=30.0, follow_redirects=False) as client:
        return client.request("GET" if method == "MOUNT" else method, url, json=body,
                              headers=auth).status_code


def _raw_ws_close_code(port: int, path: str, headers: dict[str, str]) -> int:
    """A WebSocket handshake written by hand (websocket clients set Host themselves): the close
    code of the first frame the server sends after accepting, or 1000 for a data frame."""
    lines = [f"GET {path} HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade",
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13",
             *(f"{name}: {value}" for name, value in headers.items())]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(4096)
        head, _, frame = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        while len(frame) < 4:
            frame += sock.recv(4096)
        if frame[0] & 0x0F != 0x8:  # not a close frame
            return 1000
        return int.from_bytes(frame[2:4], "big")


@pytest.mark.parametrize("key", list(ROUTES), ids=lambda key: f"{key[0]} {key[1]}")
class TestEveryRoute:
    def test_no_credentials(self, team: Team, runs: dict[str, str], key: tuple[str, str]
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

    def test_each_scope(self, team: Team, runs: dict[str, str], key: tuple[str, str]) -> None:
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


    def test_a_foreign_host(self, team: Team, runs: dict[str, str], key: tuple[str, str]
                            ) -> None:
        """DNS rebinding: whatever the route and the credentials, another Host is refused."""
        status = _call(team, key, _url(ROUTES[key][1], runs), "root",
                       {"Host": "rebound.example:8765"})
        assert status == (1008 if key[0] == "WS" else 400)

    def test_a_foreign_origin(self, team: Team, runs: dict[str, str], key: tuple[str, str]
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


@pytest.mark.parametrize("key", RUN_ROUTES, ids=lambda key: f"{key[0]} {key[1]}")
def test_another_projects_run_is_not_found(team: Team, runs: dict[str, str],
                                           key: tuple[str, str]) -> None:
    _, template = ROUTES[key]
    status = _call(team, key, _url(template, runs, runs["BETA"]), "alpha-read")
    assert status == (4404 if key[0] == "WS" else 404)


def test_a_revoked_token_stops_working(team: Team, runs: dict[str, str]) -> None:
    from tests.support.team import cli, create_token

    secret = create_token(team.db_url, "alpha", "read", "short-lived")
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=team.url, headers=headers, timeout=30.0) as client:
        assert client.get("/api/runs").status_code == 200
        listed = cli("token", "list", "--db", team.db_url)
        token_id = next(line.split()[0] for line in listed.stdout.splitlines()
                        if "short-lived" in line)
        assert cli("token", "revoke", token_id, "--db", team.db_url).returncode == 0
        response = client.get("/api/runs")  # no cache anywhere: the very next request fails
        assert response.status_code == 401
        assert response.json() == {"detail": "the token has been revoked"}


class TestCredentials:
    def test_a_wrong_token_is_401_and_names_no_secret(self, team: Team) -> None:
        with httpx.Client(base_url=team.url, timeout=30.0) as client:
            bad = "amps_" + "A" * 43
            response = client.get("/api/runs", headers={"Authorization": f"Bearer {bad}"})
            assert response.status_code == 401
            assert response.json() == {"detail": "the token is not valid"}
            assert response.headers["www-authenticate"] == 'Bearer realm="ampscope"'
            response = client.get("/api/runs", headers={"Authorization": "Basic dXNlcjpwYXNz"})
            assert response.json() == {
                "detail": "send the token as `Authorization: Bearer <token>`"}

    def test_a_token_in_the_query_string_is_refused(self, team: Team) -> None:
        with httpx.Client(base_url=team.url, timeout=30.0) as client:
            response = client.get("/api/runs", params={"token": team.tokens["root"]})
            assert response.status_code == 400
            assert "never accepted in a URL" in response.json()["detail"]

    def test_the_listing_shows_only_the_tokens_project(self, team: Team,
                                                       runs: dict[str, str]) -> None:
        with team.client("alpha-read") as alpha, team.client("root") as root:
            alpha_ids = {run["id"] for run in alpha.get("/api/runs").json()}
            all_ids = {run["id"] for run in root.get("/api/runs").json()}
        assert {runs["RUN"], runs["RUN2"]} <= alpha_ids and runs["BETA"] not in alpha_ids
        assert runs["BETA"] in all_ids


class TestIngestScoping:
    def test_a_new_run_in_another_project_is_403(self, team: Team) -> None:
        response = _ingest(team, "alpha-ingest", new_id(), "beta")
        assert response.status_code == 403
        assert response.json() == {"detail": (
            "this token writes to project 'alpha', but the batch's run is in project 'beta' "
            "(pass project='alpha' to watch)")}

    def test_an_attempt_on_another_projects_run_is_404(self, team: Team,
                                                       runs: dict[str, str]) -> None:
        response = _ingest(team, "alpha-ingest", runs["BETA"], "alpha",
                           attempt_id=new_id(), final=True)
        assert response.status_code == 404
        assert response.json() == {"detail": f"run '{runs['BETA']}' not found"}
        with team.client("root") as root:
            assert root.get(f"/api/runs/{runs['BETA']}").json()["status"] == "active"

    def test_a_deleted_run_takes_no_more_data(self, team: Team) -> None:
        run_id = new_id()
        assert _ingest(team, "alpha-ingest", run_id, "alpha").status_code == 200
        with team.client("alpha-admin") as admin:
            deleted = admin.delete(f"/api/runs/{run_id}")
            assert deleted.status_code == 200
            assert deleted.json()["steps"] == 2 and deleted.json()["project"] == "alpha"
            assert admin.get(f"/api/runs/{run_id}").status_code == 404
        again = _ingest(team, "alpha-ingest", run_id, "alpha")
        assert again.status_code == 410
        assert again.json() == {"detail": (
            f"run '{run_id}' was deleted by an admin; it takes no more data (start a new run)")}


class TestBrowsersAndHosts:
    def test_a_foreign_host_is_refused(self, team: Team) -> None:
        with httpx.Client(base_url=team.url, timeout=30.0) as client:
            response = client.get("/api/health", headers={"Host": "evil.example:8765"})
        assert response.status_code == 400
        assert response.json()["detail"].startswith(
            "the Host header 'evil.example:8765' is not one this server answers to")

    def test_a_foreign_origin_cannot_open_the_runs_socket(self, team: Team) -> None:
        status = _call(team, ("WS", "/api/runs/live"), "/api/runs/live", "root",
                       {"Origin": "https://evil.example"})
        assert status == 1008
        own = _call(team, ("WS", "/api/runs/live"), "/api/runs/live", "root",
                    {"Origin": team.url})
        assert own == 1000

    def test_a_foreign_origin_cannot_post(self, team: Team) -> None:
        with team.client("alpha-ingest") as client:
            response = client.post("/api/ingest", headers={"Origin": "https://evil.example"},
                                   json=batch([record(0)], run_id=new_id(), project="alpha"))
        assert response.status_code == 403
        assert response.json() == {
            "detail": "requests from the origin 'https://evil.example' are not allowed"}



class TestTokenApi:
    def test_an_admin_manages_its_projects_tokens(self, team: Team) -> None:
        with team.client("alpha-admin") as admin:
            created = admin.post("/api/tokens", json={"project": "alpha", "scope": "ingest",
                                                      "name": "ci"})
            assert created.status_code == 201
            body = created.json()
            assert set(body) == {"id", "name", "project", "scope", "created_at",
                                 "last_used_at", "revoked_at", "secret"}
            assert (body["project"], body["scope"], body["name"]) == ("alpha", "ingest", "ci")
            listed = admin.get("/api/tokens").json()
            assert {t["project"] for t in listed} == {"alpha"}
            assert body["id"] in {t["id"] for t in listed}
            assert body["secret"] not in created.request.url.query.decode() + str(listed)
            with httpx.Client(base_url=team.url, timeout=30.0,
                              headers={"Authorization": f"Bearer {body['secret']}"}) as ci:
                payload = batch([record(0)], run_id=new_id(), project="alpha")
                assert ci.post("/api/ingest", json=payload).status_code == 200
                revoked = admin.delete(f"/api/tokens/{body['id']}")
                assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
                assert ci.post("/api/ingest", json=payload).status_code == 401

    def test_not_beyond_its_project(self, team: Team) -> None:
        with team.client("alpha-admin") as admin, team.client("root") as root:
            for project in ("beta", None):
                response = admin.post("/api/tokens", json={"project": project,
                                                           "scope": "read"})
                assert response.status_code == 403
                assert response.json() == {
                    "detail": "this admin token manages project 'alpha' only"}
            beta = root.post("/api/tokens", json={"project": "beta", "scope": "read"}).json()
            assert admin.delete(f"/api/tokens/{beta['id']}").status_code == 404
            assert beta["id"] not in {t["id"] for t in admin.get("/api/tokens").json()}
            everyone = root.post("/api/tokens", json={"project": None, "scope": "admin"})
            assert everyone.status_code == 201 and everyone.json()["project"] is None

    def test_bad_input(self, team: Team) -> None:
        with team.client("root") as root:
            bad = root.post("/api/tokens", json={"project": "a b", "scope": "read"})
            assert bad.status_code == 422
            assert bad.json()["detail"].startswith("project name 'a b' is not valid")
            assert root.post("/api/tokens", json={"project": "p", "scope": "write"}
                             ).status_code == 422
            assert root.delete("/api/tokens/nope").json() == {"detail": "token 'nope' not found"}
