"""A real HTTP server on 127.0.0.1 that records POST bodies and answers as a test scripts it."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b'{"accepted": 0}'


class StubServer:
    def __init__(self, script: list[Reply] | None = None) -> None:
        self.script: deque[Reply] = deque(script or [])
        self.requests: list[tuple[float, str, bytes]] = []  # (monotonic time, path, body)
        self.headers: list[dict[str, str]] = []  # of each request, in order
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                stub.requests.append((time.monotonic(), self.path, body))
                stub.headers.append(dict(self.headers.items()))
                reply = stub.script.popleft() if stub.script else Reply()
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def payloads(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, _, body in self.requests]

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@contextmanager
def blackhole() -> Iterator[str]:
    """A listening socket that accepts connections (kernel backlog) and never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()
