"""Delivery of step records to the server, off the training thread; the disk spool when it is away.

The training thread only calls ``Transport.put``, an append to a bounded deque (no I/O, lock or
wait). A sender thread wakes every ``flush_interval`` s and hands batches to a ``Sender``:
``ACKED``; ``RETRY`` (connection, timeout, 5xx, 408, 429: capped jittered backoff or
``Retry-After``); ``REJECTED`` (other 4xx: dropped, counted, the first logged; a 422 on the
``schema_version`` is resent one version lower); ``DENIED`` (401, 403, 410: sending stops, one
warning, all spooled). A batch unacknowledged after ``retry_window`` s turns ``DIRECT`` into
``SPOOLING``: it and what follows go to the disk spool, replayed in order once a probe is
acknowledged (without a spool it is retried until ``close``). Always ``produced = acknowledged +
spooled + dropped + pending``; a full queue drops its oldest on the training thread, which never
writes to disk. ``close(timeout)`` returns in time even against a blackholed server; after
``os.fork`` the child's transports are off.
"""

from __future__ import annotations

import collections
import enum
import logging
import os
import random
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ampscope.negotiate import Negotiation
from ampscope.senders import HttpSender, MemorySender, Outcome, Sender, SendResult
from ampscope.spool import Spool, default_spool_dir

__all__ = [
    "EncodeBatch",
    "HttpSender",
    "MemorySender",
    "Mode",
    "Outcome",
    "Outgoing",
    "SendResult",
    "Sender",
    "Transport",
    "TransportStats",
    "lower_thread_priority",
]

logger = logging.getLogger("ampscope")


# How often the sender thread wakes (``watch(flush_interval=)``): live latency within its
# budget, against requests and steps slowed by the sender's batch, which competes with training
# for the GIL and the cores. Why 0.5: docs/hook-cost.md#the-senders-flush-interval.
DEFAULT_FLUSH_INTERVAL = 0.5

SENDER_NICENESS = 10
"""How much lower than the process the sender thread runs (Linux ``nice`` steps, up to 19): at
training's priority it takes a core from an OpenMP thread and the whole parallel op waits at its
barrier; lower, it runs when a core is idle (records carry their own timestamps)."""


def lower_thread_priority(niceness: int = SENDER_NICENESS) -> bool:
    """Raise the calling thread's nice value by ``niceness`` (up to 19); True when done. Linux
    only (``setpriority(PRIO_PROCESS, tid)`` reaches one thread there); errors change nothing."""
    if not sys.platform.startswith("linux") or niceness <= 0:
        return False
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid,
                       min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
    except OSError:
        return False
    return True


class Mode(enum.Enum):
    DIRECT = "direct"  # batches go straight to the server
    SPOOLING = "spooling"  # the server is away: records go to disk, probes replay the spool


class Outgoing(Protocol):
    """A queued item; ``to_wire`` runs on the sender thread (it may wait for a device copy)."""

    def to_wire(self) -> dict[str, Any]: ...


FLUSH_POLL_S = 0.001
"""How often ``Transport.flush`` looks at the count of pending records."""

EncodeBatch = Callable[[list[dict[str, Any]], bool, bool], bytes]
"""(records, include_layer_table, final) -> request body."""


@dataclass(frozen=True)
class TransportStats:
    """``produced == acknowledged + spooled + dropped + pending`` at every ``stats()`` call."""

    produced: int
    acknowledged: int
    dropped: int
    pending: int  # in memory: queued, or in the sender's hands
    failed_requests: int
    spooled: int = 0  # on disk, not yet acknowledged
    replayed: int = 0  # acknowledged after a stay in the spool (included in ``acknowledged``)


@dataclass
class _Counters:
    """``produced``/``dropped_full``: training thread only, no lock; the rest under ``_lock``."""

    produced: int = 0
    dropped_full: int = 0
    acknowledged: int = 0
    spooled: int = 0
    dropped_sender: int = 0
    replayed: int = 0
    failed_requests: int = 0
    logged_rejection: bool = field(default=False)


_LIVE: weakref.WeakSet[Transport] = weakref.WeakSet()


def _disable_all_after_fork() -> None:
    for transport in list(_LIVE):
        transport._forked = True


os.register_at_fork(after_in_child=_disable_all_after_fork)


