"""Delivery of step records to the server, off the training thread.

The training thread only calls ``Transport.put``: an append to a bounded in-memory deque (no I/O,
no lock, no wait). A daemon sender thread wakes every ``flush_interval`` seconds (or as soon as a
full batch is queued), turns queued items into wire records, and hands encoded batches to a
``Sender``:

* ``Outcome.ACKED`` (HTTP 2xx): the batch's records are acknowledged.
* ``Outcome.RETRY`` (connection error, timeout, 5xx, 408, 429): the same batch is sent again after a
  capped exponential backoff with jitter, or after ``Retry-After`` when the server gives one.
* ``Outcome.REJECTED`` (any other 4xx): the batch is dropped and counted; the first rejection is
  logged, later ones only counted, so a misconfigured client cannot flood the log.

Accounting, at every moment: ``produced = acknowledged + dropped + pending``. Records are dropped
(and counted) when the queue is full (the oldest go first), when a batch is rejected, when there
is no server, and when ``close`` runs out of time. Every drop goes through ``Transport._spill``, the
seam where the disk spool (a later issue) will take them instead.

After ``os.fork`` the child's copy of every transport is disabled: the sender thread does not exist
there, and a DataLoader worker must neither duplicate the stream nor wait on the parent's thread.
"""

from __future__ import annotations

import collections
import email.utils
import enum
import http.client
import json
import logging
import os
import random
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "EncodeBatch",
    "HttpSender",
    "MemorySender",
    "Outcome",
    "Outgoing",
    "SendResult",
    "Sender",
    "Transport",
    "TransportStats",
]

logger = logging.getLogger("ampscope")


class Outcome(enum.Enum):
    ACKED = "acked"
    RETRY = "retry"
    REJECTED = "rejected"


@dataclass(frozen=True)
class SendResult:
    outcome: Outcome
    status: int | None = None
    retry_after: float | None = None
    detail: str = ""


class Sender(Protocol):
    """Delivers one encoded batch; must return within about ``timeout`` seconds and never raise."""

    def send(self, body: bytes, timeout: float) -> SendResult: ...

    def close(self) -> None: ...


class Outgoing(Protocol):
    """A queued item; ``to_wire`` runs on the sender thread (it may wait for a device copy)."""

    def to_wire(self) -> dict[str, Any]: ...


