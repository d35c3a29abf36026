"""The live WebSocket on a real server: backfill, push on ingest, status, unknown run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.server.wire import batch, new_id, record, strict_json
from tests.support.databases import migrated_sqlite
from tests.support.ingest import post_batch
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.slow


def _ws_url(server: ServerProcess, run_id: str, after_id: int = 0) -> str:
    return f"ws://127.0.0.1:{server.port}/api/runs/{run_id}/live?after_id={after_id}"


def _recv(ws: ClientConnection) -> Any:
    message = ws.recv(timeout=10)
    assert isinstance(message, str)
    return strict_json(message)


@pytest.fixture
def api(served_api: httpx.Client) -> httpx.Client:
    """The module's real server, not the app in process: these sockets are read with a timeout
    and fed by LISTEN/NOTIFY, so their HTTP calls go to the same server."""
    return served_api


RANKS_0 = {"loss": [2.5, 2.25], "nonfinite": [0, 0]}
OPTIMIZERS_0 = [{"skipped": False, "lr": [1e-3, 5e-4]}, {"skipped": None, "lr": [None, 0.0]}]
RANKS_1 = {"loss": ["nan", "-inf"], "nonfinite": [3, None]}
OPTIMIZERS_1 = [{"skipped": False, "lr": ["inf", 5e-4]}, {"skipped": True, "lr": ["nan", 1e-2]}]


def _v4_batch(records: list[dict[str, Any]], run_id: str, **kwargs: Any) -> dict[str, Any]:
    payload = batch(records, run_id=run_id, world_size=2, **kwargs)
    payload["schema_version"] = 4
    return payload


class TestLive:
    def test_backfill_then_push(self, module_server: ServerProcess, api: httpx.Client) -> None:
        run_id = new_id()
        post_batch(api, batch([record(0), record(1, with_layers=False)], run_id=run_id))
        first_id = api.get(f"/api/runs/{run_id}/steps").json()["steps"][0]["id"]
        with connect(_ws_url(module_server, run_id, after_id=first_id)) as ws:
            backfill = _recv(ws)
            assert backfill["type"] == "steps" and backfill["run_id"] == run_id
            assert [s["seq"] for s in backfill["steps"]] == [1]
            assert backfill["steps"][0]["layers"] is None
            assert _recv(ws) == {"type": "status", "status": "active"}

            sent = record(2, loss="nan", grad_norm="inf", skipped=True, found_inf=True)
            post_batch(api, batch([sent], run_id=run_id, layers=None))
            pushed = _recv(ws)
            assert pushed["type"] == "steps"
            step = pushed["steps"][0]
            assert pushed["last_id"] == step["id"] > backfill["last_id"]
            assert {k: v for k, v in step.items() if k not in ("id", "attempt")} == {
                **sent, "ranks": None, "optimizers": None}
            assert step["attempt"] == 1

            post_batch(api, batch([], run_id=run_id, layers=None, final=True))
            assert _recv(ws) == {"type": "status", "status": "finished"}

    def test_steps_carry_ranks_and_optimizers_as_the_steps_page_gives_them(
        self, module_server: ServerProcess, api: httpx.Client
    ) -> None:
        """Wire v4's per-rank and per-optimizer values come with the backfill and the pushed
        steps, NaN/±inf as their tags and nulls kept, equal to `GET /api/runs/{id}/steps`'s."""
        run_id = new_id()
        post_batch(api, _v4_batch([record(0, with_layers=False, ranks=RANKS_0,
                                          optimizers=OPTIMIZERS_0)], run_id))
        with connect(_ws_url(module_server, run_id)) as ws:
            backfill = _recv(ws)
            assert [(s["ranks"], s["optimizers"]) for s in backfill["steps"]] == [
                (RANKS_0, OPTIMIZERS_0)]
            assert _recv(ws) == {"type": "status", "status": "active"}

            sent = [record(1, ranks=RANKS_1, optimizers=OPTIMIZERS_1, skipped=True,
                           found_inf=True),
                    record(2, with_layers=False, ranks=None, optimizers=None)]
            post_batch(api, _v4_batch(sent, run_id, layers=None))
            pushed = _recv(ws)
            assert pushed["type"] == "steps"
            assert [(s["seq"], s["ranks"], s["optimizers"]) for s in pushed["steps"]] == [
                (1, RANKS_1, OPTIMIZERS_1), (2, None, None)]
            page = strict_json(api.get(f"/api/runs/{run_id}/steps").text)["steps"]
            assert [{key: step[key] for key in ("id", "ranks", "optimizers")}
                    for step in backfill["steps"] + pushed["steps"]] == [
                {key: step[key] for key in ("id", "ranks", "optimizers")} for step in page]

    def test_duplicates_push_nothing_new(
        self, module_server: ServerProcess, api: httpx.Client
    ) -> None:
        run_id = new_id()
        payload = batch([record(0)], run_id=run_id)
        post_batch(api, payload)
        with connect(_ws_url(module_server, run_id)) as ws:
            assert [s["seq"] for s in _recv(ws)["steps"]] == [0]
            assert _recv(ws)["type"] == "status"
            post_batch(api, payload)
            post_batch(api, batch([record(1)], run_id=run_id))
            assert [s["seq"] for s in _recv(ws)["steps"]] == [1]

    def test_large_backfill_comes_in_chunks(
        self, module_server: ServerProcess, api: httpx.Client
    ) -> None:
        run_id = new_id()
        post_batch(api, batch([record(i, with_layers=False) for i in range(2500)], run_id=run_id))
        with connect(_ws_url(module_server, run_id)) as ws:
            sizes = [len(_recv(ws)["steps"]) for _ in range(3)]
            assert sizes == [1000, 1000, 500]
            assert _recv(ws)["type"] == "status"

    def test_unknown_run_closes_with_4404(self, module_server: ServerProcess) -> None:
        run_id = new_id()
        with connect(_ws_url(module_server, run_id)) as ws, pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=10)
        assert info.value.rcvd is not None
        assert info.value.rcvd.code == 4404
        assert info.value.rcvd.reason == f"run '{run_id}' not found"

    def test_client_going_away_is_harmless(
        self, module_server: ServerProcess, api: httpx.Client
    ) -> None:
        run_id = new_id()
        post_batch(api, batch([record(0)], run_id=run_id))
        for _ in range(5):
            with connect(_ws_url(module_server, run_id)) as ws:
                ws.send(json.dumps({"hello": 1}))
                assert _recv(ws)["type"] == "steps"
        post_batch(api, batch([record(1)], run_id=run_id))
        assert api.get("/api/health").json() == {"status": "ok"}
        assert "Traceback" not in module_server.log()


