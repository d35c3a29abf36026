"""Several processes on one Postgres: live updates cross instances and `--workers` through
LISTEN/NOTIFY; the listener survives losing its connection; SQLite refuses more than one."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.server.wire import batch, new_id, record
from tests.support.databases import PG_ADMIN_DSN, migrated_database, sqlite_url
from tests.support.servers import ServerProcess, free_port

pytestmark = pytest.mark.slow

RECV_S = 10.0
"""Below the sockets' 15 s fallback re-read: a step seen within it came by notification."""


def _recv(ws: ClientConnection) -> Any:
    message = ws.recv(timeout=RECV_S)
    assert isinstance(message, str)
    return json.loads(message)


def _steps_of(ws: ClientConnection) -> list[int]:
    """Messages until a `steps` one; its seqs."""
    while True:
        message = _recv(ws)
        if message["type"] == "steps":
            return [step["seq"] for step in message["steps"]]


@pytest.fixture
def two_instances(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess, str]]:
    with migrated_database("postgres", tmp_path) as url:
        a = ServerProcess(url, tmp_path).start()
        b = ServerProcess(url, tmp_path).start()
        try:
            yield a, b, url
        finally:
            a.stop()
            b.stop()


def _post(server: ServerProcess, run_id: str, seq: int) -> None:
    response = httpx.post(f"{server.url}/api/ingest", timeout=30,
                          json=batch([record(seq)], run_id=run_id, layers=None if seq else
                                     batch([], run_id=run_id)["layers"]))
    assert response.status_code == 200, response.text


def test_a_socket_on_one_instance_sees_ingest_through_another(
    two_instances: tuple[ServerProcess, ServerProcess, str]
) -> None:
    a, b, _ = two_instances
    run_id = new_id()
    _post(a, run_id, 0)
    with connect(f"ws://127.0.0.1:{b.port}/api/runs/{run_id}/live") as run_ws, \
            connect(f"ws://127.0.0.1:{b.port}/api/runs/live") as list_ws:
        assert _steps_of(run_ws) == [0]
        assert _recv(list_ws)["full"] is True
        for seq in (1, 2):
            _post(a, run_id, seq)
            assert _steps_of(run_ws) == [seq]
        pushed = _recv(list_ws)
        assert pushed["full"] is False and pushed["runs"][0]["id"] == run_id


def test_a_step_through_another_instance_carries_ranks_and_optimizers(
    two_instances: tuple[ServerProcess, ServerProcess, str]
) -> None:
    """The socket on one instance reads wire v4's per-rank and per-optimizer values of a step
    ingested through the other (NaN/±inf as their tags), as that step's /steps gives them."""
    a, b, _ = two_instances
    run_id = new_id()
    _post(a, run_id, 0)
    ranks = {"loss": [1.5, "nan"], "nonfinite": [0, 2]}
    optimizers = [{"skipped": False, "lr": [1e-3]}, {"skipped": True, "lr": ["inf", None]}]
    payload = batch([record(1, ranks=ranks, optimizers=optimizers)], run_id=run_id, layers=None,
                    world_size=2)
    payload["schema_version"] = 4
    with connect(f"ws://127.0.0.1:{b.port}/api/runs/{run_id}/live") as ws:
        assert _steps_of(ws) == [0]
        response = httpx.post(f"{a.url}/api/ingest", json=payload, timeout=30)
        assert response.status_code == 200, response.text
        while (message := _recv(ws))["type"] != "steps":
            pass
    assert [(s["seq"], s["ranks"], s["optimizers"]) for s in message["steps"]] == [
        (1, ranks, optimizers)]
    page = httpx.get(f"{b.url}/api/runs/{run_id}/steps", timeout=30).json()["steps"]
    assert [(s["ranks"], s["optimizers"]) for s in page] == [
        (None, None), (ranks, optimizers)]


def test_the_listener_reconnects(two_instances: tuple[ServerProcess, ServerProcess, str]
                                 ) -> None:
    a, b, url = two_instances
    run_id = new_id()
    _post(a, run_id, 0)
    name = url.rsplit("/", 1)[1]
    with connect(f"ws://127.0.0.1:{b.port}/api/runs/{run_id}/live") as ws:
        assert _steps_of(ws) == [0]
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND query LIKE 'LISTEN%%'", (name,)).fetchone()
        assert killed == (2,)  # one listener per instance
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # both back: their LISTEN shows again
            with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
                listening = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND query "
                    "LIKE 'LISTEN%%'", (name,)).fetchone()
            if listening == (2,):
                break
            time.sleep(0.2)
        assert listening == (2,)
        _post(a, run_id, 1)
        assert _steps_of(ws) == [1]
    assert "live listener lost Postgres" in b.log()


def test_workers_share_live_updates(tmp_path: Path) -> None:
    with migrated_database("postgres", tmp_path) as url:
        server = ServerProcess(url, tmp_path, args=["--workers", "2"]).start()
        try:
            run_id = new_id()
            _post(server, run_id, 0)
            url_ws = f"ws://127.0.0.1:{server.port}/api/runs/{run_id}/live"
            with contextlib.ExitStack() as stack:  # spread over both workers by the kernel
                sockets = [stack.enter_context(connect(url_ws)) for _ in range(8)]
                assert all(_steps_of(ws) == [0] for ws in sockets)
                for seq in range(1, 4):
                    _post(server, run_id, seq)  # each request to whichever worker accepts it
                    assert all(_steps_of(ws) == [seq] for ws in sockets)
            assert len(_children(server)) == 2
            name = url.rsplit("/", 1)[1]
            with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
                listening = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND query "
                    "LIKE 'LISTEN%%'", (name,)).fetchone()
            assert listening == (2,)  # one listener per worker
        finally:
            server.stop()


def _children(server: ServerProcess) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == server.pid:
            children.append(int(stat.parent.name))
    # uvicorn's multiprocess supervisor may also run a resource tracker beside the workers.
    return [pid for pid in children
            if "multiprocessing.resource_tracker" not in _cmdline(pid)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_sqlite_is_one_process(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ampscope_server.cli", "serve", "--db", sqlite_url(tmp_path),
         "--port", str(free_port()), "--workers", "2"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == ("ampscope serve: SQLite is served by one process (one writer); "
                             "--workers needs Postgres (--db postgresql+psycopg://…)\n")
