"""Chart reads: downsampled series, scale events, layer-by-step heatmaps.

The math is in `series_math.py` and `rollups.py` (pure); this module fetches rows and shapes the
responses. A query whose buckets are at least `rollups.FINEST_WIDTH` steps wide reads rollup rows
(at most max_points of them) plus at most a few raw steps at each edge of the range; a
narrower one reads at most FINEST_WIDTH · max_points raw steps. Either way the rows read do not
grow with the run. A heatmap's row carries a value per layer, so it reads raw steps only for a
range of at most `RAW_FOLD_STEPS` steps (and a range's partial edge buckets): wider, its level
follows the zoom among the stored per-layer levels (`_heatmap_plan`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session

from ampscope_server.charts import event_reads, series_math
from ampscope_server.charts.schemas import (
    EventsRead,
    HeatmapRead,
    HeatmapSource,
    HeatmapStat,
    SeriesName,
    SeriesPointRead,
    SeriesRead,
)
from ampscope_server.errors import InvalidPayload
from ampscope_server.findings.formats import FORMATS
from ampscope_server.store import rollups, rollups_repository, runs_repository, steps_repository
from ampscope_server.store.float_storage import from_storage
from ampscope_server.store.models import CLASSED_ACTIVATION_STATS, Run

# "scale" charts the scale in effect during each step, i.e. before update().
SERIES_COLUMNS: dict[str, str] = {
    "scale": "scale_before", "loss": "loss", "grad_norm": "grad_norm", "lr": "lr",
    "duration": "duration",
}
DEFAULT_HEATMAP_POINTS = 250
"""Columns of a downsampled heatmap: each cell carries one value per layer, so a few pixels
wide (a series point carries three and comes at twice the chart width)."""
RAW_FOLD_STEPS = 256
"""The widest range a downsampled heatmap folds from its raw layer steps. The 4- and 16-step
per-layer buckets are not stored, so a column that narrow costs one unpacked blob per step
and layer (docs/storage.md#heatmaps-raw-folds-and-stored-rollups); past this many steps the
columns come from the stored `layer_rollups` (64 steps and wider) and only a range's partial
edge buckets (under 64 steps each) and sparse 64-step buckets are folded raw."""


def _bounds(
    session: Session, run: Run, start: int | None, end: int | None
) -> tuple[int, int] | None:
    """The requested range clipped to the run's stored steps; None when nothing is in it."""
    extent = rollups_repository.step_extent(session, run.id)
    if extent is None:
        return None
    lo = extent[0] if start is None else max(start, extent[0])
    hi = extent[1] if end is None else min(end, extent[1])
    return None if lo > hi else (lo, hi)


def series_read(
    session: Session, run: Run, name: SeriesName, max_points: int, start: int | None,
    end: int | None,
) -> SeriesRead:
    column = SERIES_COLUMNS[name]
    bounds = _bounds(session, run, start, end)
    if bounds is None:
        return SeriesRead(name=name, downsampled=False, points=[])
    plan = rollups.plan(*bounds, max_points)
    if plan is None:
        return _raw_series(session, run, name, column, max_points, *bounds)
    index = rollups.SERIES.index(column)
    pieces: list[tuple[int, rollups.SeriesAcc]] = [
        (bucket << level, rollups.unpack_series(blob, index)[0])
        for level, bucket, blob in rollups_repository.rollup_pieces(
            session, run.id, plan.ranges, "series")
        if blob is not None
    ]
    for first, last in plan.raw:
        for step, value, cls in steps_repository.series_rows(session, run.id, column, first, last):
            acc = rollups.SeriesAcc()
            acc.add(int(step), _as_float(from_storage(value, cls)))
            pieces.append((int(step), acc))
    merged: dict[int, rollups.SeriesAcc] = {}
    for step, acc in sorted(pieces, key=lambda piece: piece[0]):
        merged.setdefault(plan.column(step), rollups.SeriesAcc()).merge(acc)
    return SeriesRead(name=name, downsampled=True, points=[
        SeriesPointRead(step=plan.first_step(col), min=acc.lo, max=acc.hi, last=acc.last)
        for col, acc in sorted(merged.items()) if acc.n
    ])


def _as_float(value: float | None) -> float:
    return math.nan if value is None else value


def _raw_series(
    session: Session, run: Run, name: SeriesName, column: str, max_points: int, start: int,
    end: int,
) -> SeriesRead:
    """A range narrow enough to read raw: at most FINEST_WIDTH · max_points steps."""
    rows = steps_repository.series_rows(session, run.id, column, start, end)
    pairs = [(int(step), from_storage(value, cls)) for step, value, cls in rows]
    present = [(step, value) for step, value in pairs if value is not None]
    points, downsampled = series_math.downsample(
        [step for step, _ in present], [value for _, value in present], max_points
    )
    return SeriesRead(
        name=name, downsampled=downsampled,
        points=[SeriesPointRead(step=p.step, min=p.min, max=p.max, last=p.last) for p in points],
    )


def events_read(session: Session, run: Run, start: int | None = None, end: int | None = None
                ) -> EventsRead:
    """Every event of the run, or of its steps in [start, end] (a zoomed chart's window): one
    unlimited page of `event_reads.events_page` (the report; the API pages)."""
    return event_reads.events_page(session, run, start, end, limit=None)


def _heatmap_columns(source: HeatmapSource, stat: HeatmapStat) -> list[str]:
    """The stored columns a stat is read or derived from (with classes where stored)."""
    if stat == "lost_frac":
        return ["zero_frac", "underflow_frac"]
    base = "amax" if stat == "headroom_bits" else stat
    if source == "activation" and base in CLASSED_ACTIVATION_STATS:
        return [base, f"{base}_class"]
    return [base]


def heatmap_read(
    session: Session, run: Run, stat: HeatmapStat, start: int | None, end: int | None,
    source: HeatmapSource = "param", max_points: int = DEFAULT_HEATMAP_POINTS,
    rows: Sequence[int] | None = None,
) -> HeatmapRead:
    """z[row][column]: a row per layer (param) or module (activation), a column per step that
    has statistics of that source, in step order; with more steps in range than `max_points`
    (param source), a column per bucket of steps holding each layer's worst value in it
    (`rollups.DIRECTION`), and `steps` the first step of each bucket.

    `rows` (indices into the table, each once: `parse_rows`): only those rows, in that order,
    as `rows` and `layers` of the answer say; an index past the table is an `InvalidPayload`.
    A layer's lines need one row of a heatmap, not the 500 of a large model (most of the work
    and the bytes of a fine heatmap are its cells)."""
    if stat == "swallowed_frac":
        read = _swallowed_heatmap(session, run, start, end, source, max_points)
    else:
        bounds = None if source == "activation" else _bounds(session, run, start, end)
        if bounds is None or bounds[1] - bounds[0] + 1 <= max_points:
            read = _raw_heatmap(session, run, stat, start, end, source)
        else:
            return _rolled_heatmap(session, run, stat, bounds, max_points, rows)
    return read if rows is None else _only(read, rows)


MAX_ROWS = 64
"""The most rows one heatmap read may pick (`layers=`): a chart's worth of lines."""


def parse_rows(text: str) -> list[int]:
    """`3,17` → [3, 17]: 1 to MAX_ROWS distinct table indices, in the order given."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isascii() and part.isdigit() for part in parts):
        raise InvalidPayload(f"layers: give table indices separated by commas, got {text!r}")
    rows = [int(part) for part in parts]
    if len(rows) != len(set(rows)):
        raise InvalidPayload(f"layers: each index may appear once, got {text!r}")
    if len(rows) > MAX_ROWS:
        raise InvalidPayload(f"layers: at most {MAX_ROWS} indices, got {len(rows)}")
    return rows


def _checked(rows: Sequence[int], count: int) -> Sequence[int]:
    if rows and max(rows) >= count:
        raise InvalidPayload(f"layers: {max(rows)} is past the table of {count} "
                             f"{'entry' if count == 1 else 'entries'}")
    return rows


def _only(read: HeatmapRead, rows: Sequence[int]) -> HeatmapRead:
    _checked(rows, len(read.layers))
    return read.model_copy(update={"layers": [read.layers[row] for row in rows],
                                   "z": [read.z[row] for row in rows], "rows": list(rows)})


def _rolled_heatmap(session: Session, run: Run, stat: HeatmapStat, bounds: tuple[int, int],
                    max_points: int, rows: Sequence[int] | None) -> HeatmapRead:
    """The downsampled param heatmap: a column per rollup bucket (`_heatmap_plan`), only the
    asked rows' cells computed."""
    names = runs_repository.layer_names(session, run.id)
    if rows is not None:
        names = [names[row] for row in _checked(rows, len(names))]
    plan = _heatmap_plan(*bounds, max_points, _layer_levels(session, run, *bounds, max_points))
    name = rollups.HEATMAP_SOURCE[stat]
    arrays: dict[int, list[list[float]]] = {}
    pieces = rollups_repository.layer_rollup_arrays(session, run.id, plan.ranges, [name], rows)
    for (level, bucket), layer_arrays in sorted(pieces.items()):
        arrays.setdefault(plan.column(bucket << level), []).append(layer_arrays[name])
    for first, last in plan.raw:
        for step, stats, scale in rollups_repository.layer_steps_in(session, run.id, first, last):
            step_arrays = rollups.step_layers(stats, scale)
            arrays.setdefault(plan.column(step), []).append(
                (step_arrays if rows is None else rollups.pick(step_arrays, rows))[name])
    reduce = max if rollups.DIRECTION[name] == "max" else min
    columns = sorted(arrays)
    display = _displayer(stat, FORMATS[run.target_format].max)
    missing = rollups.MISSING[name]
    width = len(names)
    by_column: list[list[float | None]] = []
    for col in columns:  # a column at a time, in C where it can be: 122,500 cells at 1M x 500
        parts = arrays[col]
        worst = (parts[0] if len(parts) == 1 else list(map(reduce, *parts)))[:width]
        # Shown as stored unless a value needs `display` (a missing one, or headroom's log2).
        shown = worst if stat != "headroom_bits" and missing not in worst else list(
            map(display, worst))
        by_column.append(shown + [None] * (width - len(shown)))
    z = [list(row) for row in zip(*by_column, strict=True)] if by_column else [[] for _ in names]
    # Built from stored rollups, already of the schema's types: validating its cells again was
    # a sizeable share of the read (docs/storage.md#heatmaps-raw-folds-and-stored-rollups).
    return HeatmapRead.model_construct(
        stat=stat, source="param", layers=names, steps=[plan.first_step(col) for col in columns],
        z=z, downsampled=True, rows=None if rows is None else list(rows))


def _layer_levels(session: Session, run: Run, start: int, end: int, max_points: int
                  ) -> tuple[int, ...]:
    """The stored per-layer levels a heatmap over [start, end] may read: all of
    `rollups.LAYER_LEVELS`, or all but the finest when that level would be chosen (at most
    max_points buckets in range) and fewer than half of its buckets there kept a row. A sparse
    cadence (the hook's default, every 10th step) stores no 64-step row (`rollups.DENSE_STEPS`):
    each of its buckets is folded from its raw steps, as many blobs as a raw read, where its
    256-step rows cost a small fraction of that
    (docs/storage.md#heatmaps-raw-folds-and-stored-rollups)."""
    finest = rollups.LAYER_FINEST
    buckets = (end >> finest) - (start >> finest) + 1
    if buckets > max_points or rollups_repository.count_layer_rollups(
            session, run.id, finest, start >> finest, end >> finest) * 2 >= buckets:
        return rollups.LAYER_LEVELS
    return rollups.LAYER_LEVELS[1:]


def _heatmap_plan(start: int, end: int, max_points: int,
                  levels: Sequence[int] = rollups.LAYER_LEVELS) -> rollups.Plan:
    """The rollup plan of a downsampled heatmap over [start, end] (more than max_points steps),
    its level chosen from the zoom: up to `RAW_FOLD_STEPS` steps, the finest plan (4- or 16-step
    buckets folded raw, between max_points / 4 and max_points columns); wider, the finest of the
    stored per-layer `levels` (`_layer_levels`) with at most max_points buckets in the range
    (fewer columns at a middle zoom, but rows read that do not grow with the range)."""
    span = end - start + 1
    if span > RAW_FOLD_STEPS:
        level = next((lvl for lvl in levels
                      if (end >> lvl) - (start >> lvl) + 1 <= max_points), None)
        # `rollups.plan` takes the finest level with at most the given count of buckets: asked
        # for `level`'s own count, that is `level` (any finer one has more buckets in a range
        # this wide). Past the coarsest level it joins k coarsest buckets per column.
        count = max_points if level is None else (end >> level) - (start >> level) + 1
        stored = rollups.plan(start, end, count)
        if stored is not None:
            return stored
    return (
        rollups.plan(start, end, max_points)
        or rollups.plan(start, end, -(-span // rollups.FINEST_WIDTH))
        or rollups.Plan(start, end, start, -(-span // max_points), [], [(start, end)])
    )


def _displayer(stat: HeatmapStat, fmt_max: float) -> Callable[[float], float | None]:
    """A rollup value as the heatmap shows it: missing → None, amax·scale → headroom_bits."""
    if stat == "headroom_bits":
        top = math.log2(fmt_max)
        return lambda value: (None if value == -math.inf else
                              math.inf if value == 0 else top - math.log2(value))
    missing = rollups.MISSING[stat]
    return lambda value: None if value == missing else value


def _raw_heatmap(
    session: Session, run: Run, stat: HeatmapStat, start: int | None, end: int | None,
    source: HeatmapSource,
) -> HeatmapRead:
    """One column per stored step: ranges of at most max_points steps, and the (sampled)
    activation source."""
    fmt = FORMATS[run.target_format]
    table = (
        runs_repository.get_modules(session, run.id) if source == "activation"
        else runs_repository.get_layers(session, run.id)
    )
    names = [entry.name for entry in table]
    columns = _heatmap_columns(source, stat)
    classed = len(columns) == 2 and columns[1].endswith("_class")
    z: list[list[float | None]] = [[] for _ in names]
    steps: list[int] = []
    current = None
    for step_id, step, scale, scale_cls, index, *values in steps_repository.heatmap_rows(
        session, run.id, source, columns, start, end
    ):
        if step_id != current:
            current = step_id
            steps.append(int(step))
            for row in z:
                row.append(None)
        if stat == "lost_frac":
            value: float | None = series_math.lost_frac(values[0], values[1])
        else:
            value = from_storage(values[0], values[1]) if classed else values[0]
            if stat == "headroom_bits":
                value = series_math.headroom_bits(value, from_storage(scale, scale_cls), fmt)
        if index < len(z):
            z[index][-1] = value
    return HeatmapRead(stat=stat, source=source, layers=names, steps=steps, z=z)


def _swallowed_heatmap(
    session: Session, run: Run, start: int | None, end: int | None, source: HeatmapSource,
    max_points: int,
) -> HeatmapRead:
    """`swallowed_frac` (wire v3), param source only: a column per step that carries it, or,
    past `max_points` such steps, per contiguous group of them holding each layer's max.

    Read from the raw rows: the fraction is only measured for FP16/BF16 parameters on the
    layer-stat steps, so it has no rollup.
    """
    names = runs_repository.layer_names(session, run.id)
    columns: list[tuple[int, list[float | None]]] = []
    if source == "param":
        current = None
        rows = steps_repository.swallowed_rows(session, run.id, start, end)
        for step_id, step, index, frac in rows:
            if step_id != current:
                current = step_id
                columns.append((int(step), [None] * len(names)))
            if index < len(names):
                columns[-1][1][index] = frac
    downsampled = len(columns) > max_points
    if downsampled:
        width = -(-len(columns) // max_points)
        columns = [
            (group[0][0], [
                max((v for v in values if v is not None), default=None)
                for values in zip(*(column for _, column in group), strict=True)
            ])
            for group in (columns[i : i + width] for i in range(0, len(columns), width))
        ]
    z = [[column[row] for _, column in columns] for row in range(len(names))]
    return HeatmapRead(stat="swallowed_frac", source=source, layers=names,
                       steps=[step for step, _ in columns], z=z, downsampled=downsampled)
