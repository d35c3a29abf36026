"""`make demo` (examples/demo.py) stops cleanly (issue #14): SIGTERM to the demo stops its server
child too, so the port is free again (it was left held)."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.servers import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _port_free(port: int) -> bool:
    """Whether a new server could listen there (SO_REUSEADDR, as uvicorn binds: the closed
    connections' TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_sigterm_stops_the_server_child(tmp_path: Path) -> None:
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--port", str(port),
         "--db", f"sqlite:///{tmp_path / 'demo.db'}", "--steps", "100000",
         "--steps-per-second", "5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        runs: list[object] = []
        while not runs and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                runs = httpx.get(f"http://127.0.0.1:{port}/api/runs", timeout=2).json()
            time.sleep(0.2)
        assert runs, "the demo's run never appeared"
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=60) == 0
        assert _port_free(port)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
