"""Senders: how one encoded batch reaches the server (``HttpSender``) or a test (``MemorySender``).

A sender never raises: it turns every outcome into a ``SendResult`` the transport acts on
(``ACKED``, ``RETRY`` with an optional ``Retry-After``, ``REJECTED``, ``DENIED``).
"""

from __future__ import annotations

import collections
import contextlib
import email.utils
import enum
import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ampscope import wire

__all__ = ["HttpSender", "MemorySender", "Outcome", "SendResult", "Sender"]


class Outcome(enum.Enum):
    ACKED = "acked"
    RETRY = "retry"
    REJECTED = "rejected"
    DENIED = "denied"  # 401, 403, 410: this client may not send here; retrying cannot help


DENIED_STATUSES = frozenset({401, 403, 410})


@dataclass(frozen=True)
class SendResult:
    outcome: Outcome
    status: int | None = None
    retry_after: float | None = None
    detail: str = ""
    body: bytes = b""
    """The whole answer of a 2xx or a refusal (``detail`` is its first 500 characters)."""


class Sender(Protocol):
    """Delivers one encoded batch within about ``timeout`` s, never raising. An optional
    ``abort()``, callable from another thread, ends the request in flight (``Transport.close``)."""

    def send(self, body: bytes, timeout: float) -> SendResult: ...

    def close(self) -> None: ...


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class HttpSender:
    """POSTs batches to ``{server}/api/ingest`` over one keep-alive connection; socket timeouts
    bound every connect and read. ``token`` (``Authorization: Bearer``) stays out of ``repr`` and
    every message."""

    def __init__(self, server: str, *, path: str = "/api/ingest",
                 token: str | None = None) -> None:
        if token is not None and (not token or any(c in token for c in "\r\n")):
            raise ValueError("token must be a non-empty single-line string")
        self._headers = {"Content-Type": "application/json"}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        url = urllib.parse.urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(
                f"server must be an http(s) URL like http://127.0.0.1:8765, not {server!r}"
            )
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port
        self._path = url.path.rstrip("/") + path
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=timeout)
        self._conn.timeout = timeout
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout)
        return self._conn

    def send(self, body: bytes, timeout: float) -> SendResult:
        try:
            conn = self._connection(timeout)
            conn.request("POST", self._path, body=body, headers={
                **self._headers, "Content-Length": str(len(body))})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return SendResult(Outcome.RETRY, detail=f"{type(exc).__name__}: {exc}")
        if resp.will_close:
            self.close()
        status = resp.status
        detail = data[:500].decode("utf-8", "replace")
        if 200 <= status < 300:
            return SendResult(Outcome.ACKED, status, detail=detail, body=data)
        if status in (408, 429) or status >= 500:
            after = _retry_after(resp.getheader("Retry-After"))
            return SendResult(Outcome.RETRY, status, after, detail)
        if status in DENIED_STATUSES:
            return SendResult(Outcome.DENIED, status, detail=detail)
        return SendResult(Outcome.REJECTED, status, detail=detail, body=data)

    def __repr__(self) -> str:
        scheme = "https" if self._https else "http"
        return f"HttpSender({scheme}://{self._host}:{self._port}{self._path})"

    def abort(self) -> None:
        """From another thread: end the request in flight now (it returns ``RETRY``)."""
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class MemorySender:
    """An in-process sender keeping every body (tests, embedding); ``script``: results."""

    def __init__(self, script: Sequence[SendResult] = ()) -> None:
        self.bodies: list[bytes] = []
        self._script = collections.deque(script)
        self._lock = threading.Lock()
        self.closed = False

    def send(self, body: bytes, timeout: float) -> SendResult:
        with self._lock:
            self.bodies.append(body)
            return self._script.popleft() if self._script else SendResult(Outcome.ACKED, 200)

    def payloads(self) -> list[dict[str, Any]]:
        """Every body received, parsed, with packed statistics unpacked as the server reads them."""
        with self._lock:
            return [wire.unpack_payload(json.loads(b)) for b in self.bodies]

    def close(self) -> None:
        self.closed = True