class Transport:
    """Bounded queue, sender thread and disk spool. ``spool_dir`` (None:
    ``spool.default_spool_dir()``) is created at the first spooled record; ``spool_max_bytes``
    caps this transport's spool (0: no spool, undeliverable records are dropped)."""

    def __init__(
        self,
        sender: Sender | None,
        encode: EncodeBatch,
        *,
        max_queue: int = 4096,
        batch_size: int = 256,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        request_timeout: float = 10.0,
        backoff_base: float = 0.1,
        backoff_cap: float = 5.0,
        max_retry_after: float = 60.0,
        retry_window: float = 2.0,
        spool_dir: str | os.PathLike[str] | None = None,
        spool_max_bytes: int = 256 * 2**20,
    ) -> None:
        # A zero, negative or NaN interval would spin the sender thread (or never wake it).
        if not 0.0 < flush_interval < float("inf"):
            raise ValueError(f"flush_interval must be a positive number of seconds, got "
                             f"{flush_interval!r}")
        self._sender = sender
        self._encode = encode
        self._max_queue = max_queue
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._request_timeout = request_timeout
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._max_retry_after = max_retry_after
        self._retry_window = retry_window
        self._spool: Spool | None = None
        if spool_max_bytes > 0:
            directory = default_spool_dir() if spool_dir is None else spool_dir
            self._spool = Spool(directory, spool_max_bytes)
        self._queue: collections.deque[Outgoing] = collections.deque()
        self._c = _Counters()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._deadline = float("inf")
        self._send_deadline = float("inf")
        self._mode = Mode.DIRECT if sender is not None else Mode.SPOOLING
        self._next_probe = 0.0
        self._probe_failures = 0
        self._final_done = False
        self._denied = False
        self._announced = False
        self._layers_acked = False
        # The spool keeps bodies as encoded (the newest version): a downgrade learnt here
        # rewrites each one as it is sent, a fresh batch and a replayed frame alike.
        self._negotiation = Negotiation()
        self._closed = False
        self._forked = False
        self._thread: threading.Thread | None = None
        if sender is not None or self._spool is not None:
            self._thread = threading.Thread(target=self._run, name="ampscope-sender", daemon=True)
            self._thread.start()
        _LIVE.add(self)

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def spool(self) -> Spool | None:
        return self._spool

    # -- training thread -------------------------------------------------------------------------
    def put(self, item: Outgoing) -> int:
        """Enqueue without blocking or I/O, dropping the oldest when full; returns the backlog."""
        c = self._c
        c.produced += 1
        if self._thread is None or self._closed or self._forked:
            c.dropped_full += 1
            return 0
        queue = self._queue
        if len(queue) >= self._max_queue:
            try:
                queue.popleft()
            except IndexError:  # the sender emptied it meanwhile
                pass
            else:
                c.dropped_full += 1
        queue.append(item)
        n = len(queue)
        if n >= self._batch_size:
            self._wake.set()
        return n

    def stats(self) -> TransportStats:
        c = self._c
        with self._lock:
            acknowledged, spooled = c.acknowledged, c.spooled
            dropped_sender, replayed, failed = c.dropped_sender, c.replayed, c.failed_requests
        # ``put`` bumps ``produced`` before ``dropped_full``: reading them in the opposite order
        # keeps ``pending`` from ever going negative.
        dropped = c.dropped_full + dropped_sender
        produced = c.produced
        return TransportStats(
            produced=produced,
            acknowledged=acknowledged,
            dropped=dropped,
            pending=produced - acknowledged - spooled - dropped,
            failed_requests=failed,
            spooled=spooled,
            replayed=replayed,
        )

    def flush(self, timeout: float) -> bool:
        """Wake the sender and wait until every record so far has left memory; False after
        ``timeout`` s or without a sender thread. For the end of a phase, never inside a step."""
        deadline = time.monotonic() + max(0.0, timeout)
        while self.stats().pending:
            thread = self._thread
            if (thread is None or not thread.is_alive() or self._closed or self._forked
                    or time.monotonic() >= deadline):
                return False
            self._wake.set()  # each wake sends one batch: wake it again until the queue is empty
            time.sleep(FLUSH_POLL_S)
        return True

    def close(self, timeout: float) -> None:
        """Flush everything, ending with a ``final`` batch, within ``timeout`` s: sending stops
        ``min(1, 0.3 * timeout)`` s early, and what is left in memory is spooled (or dropped)."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None or self._forked:
            return
        timeout = max(0.0, timeout)
        now = time.monotonic()
        self._deadline = now + timeout
        self._send_deadline = self._deadline - min(1.0, 0.3 * timeout)
        self._closing.set()
        self._wake.set()
        self._thread.join(max(0.0, self._send_deadline - time.monotonic()))
        abort = getattr(self._sender, "abort", None)
        if self._thread.is_alive() and callable(abort):
            abort()  # a request begun before close() may have a longer socket timeout
        self._thread.join(max(0.0, self._deadline - time.monotonic()))
        if self._thread.is_alive():  # stuck beyond every bound: save what it has not taken
            self._spill(self._take_all(), final=False)

    # -- sender thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        lower_thread_priority()
        try:
            while not self._forked:
                closing = self._closing.is_set()
                if not closing:
                    self._wake.wait(self._idle_wait())
                    self._wake.clear()
                    closing = self._closing.is_set()
                if self._mode is Mode.SPOOLING:
                    self._spooling_round(closing)
                if self._mode is Mode.DIRECT:
                    batch = self._take()
                    final = closing and not self._queue
                    if batch or final:
                        self._deliver(batch, final)
                        self._final_done = self._final_done or final
                if closing and (self._final_done or time.monotonic() >= self._send_deadline):
                    self._spill(self._take_all(), final=not self._final_done)
                    break
        except Exception:  # never let the thread die silently with records counted as pending
            logger.exception("ampscope sender thread failed; spooling what is queued")
            self._spill(self._take_all(), final=False)
        finally:
            if self._sender is not None:
                self._sender.close()
            if self._spool is not None:
                self._spool.close()

    def _idle_wait(self) -> float:
        if self._mode is Mode.SPOOLING and self._sender is not None and not self._denied:
            return max(0.0, min(self._flush_interval, self._next_probe - time.monotonic()))
        return self._flush_interval

    def _spooling_round(self, closing: bool) -> None:
        """Queue to disk, then replay the spool when a probe is due (every time when closing)."""
        self._spill(self._take_all(), final=False)
        if self._sender is not None and not self._denied and (
                closing or time.monotonic() >= self._next_probe):
            self._replay()
        if self._mode is Mode.SPOOLING and closing:
            self._spill(self._take_all(), final=not self._final_done)
            self._final_done = True

    def _replay(self) -> None:
        """Send the spool's frames oldest first until it is empty (→ DIRECT) or a send fails."""
        assert self._sender is not None and self._spool is not None
        c = self._c
        while True:
            if len(self._queue) >= self._batch_size:  # keep memory bounded and order intact
                self._spill(self._take_all(), final=False)
            head = self._spool.head()
            if head is None:
                self._mode = Mode.DIRECT
                self._probe_failures = 0
                return
            body, n = head
            if body is None:
                logger.error("ampscope spool frame of %d records is unreadable; dropping it", n)
                with self._lock:
                    self._spool.ack()
                    c.spooled -= n
                    c.dropped_sender += n
                continue
            remaining = self._send_deadline - time.monotonic()
            if remaining <= 0:
                return
            body = self._negotiation.prepare(body)
            result = self._sender.send(body, min(self._request_timeout, remaining))
            if result.outcome is Outcome.ACKED:
                with self._lock:
                    self._spool.ack()
                    c.spooled -= n
                    c.acknowledged += n
                    c.replayed += n
                self._layers_acked = True  # every spooled frame carries the layer table
                self._probe_failures = 0
                self._negotiation.accepted()
                continue
            with self._lock:
                c.failed_requests += 1
            if (result.outcome is Outcome.REJECTED
                    and self._negotiation.refused(body, result) is not None):
                continue  # the same frame again, one version lower (``prepare``)
            if result.outcome is Outcome.REJECTED:
                with self._lock:
                    self._spool.ack()
                    c.spooled -= n
                    c.dropped_sender += n
                self._log_rejection(n, result)
                continue
            if result.outcome is Outcome.DENIED:
                self._deny(result)
                return
            self._next_probe = time.monotonic() + self._backoff(self._probe_failures, result)
            self._probe_failures += 1
            return

    def _backoff(self, tries: int, result: SendResult) -> float:
        if result.retry_after is not None:
            return min(result.retry_after, self._max_retry_after)
        ceiling = min(self._backoff_cap, self._backoff_base * 2.0**tries)
        return ceiling * random.uniform(0.5, 1.0)  # jitter: clients must not sync up

    def _take(self) -> list[Outgoing]:
        batch: list[Outgoing] = []
        while len(batch) < self._batch_size:
            try:
                batch.append(self._queue.popleft())
            except IndexError:
                break
        return batch

    def _take_all(self) -> list[Outgoing]:
        items: list[Outgoing] = []
        while True:
            try:
                items.append(self._queue.popleft())
            except IndexError:
                return items

    def _wire(self, items: Sequence[Outgoing]) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for item in items:
            try:
                records.append(item.to_wire())
            except Exception:
                logger.exception("ampscope could not encode a record; dropping it")
                with self._lock:
                    self._c.dropped_sender += 1
        return records

    def _deliver(self, batch: list[Outgoing], final: bool) -> None:
        """Send one batch until acknowledged or rejected; past the retry window, spool it."""
        assert self._sender is not None
        c = self._c
        records = self._wire(batch)
        include_layers = not self._layers_acked
        body = self._negotiation.prepare(self._encode(records, include_layers, final))
        started = time.monotonic()
        tries = 0
        while True:
            remaining = self._send_deadline - time.monotonic()
            if remaining <= 0:  # closing: nothing will be sent after this batch
                self._spool_records(records, final or not self._queue)
                return
            result = self._sender.send(body, min(self._request_timeout, remaining))
            if result.outcome is Outcome.ACKED:
                with self._lock:
                    c.acknowledged += len(records)
                self._layers_acked = self._layers_acked or include_layers
                self._negotiation.accepted()
                return
            with self._lock:
                c.failed_requests += 1
            if result.outcome is Outcome.REJECTED:
                lower = self._negotiation.refused(body, result)
                if lower is not None:  # an older server: at once, one version lower
                    body = lower
                    continue
                with self._lock:
                    c.dropped_sender += len(records)
                self._log_rejection(len(records), result)
                return
            if result.outcome is Outcome.DENIED:
                self._deny(result)
                self._spool_records(records, final)
                return
            logger.debug("ampscope send failed (%s %s); will retry", result.status, result.detail)
            delay = self._backoff(tries, result)
            tries += 1
            now = time.monotonic()
            if self._spool is not None and now + delay - started > self._retry_window:
                self._next_probe = now + delay
                self._probe_failures = tries
                self._spool_records(records, final)
                return
            delay = min(delay, max(0.0, self._send_deadline - now))
            if self._closing.is_set():
                time.sleep(delay)
            else:
                # Wakes early when close() starts, so the remaining budget goes to the final flush.
                self._closing.wait(delay)

    def _deny(self, result: SendResult) -> None:
        """Stop sending for good: spool from now on, never probe, warn once."""
        if not self._denied:
            self._denied = True
            logger.warning(
                "ampscope server refused this client with HTTP %s: %s; sending stopped, records "
                "go to the spool%s", result.status, result.detail,
                "" if self._spool is None else f" ({self._spool.directory})")
        self._mode = Mode.SPOOLING
        self._next_probe = float("inf")

    def _log_rejection(self, n: int, result: SendResult) -> None:
        if not self._c.logged_rejection:
            self._c.logged_rejection = True
            logger.error(
                "ampscope server rejected a batch of %d records with HTTP %s: %s "
                "(further rejections are only counted)", n, result.status, result.detail)

    def _spill(self, items: Sequence[Outgoing], final: bool) -> None:
        """Queued items to the spool in ``batch_size`` frames, ``final`` marking the last."""
        if not items and not final:
            return
        if self._spool is None:
            with self._lock:
                self._c.dropped_sender += len(items)
            return
        chunks = [items[i : i + self._batch_size] for i in range(0, len(items), self._batch_size)]
        for i, chunk in enumerate(chunks or [[]]):
            self._spool_records(self._wire(chunk), final and i == max(0, len(chunks) - 1))

    def _spool_records(self, records: list[dict[str, Any]], final: bool) -> None:
        """Encoded records to disk (counted spooled) or, failing that, counted dropped."""
        n = len(records)
        self._final_done = self._final_done or final
        if self._spool is not None:
            self._mode = Mode.SPOOLING
        body = self._encode(records, True, final) if self._spool is not None else b""
        with self._lock:
            if self._spool is not None and self._spool.append(body, n):
                self._c.spooled += n
                spooled = True
            else:
                self._c.dropped_sender += n
                spooled = False
        if spooled and n and not self._announced:
            self._announce_spool()

    def _announce_spool(self) -> None:
        """Say once where records go and how they will reach a server (``_deny`` says it too)."""
        self._announced = True
        assert self._spool is not None
        where = self._spool.directory
        if self._sender is None:
            logger.info("ampscope is offline: records go to the spool at %s; upload them with "
                        "`ampscope sync %s --server URL`", where, where)
        elif not self._denied:
            logger.warning("ampscope server is not answering; records go to the spool at %s "
                           "and are sent from there once it is back (or with `ampscope sync "
                           "%s --server URL`)", where, where)
