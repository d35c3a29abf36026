from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ampscope.spool import Frame, scan, spool_files
from ampscope.transport import (
    SENDER_NICENESS,
    HttpSender,
    MemorySender,
    Mode,
    Outcome,
    SendResult,
    Transport,
    TransportStats,
    lower_thread_priority,
)
from tests.client_hook.httpstub import Reply, StubServer, blackhole


@pytest.fixture(autouse=True)
def spool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every transport here spools under the test's own directory, never the user's cache."""
    directory = tmp_path / "spool"
    monkeypatch.setenv("AMPSCOPE_SPOOL_DIR", str(directory))
    return directory


@dataclass
class Item:
    n: int

    def to_wire(self) -> dict[str, Any]:
        return {"seq": self.n}


def encode(records: list[dict[str, Any]], include_layers: bool, final: bool) -> bytes:
    return json.dumps({"layers": ["t"] if include_layers else None, "records": records,
                       "final": final}).encode()


def fast(sender: Any, **kw: Any) -> Transport:
    kw.setdefault("flush_interval", 0.02)
    kw.setdefault("backoff_base", 0.01)
    return Transport(sender, encode, **kw)


def balanced(s: TransportStats) -> bool:
    counts = (s.acknowledged, s.spooled, s.dropped, s.pending, s.replayed)
    return s.produced == s.acknowledged + s.spooled + s.dropped + s.pending and min(counts) >= 0


def spooled_payloads(directory: Path) -> list[dict[str, Any]]:
    if not directory.exists():
        return []
    frames = [f for p in spool_files(directory) for f in scan(p) if isinstance(f, Frame)]
    return [json.loads(f.body) for f in frames]


def seqs(payloads: list[dict[str, Any]]) -> list[int]:
    return [r["seq"] for p in payloads for r in p["records"]]


class TestDelivery:
    def test_batches_are_acked_and_the_layer_table_stops_after_an_ack(self) -> None:
        sender = MemorySender()
        t = fast(sender, batch_size=4)
        for i in range(10):
            t.put(Item(i))
        t.close(5.0)
        payloads = sender.payloads()
        assert seqs(payloads) == list(range(10))
        assert payloads[0]["layers"] == ["t"] and all(p["layers"] is None for p in payloads[1:])
        assert payloads[-1]["final"] is True and not any(p["final"] for p in payloads[:-1])
        assert t.stats() == TransportStats(10, 10, 0, 0, 0)
        assert sender.closed

    def test_layer_table_repeats_until_a_batch_is_acknowledged(self) -> None:
        sender = MemorySender([SendResult(Outcome.RETRY, 503), SendResult(Outcome.RETRY, 503)])
        t = fast(sender)
        t.put(Item(0))
        t.close(5.0)
        assert [p["layers"] for p in sender.payloads()] == [["t"]] * 3
        assert t.stats().failed_requests == 2 and t.stats().acknowledged == 1

    def test_close_without_records_sends_an_empty_final_batch(self) -> None:
        sender = MemorySender()
        fast(sender).close(5.0)
        assert sender.payloads() == [{"layers": ["t"], "records": [], "final": True}]

    @pytest.mark.parametrize("interval", [0.0, -1.0, math.nan, math.inf])
    def test_a_flush_interval_that_would_spin_or_never_wake_is_refused(
            self, interval: float) -> None:
        with pytest.raises(ValueError, match="flush_interval must be a positive number"):
            Transport(MemorySender(), encode, flush_interval=interval)

    def test_no_server_and_no_spool_counts_everything_dropped(self) -> None:
        t = fast(None, spool_max_bytes=0)
        for i in range(3):
            t.put(Item(i))
        t.close(1.0)
        assert t.stats() == TransportStats(3, 0, 3, 0, 0)

    def test_offline_mode_writes_everything_to_the_spool(self, spool_dir: Path) -> None:
        t = fast(None, batch_size=2)
        for i in range(5):
            t.put(Item(i))
        start = time.monotonic()
        t.close(5.0)
        assert time.monotonic() - start < 1.0
        assert t.stats() == TransportStats(5, 0, 0, 0, 0, spooled=5)
        payloads = spooled_payloads(spool_dir)
        assert seqs(payloads) == [0, 1, 2, 3, 4]
        assert all(p["layers"] == ["t"] for p in payloads)  # every frame stands alone
        assert [p["final"] for p in payloads][-1] is True and not any(
            p["final"] for p in payloads[:-1])


class TestHttp:
    def test_posts_to_the_ingest_path(self) -> None:
        with StubServer() as server:
            t = fast(HttpSender(server.url))
            t.put(Item(0))
            t.close(5.0)
        assert [path for _, path, _ in server.requests] == ["/api/ingest"]
        assert seqs(server.payloads()) == [0]

    def test_5xx_is_retried_with_backoff(self) -> None:
        with StubServer([Reply(503), Reply(500)]) as server:
            t = fast(HttpSender(server.url))
            t.put(Item(0))
            t.close(5.0)
        assert len(server.requests) == 3 and seqs(server.payloads()[-1:]) == [0]
        assert t.stats() == TransportStats(1, 1, 0, 0, 2)

    def test_retry_after_is_honoured(self) -> None:
        with StubServer([Reply(429, {"Retry-After": "1"})]) as server:
            t = fast(HttpSender(server.url))
            t.put(Item(0))
            deadline = time.monotonic() + 5
            while t.stats().acknowledged == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            t.close(5.0)
        first, second = server.requests[0][0], server.requests[1][0]
        assert second - first >= 0.95
        assert t.stats().acknowledged == 1

    def test_4xx_is_not_retried_and_logged_once(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.ERROR, logger="ampscope")
        with StubServer([Reply(400, body=b'{"detail":"bad"}'), Reply(422)]) as server:
            t = fast(HttpSender(server.url), batch_size=1)
            t.put(Item(0))
            t.put(Item(1))
            t.close(5.0)
        assert t.stats() == TransportStats(2, 0, 2, 0, 2)
        assert len(server.requests) == 2  # no retries; the second batch is the final one
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 1 and "rejected a batch of 1 records with HTTP 400" in messages[0]

    def test_close_returns_in_time_when_the_server_is_blackholed(self) -> None:
        with blackhole() as url:
            t = fast(HttpSender(url))
            for i in range(5):
                t.put(Item(i))
            time.sleep(0.1)  # the first request is in flight, waiting for an answer
            start = time.monotonic()
            t.close(1.0)
            assert time.monotonic() - start < 1.5
        stats = t.stats()
        assert stats == TransportStats(5, 0, 0, 0, stats.failed_requests, spooled=5)

    def test_unreachable_server_without_a_spool_is_retried_until_close(self) -> None:
        with blackhole() as url:
            pass  # closed: connections are refused
        t = fast(HttpSender(url), spool_max_bytes=0)
        t.put(Item(0))
        time.sleep(0.2)
        start = time.monotonic()
        t.close(0.5)
        assert time.monotonic() - start < 1.0
        stats = t.stats()
        assert stats == TransportStats(1, 0, 1, 0, stats.failed_requests)
        assert stats.failed_requests >= 2

    def test_bad_url_is_refused(self) -> None:
        with pytest.raises(ValueError, match="server must be an http"):
            HttpSender("127.0.0.1:8765")


class _Gate(MemorySender):
    """Blocks every send until released, so the queue fills up behind it."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def send(self, body: bytes, timeout: float) -> SendResult:
        self.release.wait(timeout)
        return super().send(body, timeout)


