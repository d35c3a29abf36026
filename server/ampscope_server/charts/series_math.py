"""Pure chart math: min/max/last downsampling, scale events, derived per-layer statistics.

No I/O. Downsampling never strides: buckets are contiguous, equally wide step ranges and each
keeps the min and the max of *every* value in it, so an isolated overflow spike survives any
zoom level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ampscope_server.findings.formats import FloatFormat


@dataclass(frozen=True)
class SeriesPoint:
    """One bucket: `step` is the first step of its range; min/max/last cover every value in it.

    NaN does not order, so min and max are taken over the non-NaN values (±inf included) and are
    NaN only when every value in the bucket is NaN; `last` is the bucket's last value as stored.
    """

    step: int
    min: float
    max: float
    last: float


def bucket_bounds(steps: Sequence[int], max_buckets: int) -> list[tuple[int, int]]:
    """[start, stop) index ranges of contiguous step buckets, for `steps` sorted ascending.

    The step range [first, last] is cut into buckets of ceil(span / max_buckets) steps; empty
    buckets are omitted, so there are at most `max_buckets` ranges and they cover every index.
    """
    if max_buckets < 1:
        raise ValueError(f"max_buckets must be at least 1, got {max_buckets}")
    if not steps:
        return []
    first = steps[0]
    width = max(1, -(-(steps[-1] - first + 1) // max_buckets))
    bounds: list[tuple[int, int]] = []
    bucket = None
    for index, step in enumerate(steps):
        current = (step - first) // width
        if current != bucket:
            if bounds:
                bounds[-1] = (bounds[-1][0], index)
            bounds.append((index, len(steps)))
            bucket = current
    return bounds


def downsample(
    steps: Sequence[int], values: Sequence[float], max_points: int
) -> tuple[list[SeriesPoint], bool]:
    """Reduce (step, value) pairs sorted by step to at most `max_points` buckets.

    Returns (points, downsampled). With no more values than `max_points` every value is its own
    point (min = max = last). Otherwise the step range [first, last] is cut into contiguous
    buckets of ceil(span / max_points) steps (`bucket_bounds`); empty buckets are omitted.
    """
    if len(steps) != len(values):
        raise ValueError(f"{len(steps)} steps but {len(values)} values")
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")
    if len(steps) <= max_points:
        return [SeriesPoint(s, v, v, v) for s, v in zip(steps, values, strict=True)], False
    first = steps[0]
    width = max(1, -(-(steps[-1] - first + 1) // max_points))
    points: list[SeriesPoint] = []
    for start, stop in bucket_bounds(steps, max_points):
        present = [v for v in values[start:stop] if not math.isnan(v)]
        lo, hi = (min(present), max(present)) if present else (math.nan, math.nan)
        bucket_start = first + (steps[start] - first) // width * width
        points.append(SeriesPoint(bucket_start, lo, hi, values[stop - 1]))
    return points, True


@dataclass(frozen=True)
class ScaleEvent:
    step: int
    kind: Literal["skipped", "backoff", "growth"]
    scale_before: float | None
    scale_after: float | None


def scale_events(
    rows: Sequence[tuple[int, bool, float | None, float | None]],
) -> list[ScaleEvent]:
    """Events from (step, skipped, scale_before, scale_after) rows in step order.

    A skipped step is a `skipped` event; a lower scale after update() a `backoff`, a higher one
    a `growth` (a skipped step that also backed off yields both, skipped first). Steps whose
    scales are absent or NaN cannot be compared and yield no scale event.
    """
    events: list[ScaleEvent] = []
    for step, skipped, before, after in rows:
        if skipped:
            events.append(ScaleEvent(step, "skipped", before, after))
        if before is None or after is None or math.isnan(before) or math.isnan(after):
            continue
        if after < before:
            events.append(ScaleEvent(step, "backoff", before, after))
        elif after > before:
            events.append(ScaleEvent(step, "growth", before, after))
    return events


def lost_frac(zero_frac: float, underflow_frac: float) -> float:
    """Share of a gradient lost in the target format: exact zeros plus would-flush-to-zero."""
    return zero_frac + underflow_frac


def headroom_bits(amax: float | None, scale: float | None, fmt: FloatFormat) -> float | None:
    """log2(fmt.max / (amax · scale)): doublings of the scale left before this layer overflows.

    inf when amax is 0 (nothing can overflow); None when amax is unknown (no finite element) or
    the scale is not a positive finite number. A missing scale (no GradScaler) counts as 1.
    """
    if amax is None:
        return None
    effective = 1.0 if scale is None else scale
    if not math.isfinite(effective) or effective <= 0:
        return None
    if amax == 0:
        return math.inf
    return math.log2(fmt.max) - math.log2(amax) - math.log2(effective)