EncodeBatch = Callable[[list[dict[str, Any]], bool, bool], bytes]
"""(records, include_layer_table, final) -> request body."""


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
    """POSTs JSON batches to ``{server}/api/ingest`` over one keep-alive ``http.client`` connection.

    Socket timeouts bound every connect and read, so a blackholed server costs at most ``timeout``.
    """

    def __init__(self, server: str, *, path: str = "/api/ingest") -> None:
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
                "Content-Type": "application/json", "Content-Length": str(len(body))})
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
            return SendResult(Outcome.ACKED, status, detail=detail)
        if status in (408, 429) or status >= 500:
            after = _retry_after(resp.getheader("Retry-After"))
            return SendResult(Outcome.RETRY, status, after, detail)
        return SendResult(Outcome.REJECTED, status, detail=detail)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class MemorySender:
    """An in-process sender that keeps every body it is given: for tests and embedding.

    ``script`` optionally supplies the results to return, in order; once it is exhausted (or when
    none is given) every send is acknowledged.
    """

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
        """Every body received, parsed as JSON (the tags stay strings)."""
        with self._lock:
            return [json.loads(b) for b in self.bodies]

    def close(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class TransportStats:
    produced: int
    acknowledged: int
    dropped: int
    pending: int
    failed_requests: int


@dataclass
class _Counters:
    """Each counter has a single writer thread, so plain ints need no lock."""

    produced: int = 0  # training thread
    dropped_full: int = 0  # training thread
    dropped_closing: int = 0  # the thread calling close()
    acknowledged: int = 0  # sender thread
    dropped_sender: int = 0  # sender thread
    failed_requests: int = 0  # sender thread
    logged_rejection: bool = field(default=False)


_LIVE: weakref.WeakSet[Transport] = weakref.WeakSet()


def _disable_all_after_fork() -> None:
    for transport in list(_LIVE):
        transport._forked = True


os.register_at_fork(after_in_child=_disable_all_after_fork)


class Transport:
    """Bounded queue plus sender thread; see the module docstring for delivery and accounting."""

    def __init__(
        self,
        sender: Sender | None,
        encode: EncodeBatch,
        *,
        max_queue: int = 4096,
        batch_size: int = 256,
        flush_interval: float = 0.2,
        request_timeout: float = 10.0,
        backoff_base: float = 0.1,
        backoff_cap: float = 5.0,
        max_retry_after: float = 60.0,
    ) -> None:
        self._sender = sender
        self._encode = encode
        self._max_queue = max_queue
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._request_timeout = request_timeout
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._max_retry_after = max_retry_after
        self._queue: collections.deque[Outgoing] = collections.deque()
        self._c = _Counters()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._deadline = float("inf")
        self._layers_acked = False
        self._closed = False
        self._forked = False
        self._thread: threading.Thread | None = None
        if sender is not None:
            self._thread = threading.Thread(target=self._run, name="ampscope-sender", daemon=True)
            self._thread.start()
        _LIVE.add(self)

    # -- training thread -------------------------------------------------------------------------
    def put(self, item: Outgoing) -> None:
        """Enqueue one record: never blocks, never does I/O. Drops the oldest when full."""
        c = self._c
        c.produced += 1
        if self._thread is None or self._closed or self._forked:
            c.dropped_full += 1
            self._spill([item])
            return
        queue = self._queue
        if len(queue) >= self._max_queue:
            try:
                oldest = queue.popleft()
            except IndexError:  # the sender emptied it meanwhile
                pass
            else:
                c.dropped_full += 1
                self._spill([oldest])
        queue.append(item)
        if len(queue) >= self._batch_size:
            self._wake.set()

    def stats(self) -> TransportStats:
        c = self._c
        dropped = c.dropped_full + c.dropped_closing + c.dropped_sender
        return TransportStats(
            produced=c.produced,
            acknowledged=c.acknowledged,
            dropped=dropped,
            pending=c.produced - c.acknowledged - dropped,
            failed_requests=c.failed_requests,
        )

    def close(self, timeout: float) -> None:
        """Flush everything queued, ending with a ``final`` batch; return within ``timeout`` s.

        Whatever is still queued when time runs out is dropped (counted). A request already in
        flight ends by its own socket timeout, which is bounded by the same deadline.
        """
        if self._closed:
            return
        self._closed = True
        if self._thread is None or self._forked:
            return
        self._deadline = time.monotonic() + max(0.0, timeout)
        self._closing.set()
        self._wake.set()
        self._thread.join(max(0.0, timeout))
        self._drain_as_dropped(counter="closing")

    # -- sender thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._forked:
                closing = self._closing.is_set()
                if not closing:
                    self._wake.wait(self._flush_interval)
                    self._wake.clear()
                    closing = self._closing.is_set()
                batch = self._take()
                final = closing and not self._queue
                if batch or final:
                    out_of_time = self._deliver(batch, final)
                    if out_of_time:
                        self._drain_as_dropped(counter="sender")
                        break
                if final:
                    break
        except Exception:  # never let the thread die silently with records counted as pending
            logger.exception("ampscope sender thread failed; dropping what is queued")
            self._drain_as_dropped(counter="sender")
        finally:
            assert self._sender is not None
            self._sender.close()

    def _take(self) -> list[Outgoing]:
        batch: list[Outgoing] = []
        while len(batch) < self._batch_size:
            try:
                batch.append(self._queue.popleft())
            except IndexError:
                break
        return batch

    def _deliver(self, batch: list[Outgoing], final: bool) -> bool:
        """Send one batch until acknowledged, rejected or out of time; True if out of time."""
        assert self._sender is not None
        c = self._c
        records: list[dict[str, Any]] = []
        for item in batch:
            try:
                records.append(item.to_wire())
            except Exception:
                logger.exception("ampscope could not encode a record; dropping it")
                c.dropped_sender += 1
        include_layers = not self._layers_acked
        body = self._encode(records, include_layers, final)
        tries = 0
        while True:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                c.dropped_sender += len(records)
                self._spill(records)
                return True
            result = self._sender.send(body, min(self._request_timeout, remaining))
            if result.outcome is Outcome.ACKED:
                c.acknowledged += len(records)
                self._layers_acked = self._layers_acked or include_layers
                return False
            c.failed_requests += 1
            if result.outcome is Outcome.REJECTED:
                c.dropped_sender += len(records)
                self._spill(records)
                if not c.logged_rejection:
                    c.logged_rejection = True
                    logger.error(
                        "ampscope server rejected a batch of %d records with HTTP %s: %s "
                        "(further rejections are only counted)",
                        len(records), result.status, result.detail)
                return False
            logger.debug("ampscope send failed (%s %s); will retry",
                         result.status, result.detail)
            if result.retry_after is not None:
                delay = min(result.retry_after, self._max_retry_after)
            else:
                ceiling = min(self._backoff_cap, self._backoff_base * 2.0**tries)
                delay = ceiling * random.uniform(0.5, 1.0)  # jitter: clients must not sync up
            tries += 1
            delay = min(delay, max(0.0, self._deadline - time.monotonic()))
            if self._closing.is_set():
                time.sleep(delay)
            else:
                # Wakes early when close() starts, so the remaining budget goes to the final flush.
                self._closing.wait(delay)

    def _drain_as_dropped(self, counter: str) -> None:
        drained = self._take_all()
        if not drained:
            return
        if counter == "closing":
            self._c.dropped_closing += len(drained)
        else:
            self._c.dropped_sender += len(drained)
        self._spill(drained)

    def _take_all(self) -> list[Outgoing]:
        items: list[Outgoing] = []
        while True:
            try:
                items.append(self._queue.popleft())
            except IndexError:
                return items

    def _spill(self, items: Sequence[object]) -> None:
        """Records that could not be delivered. Today they are only counted (by the caller); the
        disk spool will append them here and ``ampscope sync`` will replay them."""
