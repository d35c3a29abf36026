"""Hostile input to the app (in process, the gate and limits in front), both dialects: everything
accepted reads back, everything else is a 4xx naming the limit, nothing is a 5xx, and nothing
refused is stored. A database refusing connections is a fault of a real server's.

How uvicorn answers a WebSocket handshake the app refuses (HTTP 403): test_serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import httpx2
import psycopg
import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.server.wire import batch, new_id, record
from tests.support.app import WS_BASE_URL, app_client
from tests.support.databases import PG_ADMIN_DSN, migrated_database, migrated_sqlite
from tests.support.servers import ServerProcess
from tests.support.team import make_tokens, team_server

INT64_OVER = 2**63


def _raw(api: TestClient, body: bytes, content_type: str = "application/json"
         ) -> httpx2.Response:
    return api.post("/api/ingest", content=body, headers={"Content-Type": content_type})


def _with_config_text(run_id: str, config_json: str) -> bytes:
    """A valid batch whose run config is the given JSON text, spliced in verbatim (so that
    tokens json.dumps would never write — NaN, lone surrogates — reach the server as sent)."""
    payload = batch([record(0)], run_id=run_id)
    payload["run"]["config"] = "__CONFIG__"
    return json.dumps(payload).replace('"__CONFIG__"', config_json).encode()


class TestNothingUnreadableIsStored:
    @pytest.mark.parametrize(("config", "message"), [
        ('{"path": "\\ud800"}', "a lone UTF-16 surrogate such as \\ud800 is not text"),
        ('{"path": "x\\udc00"}', "a lone UTF-16 surrogate such as \\ud800 is not text"),
        ('{"lr": NaN}', "config.lr is a non-finite number"),
        ('{"lr": Infinity}', "config.lr is a non-finite number"),
        ('{"lr": 1e400}', "config.lr is a non-finite number"),
        ('{"a": {"b": "\\u0000"}}', "config.a.b contains a NUL character"),
        ('{"\\u0000": 1}', "a key of config contains a NUL character"),
        ("[" * 300 + "]" * 300, "recursion limit"),
        ('{"a": ' + "[" * 16 + "]" * 16 + "}", "is nested deeper than 16 levels"),
    ], ids=["high-surrogate", "low-surrogate", "nan", "infinity", "1e400", "nul-value",
            "nul-key", "300-deep", "17-deep"])
    def test_config(self, api: TestClient, config: str, message: str) -> None:
        run_id = new_id()
        response = _raw(api, _with_config_text(run_id, config))
        assert response.status_code == 422, response.text
        assert message in response.json()["detail"]
        assert api.get(f"/api/runs/{run_id}").status_code == 404

    def test_what_is_accepted_reads_back_exactly(self, api: TestClient) -> None:
        run_id = new_id()
        config = {"emoji": "😀", "deep": json.loads("[" * 15 + "]" * 15), "big": 2**62,
                  "tiny": 5e-324, "text": "é\t\u2028"}
        response = _raw(api, _with_config_text(run_id, json.dumps(config)))
        assert response.status_code == 200, response.text
        assert api.get(f"/api/runs/{run_id}").json()["config"] == config
        assert api.get(f"/api/runs/{run_id}/export").status_code == 200

    def test_a_bare_nan_in_a_record_is_refused(self, api: TestClient) -> None:
        run_id = new_id()
        body = json.dumps(batch([record(0, loss=0.987654)], run_id=run_id))
        body = body.replace("0.987654", "NaN")
        response = _raw(api, body.encode())
        assert response.status_code == 422
        assert response.json()["detail"] == (
            'records[0].loss: non-finite numbers must be sent as "nan", "inf" or "-inf"')


class TestLimits:
    def test_tags(self, api: TestClient) -> None:
        response = api.post("/api/ingest", json=batch([record(0)], run_id=new_id(),
                                                      tags=[f"t{i}" for i in range(33)]))
        assert response.status_code == 422
        assert response.json()["detail"].startswith("run.tags: List should have at most 32 items")

    def test_notes_and_tags_people_edit(self, api: TestClient) -> None:
        """PATCH /api/runs/{id}: user text, length-capped, no NUL; what is refused is not
        stored, what is accepted reads back exactly (the page renders it as text)."""
        run_id = new_id()
        assert api.post("/api/ingest", json=batch([record(0)], run_id=run_id)).status_code == 200
        refused = [
            ({"notes": "x" * 4001}, "notes: String should have at most 4000 characters"),
            ({"notes": "a\x00b"}, "notes: Value error, must not contain NUL characters"),
            ({"tags": [""]}, "tags[0]: String should have at least 1 character"),
            ({"tags": ["t" * 201]}, "tags[0]: String should have at most 200 characters"),
            ({"tags": [f"t{i}" for i in range(33)]}, "tags: List should have at most 32 items"),
            ({"tags": "amp"}, "tags: Input should be a valid list"),
            ({"name": "renamed"}, "name: unknown field"),
        ]
        for body, message in refused:
            response = api.patch(f"/api/runs/{run_id}", json=body)
            assert response.status_code == 422, body
            assert response.json()["detail"].startswith(message), response.json()
        head = "<img src=x onerror=alert(1)> \u202e"
        hostile = head + "é" * (4000 - len(head))  # at the cap exactly
        response = api.patch(f"/api/runs/{run_id}",
                             json={"notes": hostile, "tags": [hostile[:200]]})
        assert response.status_code == 200, response.text
        again = api.get(f"/api/runs/{run_id}").json()
        assert (again["notes"], again["tags"]) == (hostile, [hostile[:200]])

    def test_records_per_batch(self, api: TestClient) -> None:
        records = [record(i, with_layers=False) for i in range(10_001)]
        response = api.post("/api/ingest", json=batch(records, run_id=new_id(), layers=None))
        assert response.status_code == 422
        assert response.json()["detail"].startswith(
            "records: List should have at most 10000 items")

    @pytest.mark.slow
    def test_a_full_batch_spread_over_many_buckets_is_stored(self, api: TestClient) -> None:
        """10,000 records with layers and steps far apart: every rollup level has thousands of
        buckets, which one IN list could not carry (StatementTooComplex on Postgres)."""
        run_id = new_id()
        records = [record(i, step=i * 7) for i in range(10_000)]
        response = api.post("/api/ingest", json=batch(records, run_id=run_id))
        assert response.status_code == 200, response.text
        assert response.json()["accepted"] == 10_000
        assert api.get(f"/api/runs/{run_id}").json()["num_steps"] == 10_000

    def test_a_body_over_the_cap_is_413_and_stores_nothing(self, api: TestClient) -> None:
        run_id = new_id()
        payload = batch([record(0)], run_id=run_id)
        payload["run"]["name"] = "x" * 100
        body = json.dumps(payload).encode()
        body = body[:-1] + b"," + b'"pad": "' + b"y" * (8 * 2**20) + b'"}'
        response = _raw(api, body)
        assert response.status_code == 413
        assert response.json() == {"detail": (
            "the request body is over the server's limit of 8388608 bytes "
            "(AMPSCOPE_MAX_BODY_BYTES); send smaller batches")}

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
            for _ in range(9):
                yield b" " * 2**20

        chunked = api.post("/api/ingest", content=chunks(),
                           headers={"Content-Type": "application/json"})
        assert chunked.status_code == 413
        assert api.get(f"/api/runs/{run_id}").status_code == 404

    def test_a_body_that_is_not_json(self, api: TestClient) -> None:
        response = _raw(api, b"records=1", "text/plain")
        assert response.status_code == 415
        assert response.json() == {"detail": "the body must be application/json, not text/plain"}
        assert _raw(api, b"").status_code == 422


class TestQueryParameters:
    @pytest.mark.parametrize("query", [
        f"steps?after_id={INT64_OVER}", f"series/loss?start={INT64_OVER}",
        f"series/loss?end={INT64_OVER}", f"layer-stats?stat=amax&start={INT64_OVER}",
        f"optimizers?start={INT64_OVER}", f"optimizers?end={INT64_OVER}",
    ])
    def test_integers_past_int64_are_422(self, api: TestClient, query: str) -> None:
        run_id = new_id()
        assert api.post("/api/ingest", json=batch([record(0)], run_id=run_id)).status_code == 200
        response = api.get(f"/api/runs/{run_id}/{query}")
        assert response.status_code == 422
        assert "less than or equal to 9223372036854775807" in response.json()["detail"]

    @pytest.mark.parametrize("path", [
        "/api/runs/a%00b", "/api/runs/a%00b/steps", "/api/runs/a%00b/ranks",
        "/api/runs/a%00b/optimizers",
        "/api/runs/a%00b/export?format=csv",
        "/api/compare?runs=a%00b,c", "/api/runs/" + "x" * 65,
    ])
    def test_nul_and_overlong_ids_are_404(self, api: TestClient, path: str) -> None:
        assert api.get(path).status_code == 404

    def test_nul_in_a_baseline_is_404(self, api: TestClient) -> None:
        run_id = new_id()
        assert api.post("/api/ingest", json=batch([record(0)], run_id=run_id)).status_code == 200
        assert api.get(f"/api/runs/{run_id}/findings?baseline=a%00b").status_code == 404

    def test_websocket_parameters(self, api: TestClient) -> None:
        """An unhandled error in the socket's handler would be raised here, not logged."""
        base = f"{WS_BASE_URL}/api/runs"
        with api.websocket_connect(f"{base}/a%00b/live") as ws:
            assert ws.receive() == {"type": "websocket.close", "code": 4404,
                                    "reason": "run 'a\x00b' not found"}
        # A parameter that fails validation refuses the handshake: FastAPI closes the socket
        # before accepting it (uvicorn's HTTP 403: test_serving), and the app goes on serving.
        with pytest.raises(WebSocketDisconnect) as refused, \
                api.websocket_connect(f"{base}/{new_id()}/live?after_id={INT64_OVER}"):
            pass
        assert refused.value.code == 1008
        assert api.get("/api/runs").status_code == 200


