from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from ampscope.transport import (
    HttpSender,
    MemorySender,
    Outcome,
    SendResult,
    Transport,
    TransportStats,
)
from tests.client_hook.httpstub import Reply, StubServer, blackhole


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
    return s.produced == s.acknowledged + s.dropped + s.pending


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

    def test_no_server_counts_everything_dropped(self) -> None:
        t = fast(None)
        for i in range(3):
            t.put(Item(i))
        t.close(1.0)
        assert t.stats() == TransportStats(3, 0, 3, 0, 0)


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
        assert balanced(stats) and stats.acknowledged == 0

    def test_unreachable_server_is_retried_until_close(self) -> None:
        with blackhole() as url:
            pass  # closed: connections are refused
        t = fast(HttpSender(url))
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