class TestQueue:
    def test_full_queue_drops_the_oldest_and_counts_it(self) -> None:
        gate = _Gate()
        t = fast(gate, max_queue=5, batch_size=2)
        t.put(Item(0))
        time.sleep(0.1)  # item 0 is now in flight
        for i in range(1, 21):
            t.put(Item(i))
            assert balanced(t.stats())
        assert t.stats().dropped == 15
        gate.release.set()
        t.close(5.0)
        assert seqs(gate.payloads()) == [0, 16, 17, 18, 19, 20]
        assert t.stats() == TransportStats(21, 6, 15, 0, 0)

    def test_enqueue_is_fast(self) -> None:
        t = fast(MemorySender(), max_queue=100_000, batch_size=100_000, flush_interval=10.0)
        times = []
        for i in range(20_000):
            start = time.perf_counter_ns()
            t.put(Item(i))
            times.append(time.perf_counter_ns() - start)
        t.close(5.0)
        times.sort()
        assert times[int(len(times) * 0.99)] < 100_000  # p99 ≤ 100 µs (DESIGN.md §8)


class TestFlush:
    def test_flush_wakes_the_sender_until_the_queue_is_empty(self) -> None:
        sender = MemorySender()
        t = fast(sender, batch_size=4, flush_interval=60.0)  # 3 batches, no timer wake
        for i in range(10):
            t.put(Item(i))
        assert t.flush(10.0)
        assert seqs(sender.payloads()) == list(range(10))
        assert t.stats() == TransportStats(10, 10, 0, 0, 0)
        t.put(Item(10))  # a flush is not a close: records keep flowing
        t.close(5.0)
        assert seqs(sender.payloads()) == list(range(11))

    def test_a_send_that_does_not_return_makes_flush_false_after_its_timeout(self) -> None:
        gate = _Gate()
        t = fast(gate, flush_interval=60.0)
        t.put(Item(0))
        assert t.flush(0.2) is False
        assert t.stats().pending == 1
        gate.release.set()
        assert t.flush(10.0)
        assert t.stats() == TransportStats(1, 1, 0, 0, 0)
        t.close(5.0)

    def test_with_the_server_away_flush_spools(self, spool_dir: Path) -> None:
        sender = _Switch()
        sender.down.set()
        t = fast(sender, flush_interval=60.0, retry_window=0.0)
        for i in range(3):
            t.put(Item(i))
        assert t.flush(10.0)
        assert t.stats().spooled == 3 and t.stats().pending == 0
        t.close(0.1)

    def test_nothing_to_send_or_a_closed_transport(self) -> None:
        assert fast(MemorySender()).flush(1.0)  # empty: nothing pending
        dropped = fast(None, spool_max_bytes=0)  # no thread: a put is counted dropped
        dropped.put(Item(0))
        assert dropped.flush(1.0) and dropped.stats().dropped == 1
        closed = fast(MemorySender())
        closed.put(Item(0))
        closed.close(5.0)
        assert closed.flush(1.0) and closed.stats().acknowledged == 1


