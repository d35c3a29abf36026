"""Pure rollup math: fixed power-of-two step buckets that keep every chart query bounded.

No I/O. A rollup covers the steps [bucket·2^level, (bucket+1)·2^level) of one run. It holds

- `series`, at each of `LEVELS` (bucket widths 4, 16, 64, … 65536 steps): per chart series
  (`SERIES`), the count of present values, the min and max over the non-NaN values (±inf
  included; NaN when every value is NaN), the last value in (step, ingest) order and its step:
  40 bytes each, packed, so NaN and ±inf travel exactly on both dialects; and beside them
  (revision 0013) the bucket's step numbers and skipped steps, each step number counted once
  (a resumed attempt's re-sent step is not counted again), which the skip rate of a long
  range is read from (`skip_rates.blocks`);
- at each of `LAYER_LEVELS` only (from 64 steps), per heatmap statistic, one array of per-layer
  values reduced in the statistic's *worse* direction (`DIRECTION`), all packed in one blob
  (`pack_layers`). A bucket never hides a spike: for fractions, counts, amax and l2 the worst is
  the largest; for amin_nz (underflow risk) the smallest; `headroom_bits` is derived from the
  largest amax·scale, which is the smallest headroom. A layer with no value in the bucket holds
  the direction's `MISSING`. Finer per-layer buckets would cost about as much as the steps they
  summarise (a 4-step bucket holds one layer-stat step at the default cadence of every 10th);
  a reader that needs one (`layer_buckets`) folds the raw steps, at most 64 of them each.

Rows are merged at ingest (`merge`): counts add, min/max combine, the newer `last` wins. Only
newly stored steps are folded in, so a duplicate never counts twice. A per-layer row is written
only once its bucket is closed (`is_closed`: a stored step lies past its end), so the open
buckets at the run's tail are not rewritten by every batch (on Postgres each rewrite of a 16 KB
row left a dead version); a read folds an open bucket from its children (`open_children`),
at most 4 rows per level and the raw steps of one `LAYER_FINEST` bucket. A resumed attempt
that re-sends old steps merges them into the closed rows (read-modify-write, rare). `plan`
picks, for a step range and `max_points`, the rollup pieces and the raw edge steps that cover
the range exactly.
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import add
from typing import cast

from ampscope_server.store import stat_packing

LEVELS = (2, 4, 6, 8, 10, 12, 14, 16)
"""log2 of the bucket widths. The finest (4 steps) bounds the raw rows a query reads."""
FINEST_WIDTH = 1 << LEVELS[0]
SERIES_LEVELS = LEVELS[1:]
"""The levels whose series rollups are stored (16 steps and wider). A 4-step bucket is folded
from its raw steps when read (`series_buckets`, at most 4 per bucket, as many rows as a plan
reads raw at its edges): its rows were three quarters of the series rollups, which cost more
than the layer statistics' own rollups at the hook's default cadence."""
LAYER_LEVELS = LEVELS[2:]
"""The levels whose per-layer rollups are stored (64 steps and wider)."""
LAYER_FINEST = LAYER_LEVELS[0]
DENSE_STEPS = 16
"""A closed `LAYER_FINEST` bucket keeps its per-layer row only when more than this many of its
steps carry layer statistics. A sparser one (the hook's default, every 10th step: 6 or 7 in 64)
costs about as much stored as its raw steps, so a read folds those, no more of them than a
16-step bucket's fold reads."""

SERIES = ("scale_before", "loss", "grad_norm", "lr", "duration")
"""The step columns charted as series, in their order inside the packed `series` blob."""

_SERIES = struct.Struct("<qdddq")  # count, min, max, last, last step

INT_STATS = frozenset({"nan_count", "inf_count"})
DIRECTION: Mapping[str, str] = {
    "amax": "max", "amin_nz": "min", "zero_frac": "max", "subnormal_frac": "max",
    "underflow_frac": "max", "lost_frac": "max", "nan_count": "max", "inf_count": "max",
    "l2": "max", "amax_scaled": "max",
}
"""The stored per-layer rollup statistics and the direction that is worse for each."""
ROLLUP_STATS = tuple(DIRECTION)
MISSING: Mapping[str, float] = {
    name: (-1 if name in INT_STATS else (math.inf if way == "min" else -math.inf))
    for name, way in DIRECTION.items()
}
"""The value of a layer without data: it loses every comparison in the stat's direction."""

HEATMAP_SOURCE: Mapping[str, str] = {
    **{name: name for name in ROLLUP_STATS if name != "amax_scaled"},
    "headroom_bits": "amax_scaled",
}
"""Which rollup statistic a heatmap statistic is read from."""


@dataclass
class SeriesAcc:
    """Min/max/last of one series over one bucket; `n` counts the non-null values."""

    n: int = 0
    lo: float = math.nan
    hi: float = math.nan
    last: float = math.nan
    last_step: int = -1

    def add(self, step: int, value: float) -> None:
        """Fold in a value that comes after every value folded in so far."""
        self.n += 1
        if not math.isnan(value):
            self.lo = value if math.isnan(self.lo) else min(self.lo, value)
            self.hi = value if math.isnan(self.hi) else max(self.hi, value)
        self.last, self.last_step = value, step

    def merge(self, newer: SeriesAcc) -> None:
        """Fold in `newer`, whose values were stored later (or lie at later steps)."""
        if newer.n == 0:
            return
        if self.n == 0 or newer.last_step >= self.last_step:
            self.last, self.last_step = newer.last, newer.last_step
        self.n += newer.n
        for value in (newer.lo, newer.hi):
            if not math.isnan(value):
                self.lo = value if math.isnan(self.lo) else min(self.lo, value)
                self.hi = value if math.isnan(self.hi) else max(self.hi, value)


LayerArrays = dict[str, list[float]]


@dataclass
class Bucket:
    series: list[SeriesAcc] = field(default_factory=lambda: [SeriesAcc() for _ in SERIES])
    layers: LayerArrays | None = None
    layer_steps: int = 0
    """Steps with layer statistics folded in (kept at `LAYER_FINEST`, for `DENSE_STEPS`)."""
    steps: int = 0
    """Step numbers in the bucket, each counted once (`StepInput.first`)."""
    skips: int = 0
    """Of those, the skipped ones (as first stored)."""

    def merge(self, newer: Bucket) -> None:
        for mine, theirs in zip(self.series, newer.series, strict=True):
            mine.merge(theirs)
        self.layers = merge_layers(self.layers, newer.layers)
        self.steps += newer.steps
        self.skips += newer.skips


def merge_layers(a: LayerArrays | None, b: LayerArrays | None) -> LayerArrays | None:
    if a is None:
        return b
    if b is None:
        return a
    return reduce_layers([a, b])


def reduce_layers(arrays: Sequence[LayerArrays]) -> LayerArrays:
    """The per-layer worst of several buckets' (or steps') arrays, in one pass per statistic:
    `map(max, *lists)` compares k values per call rather than two (ingest's hot loop)."""
    if len(arrays) == 1:
        return arrays[0]
    return {
        name: list(map(max if DIRECTION[name] == "max" else min, *(a[name] for a in arrays)))
        for name in ROLLUP_STATS
    }


@dataclass(frozen=True)
class StepInput:
    """What a rollup needs of one stored step: `series` in `SERIES` order (None = not sent),
    `layers` the eight stored statistics per layer (None = no layer statistics), `skipped`
    its flag, `first` whether it is the first stored step of its step number (a resumed
    attempt re-sends steps: the skip counts take each step number once, its first stored
    flag, as the rolling skip rate does)."""

    step: int
    series: Sequence[float | None]
    layers: Mapping[str, Sequence[float | None]] | None
    skipped: bool = False
    first: bool = True


def _or(values: Sequence[float | None], missing: float) -> list[float]:
    if None not in values:  # the common case, a scan in C: fractions and counts never are None
        return list(values)  # type: ignore[arg-type]  # no None in it, as just checked
    return [missing if v is None else v for v in values]


def step_layers(layers: Mapping[str, Sequence[float | None]], scale: float | None) -> LayerArrays:
    """One step's per-layer values in rollup form (missing values replaced by `MISSING`).

    `amax_scaled` is amax · scale in effect (a null scale counts as 1, as in headroom_bits);
    a scale that is not a positive finite number gives no headroom, hence no value.
    """
    out = {name: _or(layers[name], MISSING[name]) for name in ROLLUP_STATS
           if name not in ("lost_frac", "amax_scaled")}
    out["lost_frac"] = list(map(add, out["zero_frac"], out["underflow_frac"]))
    effective = 1.0 if scale is None else scale
    if math.isfinite(effective) and effective > 0:
        out["amax_scaled"] = [a * effective if a >= 0 else a for a in out["amax"]]
    else:
        out["amax_scaled"] = [-math.inf] * len(out["amax"])
    return out


RawLayers = tuple[Mapping[str, Sequence[float | None]], float | None]
"""One step's stored statistics per layer and the scale in effect (`StepInput`'s two parts)."""


def reduce_steps(steps: Sequence[RawLayers]) -> LayerArrays:
    """`reduce_layers` of every step's `step_layers`, without building each step's ten arrays.

    Equal value for value: max and min do not depend on the order; `lost_frac` is still the max
    of the per-step sums; and for the steps that share a positive finite scale s, the largest
    amax · s is the largest amax times s (rounding is monotonic), so `amax_scaled` takes one
    product per layer and scale rather than one per layer and step.
    """
    out: LayerArrays = {}
    for name in _STORED:
        columns = [_or(layers[name], MISSING[name]) for layers, _ in steps]
        out[name] = _worst(name, columns)
    out["lost_frac"] = _worst("lost_frac", [
        list(map(add, _or(layers["zero_frac"], MISSING["zero_frac"]),
                 _or(layers["underflow_frac"], MISSING["underflow_frac"])))
        for layers, _ in steps])
    by_scale: dict[float, list[int]] = {}
    for position, (_, scale) in enumerate(steps):
        effective = 1.0 if scale is None else scale
        if math.isfinite(effective) and effective > 0:
            by_scale.setdefault(effective, []).append(position)
    width = len(out["amax"])
    scaled = [[-math.inf] * width]
    if len(by_scale) == 1 and len(steps) == len(next(iter(by_scale.values()))):
        amax_columns = {-1: out["amax"]}  # every step at one scale: the amax already reduced
    else:
        amax_columns = {
            key: _worst("amax", [_or(steps[i][0]["amax"], MISSING["amax"]) for i in positions])
            for key, positions in enumerate(by_scale.values())
        }
    for key, effective in zip(amax_columns, by_scale, strict=False):
        scaled.append([a * effective if a >= 0 else a for a in amax_columns[key]])
    out["amax_scaled"] = _worst("amax_scaled", scaled)
    return out


_STORED = tuple(name for name in ROLLUP_STATS if name not in ("lost_frac", "amax_scaled"))


def _worst(name: str, columns: Sequence[list[float]]) -> list[float]:
    if len(columns) == 1:
        return columns[0]
    return list(map(max if DIRECTION[name] == "max" else min, *columns))


def accumulate(steps: Iterable[StepInput]) -> dict[tuple[int, int], Bucket]:
    """Buckets of every level for steps given in (step, ingest) order: {(level, bucket): …};
    per-layer arrays only at `LAYER_LEVELS` (None at the finer levels)."""
    finest, layer_finest = LEVELS[0], LAYER_LEVELS[0]
    out: dict[tuple[int, int], Bucket] = {}
    layers: dict[int, list[RawLayers]] = {}  # finest layer bucket → its steps' statistics
    for item in steps:
        index = item.step >> finest
        bucket = out.setdefault((finest, index), Bucket())
        for acc, value in zip(bucket.series, item.series, strict=True):
            if value is not None:
                acc.add(item.step, value)
        if item.first:
            bucket.steps += 1
            bucket.skips += item.skipped
        if item.layers is not None:
            layers.setdefault(item.step >> layer_finest, []).append(
                (item.layers, item.series[0]))
    for coarser, finer in zip(LEVELS[1:], LEVELS, strict=False):
        shift = coarser - finer
        groups: dict[int, list[Bucket]] = {}
        for (level, index), bucket in sorted(out.items()):
            if level == finer:
                groups.setdefault(index >> shift, []).append(bucket)
        for index, group in groups.items():
            target = out.setdefault((coarser, index), Bucket())
            for bucket in group:
                for mine, theirs in zip(target.series, bucket.series, strict=True):
                    mine.merge(theirs)
                target.steps += bucket.steps
                target.skips += bucket.skips
            if coarser == layer_finest:
                target.layers = reduce_steps(layers[index]) if index in layers else None
                target.layer_steps = len(layers.get(index, ()))
            elif coarser > layer_finest:
                with_layers = [bucket.layers for bucket in group if bucket.layers is not None]
                if with_layers:
                    target.layers = reduce_layers(with_layers)
    return out


def series_buckets(steps: Iterable[tuple[int, Sequence[float | None]]], level: int
                   ) -> dict[int, list[SeriesAcc]]:
    """{bucket: series} at any level, folded from raw (step, values in `SERIES` order) pairs
    given in (step, ingest) order: what `accumulate` and its merges store for the bucket."""
    out: dict[int, list[SeriesAcc]] = {}
    for step, values in steps:
        accs = out.setdefault(step >> level, [SeriesAcc() for _ in SERIES])
        for acc, value in zip(accs, values, strict=True):
            if value is not None:
                acc.add(step, value)
    return out


def layer_buckets(
    steps: Iterable[tuple[int, Mapping[str, Sequence[float | None]], float | None]], level: int
) -> dict[int, LayerArrays]:
    """{bucket: per-layer worst} at any level, folded from raw (step, layers, scale) triples:
    the per-layer rollup of a level finer than `LAYER_LEVELS`, identical to what a stored one
    would hold (max and min do not depend on the order)."""
    grouped: dict[int, list[RawLayers]] = {}
    for step, stats, scale in steps:
        grouped.setdefault(step >> level, []).append((stats, scale))
    return {index: reduce_steps(arrays) for index, arrays in grouped.items()}


def is_closed(level: int, bucket: int, last_step: int | None) -> bool:
    """Whether a stored step (the run's last is `last_step`) lies past the bucket's end: only a
    closed bucket has a per-layer row, and steps sent later into it are rare (a resume)."""
    return last_step is not None and (bucket + 1) << level <= last_step


def children(level: int, bucket: int) -> tuple[int, range]:
    """(level, buckets) of a per-layer bucket's children, one level finer in `LAYER_LEVELS`."""
    child = level - (LAYER_LEVELS[1] - LAYER_LEVELS[0])
    fanout = 1 << (level - child)
    return child, range(bucket * fanout, (bucket + 1) * fanout)


def open_children(level: int, bucket: int, last_step: int) -> tuple[range, int]:
    """The children (one level finer in `LAYER_LEVELS`) of the open bucket that holds
    `last_step`: (the closed ones, the open one). Later children hold no step yet."""
    child, every = children(level, bucket)
    open_child = last_step >> child
    return range(every.start, open_child), open_child


def keeps_row(level: int, layers: LayerArrays | None, layer_steps: int) -> bool:
    """Whether a closed bucket's per-layer arrays are stored (see `DENSE_STEPS`)."""
    return layers is not None and (level != LAYER_FINEST or layer_steps > DENSE_STEPS)


# --- packing -----------------------------------------------------------------------------------

def pack_series(accs: Sequence[SeriesAcc]) -> bytes:
    return b"".join(_SERIES.pack(a.n, a.lo, a.hi, a.last, a.last_step) for a in accs)


def unpack_series(blob: bytes, index: int | None = None) -> list[SeriesAcc]:
    """All series of a blob, or only the one at `index`."""
    indices = range(len(SERIES)) if index is None else (index,)
    return [SeriesAcc(*_SERIES.unpack_from(blob, i * _SERIES.size)) for i in indices]


def pack_stat(name: str, values: Sequence[float]) -> bytes:
    if name in INT_STATS:
        return array("q", [int(v) for v in values]).tobytes()
    return array("d", values).tobytes()


def unpack_stat(name: str, blob: bytes) -> list[float]:
    if name in INT_STATS:
        counts = array("q")
        counts.frombytes(blob)
        out: list[float] = []
        out.extend(counts.tolist())  # ints stay ints: counts are exact
        return out
    values = array("d")
    values.frombytes(blob)
    return values.tolist()


_LAYER_KINDS = "".join(stat_packing.INT if name in INT_STATS else stat_packing.FLOAT
                       for name in ROLLUP_STATS)


def pack_layers(layers: LayerArrays) -> bytes:
    """A bucket's per-layer arrays (`ROLLUP_STATS`) as one `stat_packing` blob, each statistic
    compressed apart: a heatmap or a layer's line reads one of them."""
    return stat_packing.pack([layers[name] for name in ROLLUP_STATS], _LAYER_KINDS, apart=True)


def unpack_layers(blob: bytes, names: Sequence[str] | None = None,
                  rows: Sequence[int] | None = None) -> LayerArrays:
    """A bucket's per-layer arrays: every statistic of `ROLLUP_STATS`, or only `names`; with
    `rows`, only those layers' values, in that order (`pick`)."""
    if names is None and rows is None:
        columns = stat_packing.unpack(blob)
        # A rollup never holds None (a layer without data holds MISSING).
        return dict(zip(ROLLUP_STATS, cast(list[list[float]], columns), strict=True))
    wanted = stat_packing.unpack_columns(
        blob, [ROLLUP_STATS.index(name) for name in names or ROLLUP_STATS], rows)
    return {ROLLUP_STATS[index]: _present(ROLLUP_STATS[index], column)
            for index, column in wanted.items()}


def unpack_layer_segment(head: bytes, name: str, segment: bytes,
                         rows: Sequence[int] | None = None) -> list[float]:
    """One statistic of a stored per-layer rollup from the blob's head and that statistic's
    segment alone (`stat_packing.unpack_segment`): what a database that cuts segments sends.
    `rows` as in `unpack_layers`."""
    return _present(name, stat_packing.unpack_segment(head, ROLLUP_STATS.index(name), segment,
                                                      rows))


def _present(name: str, column: Sequence[float | int | None]) -> list[float]:
    """A decoded rollup column: None only where a picked row is past the stored layers."""
    if None not in column:
        return cast(list[float], column)
    return [MISSING[name] if value is None else value for value in column]


def pick(arrays: LayerArrays, rows: Sequence[int]) -> LayerArrays:
    """The values of the layers at `rows`, in that order; a row past an array's end (the layer
    table grew after that bucket) holds MISSING."""
    return {name: [values[row] if row < len(values) else MISSING[name] for row in rows]
            for name, values in arrays.items()}


def to_row(run_key: int, key: tuple[int, int], bucket: Bucket) -> dict[str, object]:
    """The `rollups` row (series, skip counts) of a bucket of the run whose `runs.key` is
    `run_key`."""
    level, index = key
    return {"run_key": run_key, "level": level, "bucket": index,
            "series": pack_series(bucket.series), "step_count": bucket.steps,
            "skip_count": bucket.skips}


def to_layer_row(run_key: int, key: tuple[int, int], layers: LayerArrays
                 ) -> dict[str, object]:
    """The `layer_rollups` row of a bucket's per-layer arrays (the run by its `runs.key`)."""
    level, index = key
    return {"run_key": run_key, "level": level, "bucket": index, "data": pack_layers(layers)}


# --- query planning ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """How to answer one chart query over [start, end] from rollups.

    Output bucket i covers [origin + i·width, origin + (i+1)·width) ∩ [start, end]. `ranges` are
    the rollup pieces as (level, first bucket, last bucket), each piece wholly inside the range;
    `raw` the step ranges (inclusive) at the edges that no rollup piece fits.
    """

    start: int
    end: int
    origin: int
    width: int
    ranges: list[tuple[int, int, int]]
    raw: list[tuple[int, int]]

    def column(self, step: int) -> int:
        return (step - self.origin) // self.width

    def first_step(self, column: int) -> int:
        return max(self.start, self.origin + column * self.width)


def plan(start: int, end: int, max_points: int) -> Plan | None:
    """The rollup plan for [start, end], or None when buckets narrower than `FINEST_WIDTH`
    are needed (then at most FINEST_WIDTH · max_points steps are read raw).

    The level is the finest whose bucket count in the range is at most `max_points`, so a
    query reads at most `max_points` rollup rows plus a few finer pieces at each edge (between
    about max_points / 4 and max_points columns). Past the coarsest level (a range of more
    than 65536 · max_points steps) k coarsest buckets make an output bucket.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")
    span = end - start + 1
    if span <= 0 or -(-span // max_points) < FINEST_WIDTH:
        return None
    level = next(
        (lvl for lvl in LEVELS if (end >> lvl) - (start >> lvl) + 1 <= max_points), LEVELS[-1]
    )
    first, last = start >> level, end >> level
    k = -(-(last - first + 1) // max_points)
    return Plan(start, end, first << level, k << level, *_cover(start, end, level))


def _cover(
    start: int, end: int, top: int
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """Split [start, end] into aligned pieces of levels ≤ top, greedily largest first."""
    levels = [lvl for lvl in reversed(LEVELS) if lvl <= top]
    ranges: list[tuple[int, int, int]] = []
    raw: list[tuple[int, int]] = []
    p = start
    while p <= end:
        for lvl in levels:
            width = 1 << lvl
            if p % width == 0 and p + width - 1 <= end:
                count = (end + 1 - p) >> lvl if lvl == top else 1
                index = p >> lvl
                if ranges and ranges[-1][0] == lvl and ranges[-1][2] == index - 1:
                    ranges[-1] = (lvl, ranges[-1][1], index + count - 1)
                else:
                    ranges.append((lvl, index, index + count - 1))
                p += count * width
                break
        else:
            if raw and raw[-1][1] == p - 1:
                raw[-1] = (raw[-1][0], p)
            else:
                raw.append((p, p))
            p += 1
    return ranges, raw
