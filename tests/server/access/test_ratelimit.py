"""The per-key token bucket, on a hand-driven clock."""

from __future__ import annotations

import pytest

from ampscope_server.access.ratelimit import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_the_rate() -> None:
    clock = Clock()
    limiter = RateLimiter(2.0, 3, clock)
    assert [limiter.acquire("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.acquire("a") == pytest.approx(0.5)
    clock.now += 0.5
    assert limiter.acquire("a") == 0.0
    assert limiter.acquire("b") == 0.0  # keys are independent
    clock.now += 100.0  # refills to the burst, not beyond
    assert [limiter.acquire("a") for _ in range(4)][-1] == pytest.approx(0.5)


def test_a_refused_request_takes_nothing() -> None:
    clock = Clock()
    limiter = RateLimiter(1.0, 1, clock)
    assert limiter.acquire("a") == 0.0
    assert limiter.acquire("a") == pytest.approx(1.0)
    clock.now += 1.0
    assert limiter.acquire("a") == 0.0


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match="positive rate"):
        RateLimiter(0.0, 1)
    with pytest.raises(ValueError, match="burst of at least 1"):
        RateLimiter(1.0, 0)


def test_waiting_takes_nothing() -> None:
    clock = Clock()
    limiter = RateLimiter(2.0, 2, clock)
    assert limiter.waiting("a") == 0.0
    assert [limiter.acquire("a") for _ in range(2)] == [0.0, 0.0]
    assert [limiter.waiting("a") for _ in range(3)] == [pytest.approx(0.5)] * 3
    clock.now += 0.5
    assert limiter.waiting("a") == 0.0
    assert limiter.acquire("a") == 0.0


def test_each_worker_enforces_its_share() -> None:
    share = RateLimiter.worker_share(20.0, 60, workers=2)
    assert (share.rate, share.burst) == (10.0, 30.0)
    lone = RateLimiter.worker_share(20.0, 1, workers=3)
    assert lone.rate == pytest.approx(20 / 3) and lone.burst == 1.0
