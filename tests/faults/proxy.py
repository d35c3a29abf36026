"""A small TCP fault proxy on 127.0.0.1 for the fault tests.

Modes: ``forward`` (pass bytes both ways), ``blackhole`` (accept, read, never answer),
``refuse`` (close every new connection at once). ``drop_responses(n)``: the next ``n``
requests are forwarded whole and the server's full answer is read and thrown away, then the client's
connection is cut: the server committed, the client never saw the ack.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Literal

Mode = Literal["forward", "blackhole", "refuse"]


def _read_response(upstream: socket.socket) -> bytes:
    """One HTTP/1.1 response with a Content-Length (what uvicorn sends for the ingest answer)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = upstream.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = upstream.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


class FaultProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.mode: Mode = "forward"
        self.dropped = 0
        self._drop = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def drop_responses(self, n: int) -> None:
        with self._lock:
            self._drop += n

    def _take_drop(self) -> bool:
        with self._lock:
            if self._drop > 0:
                self._drop -= 1
                return True
            return False

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.mode == "refuse":
                client.close()
                continue
            self._conns.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            client.settimeout(30)
            while not self._stop.is_set():
                request = self._read_request(client)
                if not request:
                    return
                if self.mode == "blackhole":
                    self._stop.wait(60)
                    return
                if upstream is None:
                    upstream = socket.create_connection(("127.0.0.1", self.upstream_port), 10)
                upstream.sendall(request)
                response = _read_response(upstream)
                if not response:
                    return
                if self._take_drop():
                    self.dropped += 1
                    return  # the server committed; the client loses the answer with the connection
                client.sendall(response)
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()

    @staticmethod
    def _read_request(client: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = client.recv(65536)
            if not chunk:
                return b""
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = client.recv(65536)
            if not chunk:
                return b""
            body += chunk
        return head + b"\r\n\r\n" + body

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()
        self._thread.join(2)
