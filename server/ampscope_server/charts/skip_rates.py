"""Pure maths of the rolling skip rate: the share of skipped steps among the last `window` step
numbers, reduced to at most `max_points` buckets that keep each bucket's highest rate (a burst
of skips is never averaged away: no stride sampling). No I/O.

It is the same computation the run page continues live (`web/js/skip_rate.js`), which is why
`RollingSkips.tail` hands over the steps of the last window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field


@dataclass
class RollingSkips:
    """The rolling rate over the steps pushed so far (in increasing step order; a step number
    seen before is ignored, as a resumed attempt's repeats are)."""

    window: int
    recent: deque[tuple[int, bool]] = field(default_factory=deque)
    skipped: int = 0
    last_step: int | None = None

    def push(self, step: int, skipped: bool) -> float | None:
        """The rate after `step`; None when the step was not newer than the last one."""
        if self.last_step is not None and step <= self.last_step:
            return None
        self.recent.append((step, skipped))
        self.skipped += skipped
        while self.recent and self.recent[0][0] <= step - self.window:
            _, was_skipped = self.recent.popleft()
            self.skipped -= was_skipped
        self.last_step = step
        return self.skipped / len(self.recent)

    @property
    def tail(self) -> list[tuple[int, bool]]:
        return list(self.recent)


def bucket_width(first: int, last: int, max_points: int) -> int:
    """Steps per bucket so that [first, last] makes at most `max_points` buckets."""
    return max(1, -(-(last - first + 1) // max_points))


def rolling_max(
    flags: Iterable[tuple[int, bool]], window: int, first: int, width: int
) -> tuple[list[tuple[int, float]], RollingSkips]:
    """(the first step of each bucket of `width` steps from `first` and the highest rolling rate
    in it, the rolling state after the last step)."""
    rolling = RollingSkips(window)
    points: list[tuple[int, float]] = []
    bucket: int | None = None
    for step, skipped in flags:
        rate = rolling.push(step, skipped)
        if rate is None:
            continue
        at = (step - first) // width
        if at != bucket:
            points.append((step, rate))
            bucket = at
        elif rate > points[-1][1]:
            points[-1] = (points[-1][0], rate)
    return points, rolling


# --- long ranges: from the stored skip counts of the series rollups ----------------------------

EXACT_STEPS = 10_000
"""Ranges of at most this many steps get the exact rolling rate from the raw flags."""
MAX_BLOCK_ROWS = 1 << 14
"""Above this many rollup rows of the finest block unit, the unit goes one level coarser (while
it still fits in the window): the rows a long-range read scans stay bounded, and with them the
database's sliding sums, which cost per row (1M steps at a window of 100: 64-step units rather
than 62,500 rows of 16; docs/storage.md#the-skip-rates-long-ranges)."""
BLOCK_FANOUT = 4
"""A block is preferably at least this many units, so that it is at least 4/5 of the window."""


@dataclass(frozen=True)
class Blocks:
    """How a long range is read from the series rollups' skip counts: blocks of `units`
    consecutive stored buckets of 2^`level` steps (`units` · 2^`level` ≤ the window)."""

    level: int
    units: int

    @property
    def unit(self) -> int:
        return 1 << self.level


def blocks(window: int, span: int, levels: Sequence[int]) -> Blocks | None:
    """The block shape for a window over a range of `span` steps, from the stored series levels
    `levels` (ascending); None for a window narrower than the finest of them (then no stored
    bucket fits in a window, see `event_reads.skip_rate_read`).

    The unit is the widest level with at least `BLOCK_FANOUT` units in the window (else the
    widest that fits at all), coarser again while the range holds more than `MAX_BLOCK_ROWS`
    units and a coarser unit still fits in the window."""
    fitting = [level for level in levels if 1 << level <= window]
    if not fitting:
        return None
    preferred = [level for level in fitting if BLOCK_FANOUT << level <= window]
    at = fitting.index(preferred[-1] if preferred else fitting[-1])
    while at + 1 < len(fitting) and span >> fitting[at] > MAX_BLOCK_ROWS:
        at += 1
    level = fitting[at]
    return Blocks(level, window >> level)


def column_points(columns: Iterable[tuple[int, float]], first: int, last: int, width: int
                  ) -> list[tuple[int, float]]:
    """Points (the first step of each bucket of `width` steps from `first`, its rate) of
    (bucket, rate) pairs in bucket order, the highest rate of a bucket kept; a bucket past the
    one that holds `last` (a block may end past the range) counts as that one."""
    final = (last - first) // width
    points: dict[int, float] = {}
    for column, rate in columns:
        at = min(column, final)
        points[at] = max(rate, points.get(at, rate))
    return [(first + at * width, rate) for at, rate in sorted(points.items())]


def rates_from(flags: Iterable[tuple[int, bool]], window: int, since: int
               ) -> Iterator[tuple[int, float]]:
    """(step, rolling rate) of the steps from `since` on; `flags` may start up to a window
    earlier, to fill the first window as the exact read (from the range's start) does."""
    rolling = RollingSkips(window)
    for step, skipped in flags:
        rate = rolling.push(step, skipped)
        if rate is not None and step >= since:
            yield step, rate