def _analysed(api: httpx.Client) -> None:
    """Until every listed run's cached analysis is as of its last step: a read analyses a few
    stale runs itself and leaves the rest to the server's background refresher."""
    deadline = time.monotonic() + 10
    while any(run["summary_step"] != run["last_step"] for run in api.get("/api/runs").json()):
        assert time.monotonic() < deadline, "the run summaries were not analysed within 10 s"
        time.sleep(0.05)


def _settle(ws: ClientConnection, known: set[str]) -> None:
    """Until the socket has been quiet for 1 s. Postgres delivers a NOTIFY when its listener
    next reads, so an ingest committed before the socket opened can still announce its run
    after the snapshot; such late messages may only name runs the snapshot already had."""
    while True:
        try:
            message = ws.recv(timeout=1)
        except TimeoutError:
            return
        assert isinstance(message, str)
        assert {r["id"] for r in strict_json(message)["runs"]} <= known


def _runs_url(server: ServerProcess) -> str:
    return f"ws://127.0.0.1:{server.port}/api/runs/live"


class TestRunsLive:
    def test_snapshot_then_the_runs_that_changed(
        self, module_server: ServerProcess, api: httpx.Client
    ) -> None:
        old = new_id()
        post_batch(api, batch([record(0)], run_id=old))
        _analysed(api)
        with connect(_runs_url(module_server)) as ws:
            snapshot = _recv(ws)
            assert snapshot["type"] == "runs" and snapshot["full"] is True
            # The same summaries as GET /api/runs, newest first.
            assert snapshot["runs"] == strict_json(api.get("/api/runs").text)
            _settle(ws, {r["id"] for r in snapshot["runs"]})

            # A new run: only it comes, as the API summarises it.
            fresh = new_id()
            post_batch(api, batch([record(0), record(1, loss="nan")], run_id=fresh))
            pushed = _recv(ws)
            assert pushed["type"] == "runs" and pushed["full"] is False
            assert [r["id"] for r in pushed["runs"]] == [fresh]
            summary = pushed["runs"][0]
            assert summary["num_steps"] == 2 and summary["status"] == "active"
            detail = strict_json(api.get(f"/api/runs/{fresh}").text)
            assert {key: detail[key] for key in summary} == summary

            # A new step of an existing run, then its end.
            post_batch(api, batch([record(1)], run_id=old))
            assert [(r["id"], r["num_steps"]) for r in _recv(ws)["runs"]] == [(old, 2)]
            post_batch(api, batch([], run_id=old, layers=None, final=True))
            assert [(r["id"], r["status"]) for r in _recv(ws)["runs"]] == [(old, "finished")]

    def test_every_run_of_a_burst_arrives(
        self, module_server: ServerProcess, api: httpx.Client
    ) -> None:
        ids = [new_id() for _ in range(3)]
        with connect(_runs_url(module_server)) as ws:
            assert _recv(ws)["full"] is True
            for run_id in ids:
                post_batch(api, batch([record(0)], run_id=run_id))
            seen: set[str] = set()
            while seen != set(ids):
                message = _recv(ws)
                assert message["full"] is False
                seen |= {r["id"] for r in message["runs"]}

    def test_everything_again_when_a_run_turns_crashed(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A run that goes silent turns `crashed` with no ingest to announce it: the periodic
        full message (every crash timeout / 2, here 1.5 s) carries it, even while another run
        keeps the socket busy. 3 s, not 1: on a loaded machine the first snapshot came more than
        1 s after the silent run's ingest and already said `crashed`."""
        monkeypatch.setenv("AMPSCOPE_CRASH_TIMEOUT_S", "3")
        server = ServerProcess(migrated_sqlite(tmp_path), tmp_path).start()
        try:
            with httpx.Client(base_url=server.url, timeout=30.0) as api:
                silent, busy = new_id(), new_id()
                post_batch(api, batch([record(0)], run_id=silent))
                with connect(_runs_url(server)) as ws:
                    first = _recv(ws)
                    assert first["full"] and first["runs"][0]["status"] == "active"
                    seq = 0
                    while True:
                        seq += 1
                        post_batch(api, batch([record(seq)], run_id=busy))
                        message = _recv(ws)
                        statuses = {r["id"]: r["status"] for r in message["runs"]}
                        if message["full"] and statuses[silent] == "crashed":
                            break
                        assert seq < 100, "no full message ever said the run crashed"
                    assert statuses[busy] == "active"
        finally:
            server.stop()
