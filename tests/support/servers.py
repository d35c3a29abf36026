"""A real `ampscope serve` process (uvicorn) on a free 127.0.0.1 port, for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """`ampscope serve --db URL` in a child process; start(), stop(), kill() and start() again.

    The database is the caller's to migrate (`tests.support.databases.migrated_database`: a
    copy of a template, not a second interpreter running Alembic); on SQLite `serve` would
    migrate an empty one itself. The port stays the same across restarts so a client keeps its
    URL.
    """

    def __init__(self, db_url: str, log_dir: Path, port: int | None = None,
                 args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        """`args` are extra `serve` flags (`--auth required`), `env` extra environment."""
        self.db_url = db_url
        self.args = list(args)
        self.env = dict(env or {})
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log_path = log_dir / f"server-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> ServerProcess:
        """Start it and wait until it answers; ``timeout_s`` is only the bound (it returns as
        soon as it answers): 30 s was too short for a boot on a 2-core host at load 12."""
        cmd = [sys.executable, "-m", "ampscope_server.cli", "serve",
               "--host", "127.0.0.1", "--port", str(self.port), "--db", self.db_url, *self.args]
        log = open(self._log_path, "ab")  # noqa: SIM115 - the child owns it until it exits
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"server exited with {self._proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/api/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"server did not answer within {timeout_s}s:\n{self.log()}")

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def log(self) -> str:
        return self._log_path.read_text(errors="replace") if self._log_path.exists() else ""

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