def test_forked_child_neither_sends_nor_waits() -> None:
    sender = MemorySender()
    t = fast(sender)
    pid = os.fork()
    if pid == 0:  # child: must not deliver, must not hang
        code = 1
        try:
            t.put(Item(99))
            t.close(0.5)
            code = 0 if t.stats().dropped == 1 and t.stats().acknowledged == 0 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    t.close(5.0)
    assert seqs(sender.payloads()) == []


class _Switch(MemorySender):
    """Answers RETRY (503) while ``down`` is set and acknowledges (keeping the body) otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.down = threading.Event()
        self.refused = 0

    def send(self, body: bytes, timeout: float) -> SendResult:
        if self.down.is_set():
            self.refused += 1
            return SendResult(Outcome.RETRY, 503)
        return super().send(body, timeout)


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


class TestSpool:
    def test_the_spool_is_announced_once(
        self, spool_dir: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="ampscope")
        sender = _Switch()
        sender.down.set()
        t = fast(sender, batch_size=2, retry_window=0.05, backoff_cap=0.05)
        for i in range(6):
            t.put(Item(i))
        wait_for(lambda: t.stats().spooled == 6)
        t.close(1.0)
        offline = fast(None)
        offline.put(Item(0))
        offline.close(1.0)
        # This test's spool only: an earlier test's transport thread still closing may log its
        # own spool's message meanwhile (seen once on a loaded machine).
        messages = [r.getMessage() for r in caplog.records
                    if r.name == "ampscope" and str(spool_dir) in r.getMessage()]
        assert messages == [
            f"ampscope server is not answering; records go to the spool at {spool_dir} and are "
            f"sent from there once it is back (or with `ampscope sync {spool_dir} --server "
            "URL`)",
            f"ampscope is offline: records go to the spool at {spool_dir}; upload them with "
            f"`ampscope sync {spool_dir} --server URL`"]

    def test_server_away_spools_then_replays_in_order_before_newer_records(
        self, spool_dir: Path
    ) -> None:
        sender = _Switch()
        sender.down.set()
        t = fast(sender, batch_size=4, retry_window=0.05, backoff_cap=0.05)
        for i in range(10):
            t.put(Item(i))
        wait_for(lambda: t.stats().spooled == 10)
        mode_while_down = t.mode
        assert mode_while_down is Mode.SPOOLING
        assert seqs(spooled_payloads(spool_dir)) == list(range(10))
        assert balanced(t.stats())
        sender.down.clear()
        for i in range(10, 14):
            t.put(Item(i))
        # The replay acknowledges its last frame, then finds the spool empty and goes DIRECT:
        # a moment apart on the sender thread.
        wait_for(lambda: t.stats().acknowledged == 14 and t.mode is Mode.DIRECT)
        t.close(5.0)
        payloads = sender.payloads()
        assert seqs(payloads) == list(range(14))
        stats = t.stats()
        # Records put before the first successful probe went to disk behind the others.
        assert stats == TransportStats(14, 14, 0, 0, stats.failed_requests, spooled=0,
                                       replayed=stats.replayed)
        assert 10 <= stats.replayed <= 14
        assert list(spool_dir.iterdir()) == []  # acknowledged segments and cursors are deleted

    def test_accounting_is_exact_at_every_call_while_the_server_flaps(self) -> None:
        sender = _Switch()
        t = fast(sender, batch_size=8, retry_window=0.02, backoff_cap=0.02, max_queue=10_000)
        seen: list[TransportStats] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                seen.append(t.stats())

        watcher = threading.Thread(target=watch)
        watcher.start()
        for i in range(600):
            if i % 100 == 0:
                (sender.down.clear if sender.down.is_set() else sender.down.set)()
            t.put(Item(i))
            if i % 10 == 0:
                time.sleep(0.003)
        sender.down.clear()
        # A bound, not the subject: close returns once every record is acknowledged. 5 s left
        # 95 of 600 undelivered in one CI run at load 5-7 (this watcher spins on the GIL).
        t.close(60.0)
        stop.set()
        watcher.join()
        assert len(seen) > 100 and all(balanced(s) for s in seen)
        assert any(s.spooled > 0 for s in seen)
        assert sorted(seqs(sender.payloads())) == list(range(600))
        final = t.stats()
        assert (final.acknowledged, final.pending, final.spooled, final.dropped) == (600, 0, 0, 0)
        assert final.replayed > 0

    def test_at_the_spool_cap_records_are_dropped_and_counted_exactly(
        self, spool_dir: Path
    ) -> None:
        one_frame = len(encode([{"seq": 0}], True, False)) + 12 + 8  # frame and file headers
        t = fast(None, batch_size=1, spool_max_bytes=3 * one_frame + 2)
        for i in range(6):
            t.put(Item(i))
        t.close(5.0)
        stats = t.stats()
        assert stats == TransportStats(6, 0, 3, 0, 0, spooled=3)
        assert seqs(spooled_payloads(spool_dir)) == [0, 1, 2]

    def test_close_spools_the_rest_when_the_server_never_answers(self, spool_dir: Path) -> None:
        sender = _Switch()
        sender.down.set()
        t = fast(sender, retry_window=60.0)  # the batch stays in memory, retried
        for i in range(3):
            t.put(Item(i))
        time.sleep(0.1)
        start = time.monotonic()
        t.close(1.0)
        assert time.monotonic() - start < 1.2
        assert t.stats() == TransportStats(3, 0, 0, 0, t.stats().failed_requests, spooled=3)
        assert [p["final"] for p in spooled_payloads(spool_dir)] == [True]

    def test_rejected_spool_frames_are_dropped_and_counted(self) -> None:
        sender = _Switch()
        sender.down.set()
        t = fast(sender, retry_window=0.01, backoff_cap=0.05)
        t.put(Item(0))
        wait_for(lambda: t.stats().spooled == 1)
        sender._script.append(SendResult(Outcome.REJECTED, 409))
        sender.down.clear()
        t.put(Item(1))
        t.close(5.0)
        stats = t.stats()
        assert (stats.acknowledged, stats.dropped, stats.spooled, stats.pending) == (1, 1, 0, 0)


class TestPriority:
    @pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
    def test_the_sender_thread_runs_below_the_process(self) -> None:
        own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        t = fast(MemorySender())
        try:
            assert t._thread is not None
            t.put(Item(0))
            deadline = time.monotonic() + 5
            while t.stats().acknowledged < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            native = t._thread.native_id
            assert native is not None and native != threading.get_native_id()
            assert os.getpriority(os.PRIO_PROCESS, native) == min(19, own + SENDER_NICENESS)
            # the calling (training) thread is left as it was
            assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own
        finally:
            t.close(2.0)

    def test_lowering_nothing_does_nothing(self) -> None:
        own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        assert lower_thread_priority(0) is False
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own

    def test_other_systems_are_left_alone(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(sys, "platform", "darwin")
        calls: list[Any] = []
        monkeypatch.setattr(os, "setpriority", lambda *a: calls.append(a))
        assert lower_thread_priority() is False and calls == []
