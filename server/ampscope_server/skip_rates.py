"""Pure maths of the rolling skip rate: the share of skipped steps among the last `window` step
numbers, reduced to at most `max_points` buckets that keep each bucket's highest rate (a burst
of skips is never averaged away: no stride sampling). No I/O.

It is the same computation the run page continues live (`web/js/skip_rate.js`), which is why
`RollingSkips.tail` hands over the steps of the last window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
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
