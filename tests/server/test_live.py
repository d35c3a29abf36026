"""The live WebSocket on a real server: backfill, push on ingest, status, unknown run."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.server.wire import batch, new_id, record, strict_json
from tests.support.servers import ServerProcess


def _ws_url(server: ServerProcess, run_id: str, after_id: int = 0) -> str:
    return f"ws://127.0.0.1:{server.port}/api/runs/{run_id}/live?after_id={after_id}"


def _recv(ws: ClientConnection) -> Any:
    message = ws.recv(timeout=10)
    assert isinstance(message, str)
    return strict_json(message)


def _post(api: httpx.Client, payload: dict[str, Any]) -> None:
    response = api.post("/api/ingest", json=payload)
    assert response.status_code == 200, response.text


class TestLive:
    def test_backfill_then_push(self, module_server: ServerProcess, api: httpx.Client) -> None:
        run_id = new_id()
        _post(api, batch([record(0), record(1, with_layers=False)], run_id=run_id))
        first_id = api.get(f"/api/runs/{run_id}/steps").json()["steps"][0]["id"]
        with connect(_ws_url(module_server, run_id, after_id=first_id)) as ws:
            backfill = _recv(ws)
            assert backfill["type"] == "steps" and backfill["run_id"] == run_id
            assert [s["seq"] for s in backfill["steps"]] == [1]
            assert backfill["steps"][0]["layers"] is None
            assert _recv(ws) == {"type": "status", "status": "active"}

            sent = record(2, loss="nan", grad_norm="inf", skipped=True, found_inf=True)
            _post(api, batch([sent], run_id=run_id, layers=None))
            pushed = _recv(ws)
            assert pushed["type"] == "steps"
            step = pushed["steps"][0]
            assert pushed["last_id"] == step["id"] > backfill["last_id"]
            assert {k: v for k, v in step.items() if k not in ("id", "attempt")} == sent
            assert step["attempt"] == 1

            _post(api, batch([], run_id=run_id, layers=None, final=True))
            assert _recv(ws) == {"type": "status", "status": "finished"}

    def test_duplicates_push_nothing_new(
        self, module_server: ServerProcess, api: httpx.Client
    ) -> None:
        run_id = new_id()
        payload = batch([record(0)], run_id=run_id)
        _post(api, payload)
        with connect(_ws_url(module_server, run_id)) as ws:
            assert [s["seq"] for s in _recv(ws)["steps"]] == [0]
            assert _recv(ws)["type"] == "status"
            _post(api, payload)
            _post(api, batch([record(1)], run_id=run_id))
            assert [s["seq"] for s in _recv(ws)["steps"]] == [1]

    def test_large_backfill_comes_in_chunks(
        self, module_server: ServerProcess, api: httpx.Client
    ) -> None:
        run_id = new_id()
        _post(api, batch([record(i, with_layers=False) for i in range(2500)], run_id=run_id))
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
        _post(api, batch([record(0)], run_id=run_id))
        for _ in range(5):
            with connect(_ws_url(module_server, run_id)) as ws:
                ws.send(json.dumps({"hello": 1}))
                assert _recv(ws)["type"] == "steps"
        _post(api, batch([record(1)], run_id=run_id))
        assert api.get("/api/health").json() == {"status": "ok"}
        assert "Traceback" not in module_server.log()