def test_a_runaway_token_is_rate_limited(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path)
    secrets = make_tokens(url)

    def bearer(label: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {secrets[label]}"}

    with app_client(url, auth="required", ingest_rate_per_s=0.5, ingest_burst=2) as client:
        run_id = new_id()
        statuses = [client.post("/api/ingest", headers=bearer("alpha-ingest"),
                                json=batch([record(i)], run_id=run_id, project="alpha"))
                    for i in range(3)]
        assert [r.status_code for r in statuses] == [200, 200, 429]
        assert statuses[2].headers["retry-after"] == "2"
        assert statuses[2].json() == {
            "detail": "this token is over its ingest rate of 0.5 requests/s; retry later"}
        # Another token has its own bucket.
        assert client.post("/api/ingest", headers=bearer("beta-ingest"), json=batch(
            [record(0)], run_id=new_id(), project="beta")).status_code == 200


@contextmanager
def _served(url: str, log_dir: Path, auth: bool) -> Iterator[httpx.Client]:
    """A client of a server over `url`: with auth (a root token) or without."""
    env = {"AMPSCOPE_CRASH_TIMEOUT_S": "2"}  # live sockets re-read every second
    if auth:
        with team_server(url, log_dir, env=env) as team, team.client("root") as client:
            yield client
        return
    server = ServerProcess(url, log_dir, env=env).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30.0) as client:
            yield client
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("auth", [False, True], ids=["auth-off", "auth-required"])
def test_a_database_that_refuses_connections_is_503(tmp_path: Path, auth: bool) -> None:
    """Through the error handler (auth off) and through the gate's token lookup (auth on); an
    open live socket is closed with 1013 (try again later) on its next read."""
    with migrated_database("postgres", tmp_path) as url:
        name = url.rsplit("/", 1)[1]
        with _served(url, tmp_path, auth) as client:
            assert client.get("/api/runs").status_code == 200
            ws_url = str(client.base_url).replace("http://", "ws://") + "/api/runs/live"
            auth_header = {key: value for key, value in client.headers.items()
                           if key == "authorization"}
            with connect(ws_url, additional_headers=auth_header) as socket:
                assert json.loads(socket.recv(timeout=10))["type"] == "runs"
                with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
                    admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
                    admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE datname = %s", (name,))
                try:
                    for path in ("/api/runs", f"/api/runs/{new_id()}"):
                        response = client.get(path)
                        assert response.status_code == 503, response.text
                        assert response.headers["retry-after"] == "5"
                        assert response.json()["detail"].startswith(
                            "the database is unavailable (OperationalError)")
                    assert client.get("/api/health").status_code == 200
                    with pytest.raises(ConnectionClosed) as closed:
                        while True:
                            socket.recv(timeout=10)
                    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
                finally:
                    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
                        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
            assert client.get("/api/runs").status_code == 200
