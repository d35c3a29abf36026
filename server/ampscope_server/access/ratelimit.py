"""A per-key token bucket (pure but for the clock): one runaway client cannot starve a team.

Kept in each worker's memory, no database write per request: with N workers each enforces
1/N of a token's rate and burst (`Settings.workers`), so together they accept at most the
configured rate however the kernel spreads connections (a token whose requests all reach one
worker gets 1/N of it; a hook sends ~2 requests/s against the default 20).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

MAX_KEYS = 10_000
"""Buckets kept; the least recently used go first (a full bucket is the same as none)."""


class RateLimiter:
    def __init__(self, rate_per_s: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not rate_per_s > 0 or burst < 1:
            raise ValueError(f"need a positive rate and a burst of at least 1, got "
                             f"{rate_per_s!r} and {burst!r}")
        self.rate = rate_per_s
        self.burst = float(burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    @classmethod
    def worker_share(cls, rate_per_s: float, burst: int, workers: int) -> RateLimiter:
        """One of `workers` processes' share of a limit (see the module's docstring)."""
        return cls(rate_per_s / workers, max(1, burst // workers))

    def waiting(self, key: str) -> float:
        """The seconds until `key` may take a request (0.0: now), taking nothing."""
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def acquire(self, key: str) -> float:
        """Take one request from `key`'s bucket: 0.0 when allowed, else the seconds to wait."""
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / self.rate
            self._buckets[key] = (tokens, now)
            while len(self._buckets) > MAX_KEYS:
                self._buckets.popitem(last=False)
            return wait
