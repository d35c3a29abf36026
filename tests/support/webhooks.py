"""A webhook receiver on 127.0.0.1 that records every request it gets, for the alert tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    """time.time() when the request's body had arrived."""

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self.status = 200
        self.delay_s = 0.0
        """How long to hold each request before answering (a slow or hung webhook)."""

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def record(self, received: Received) -> None:
        with self._lock:
            self._received.append(received)

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def wait_for(self, predicate: Callable[[list[Received]], bool], timeout_s: float = 30.0
                 ) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.received
            if predicate(got):
                return got
            time.sleep(0.05)
        raise AssertionError(f"the receiver did not get what was expected in {timeout_s} s: "
                             f"{[(r.path, r.body[:200]) for r in self.received]}")


@contextmanager
def receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            me = holder[0]
            me.record(Received(self.path, dict(self.headers.items()), body, time.time()))
            if me.delay_s:
                time.sleep(me.delay_s)
            self.send_response(me.status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder.append(Receiver(server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
