"""Repository: the series and per-layer rollup rows (the math is `rollups`, pure) and the reads
that combine them with the raw steps at a range's edges. Functions take a Session and never
commit."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    CompoundSelect,
    Double,
    Integer,
    Select,
    and_,
    case,
    cast,
    func,
    or_,
    select,
    union_all,
)
from sqlalchemy.orm import Session

from ampscope_server.store import rollups, stat_packing
from ampscope_server.store.float_storage import from_storage
from ampscope_server.store.models import (
    LAYER_STAT_NAMES,
    LayerRollup,
    LayerStat,
    Rollup,
    Step,
)
from ampscope_server.store.sql_support import (
    KEYS_PER_STATEMENT,
    dialect_insert,
    is_postgres,
    run_key,
    step_range,
)

# --- rollups -----------------------------------------------------------------------------------

def _keyed(model: type[Rollup] | type[LayerRollup], run_id: str,
           keys: Sequence[tuple[int, int]], columns: Sequence[str]
           ) -> list[Select[Any] | CompoundSelect[Any]]:
    """Statements reading (level, bucket, *columns) of the run's rows among `keys` (level,
    bucket): per level a `bucket IN (...)` select, the levels' selects joined by UNION ALL,
    each statement at most `KEYS_PER_STATEMENT` keys.

    SQLite's planner probes the primary key (run_key, level, bucket) with one level's IN list,
    but with a row-value `(level, bucket) IN (...)` (or an OR of levels) it scanned every rollup
    row of the run, so each ingest batch read all of a long run's rollups. One statement for
    all levels rather than one per level: each statement is a round trip and SQLAlchemy and
    driver work, which ingest pays on every batch (docs/storage.md#ingests-statements). In
    slices: a batch of 10k records touches ~10k buckets, more than Postgres' planner takes in
    one IN list (StatementTooComplex)."""
    grouped: dict[int, list[int]] = {}
    for level, bucket in keys:
        grouped.setdefault(level, []).append(bucket)
    selected = [model.level, model.bucket, *[getattr(model, name) for name in columns]]
    statements: list[Select[Any] | CompoundSelect[Any]] = []
    parts: list[Select[Any]] = []
    size = 0
    for level, buckets in sorted(grouped.items()):
        for first in range(0, len(buckets), KEYS_PER_STATEMENT):
            piece = buckets[first:first + KEYS_PER_STATEMENT]
            if parts and size + len(piece) > KEYS_PER_STATEMENT:
                statements.append(_union(parts))
                parts, size = [], 0
            parts.append(select(*selected).where(
                model.run_key == run_key(run_id), model.level == level,
                model.bucket.in_(piece)))
            size += len(piece)
    if parts:
        statements.append(_union(parts))
    return statements


def _union(parts: list[Select[Any]]) -> Select[Any] | CompoundSelect[Any]:
    return parts[0] if len(parts) == 1 else union_all(*parts)


def get_rollups(
    session: Session, run_id: str, keys: Sequence[tuple[int, int]], columns: Sequence[str]
) -> list[tuple[Any, ...]]:
    """(level, bucket, *columns) of the run's stored series rollups among `keys` (level,
    bucket)."""
    return [tuple(row) for statement in _keyed(Rollup, run_id, keys, columns)
            for row in session.execute(statement)]


def get_layer_rollups(
    session: Session, run_id: str, keys: Sequence[tuple[int, int]]
) -> dict[tuple[int, int], bytes]:
    """{(level, bucket): packed per-layer rollup} of the run's stored ones among `keys`."""
    return {(int(level), int(bucket)): data
            for statement in _keyed(LayerRollup, run_id, keys, ["data"])
            for level, bucket, data in session.execute(statement)}


def _upsert(session: Session, model: type[Rollup] | type[LayerRollup],
            rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    keys = ("run_key", "level", "bucket")
    statement = dialect_insert(session, model)
    statement = statement.on_conflict_do_update(
        index_elements=[getattr(model, key) for key in keys],
        set_={name: getattr(statement.excluded, name) for name in rows[0] if name not in keys},
    )
    session.execute(statement, rows)


def upsert_rollups(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert series rollup rows or overwrite the stored ones (the caller merged them)."""
    _upsert(session, Rollup, rows)


def upsert_layer_rollups(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert per-layer rollup rows or overwrite the stored ones (the caller merged them)."""
    _upsert(session, LayerRollup, rows)


def step_extent(session: Session, run_id: str) -> tuple[int, int] | None:
    """(first step, last step) of the run, two index probes."""
    key = run_key(run_id)
    first = select(func.min(Step.step)).where(Step.run_key == key).scalar_subquery()
    last = select(func.max(Step.step)).where(Step.run_key == key).scalar_subquery()
    lo, hi = session.execute(select(first, last)).one()
    return None if lo is None else (int(lo), int(hi))


def rollup_rows(
    session: Session, run_id: str, level: int, first: int, last: int, columns: Sequence[str]
) -> list[tuple[Any, ...]]:
    """(bucket, *columns) of the run's rollups of one level, buckets first…last, in order.

    A column is "series" or a per-layer statistic of `rollups.ROLLUP_STATS`, given as
    `rollups.pack_stat` bytes (None for a bucket without layer statistics), at any level of
    `rollups.LEVELS`: below `rollups.SERIES_LEVELS` / `rollups.LAYER_LEVELS` folded from the
    raw steps.
    """
    if level in rollups.SERIES_LEVELS:
        rows: list[tuple[Any, ...]] = [tuple(row) for row in session.execute(
            select(Rollup.bucket, Rollup.series)
            .where(Rollup.run_key == run_key(run_id), Rollup.level == level,
                   Rollup.bucket.between(first, last))
            .order_by(Rollup.bucket)
        )]
    else:
        rows = sorted(series_from_steps(session, run_id, level, first, last).items())
    stats = [name for name in columns if name != "series"]
    layers = layer_rollup_arrays(session, run_id, [(level, first, last)]) if stats else {}
    out: list[tuple[Any, ...]] = []
    for bucket, series_blob in rows:
        arrays = layers.get((level, int(bucket)))
        out.append((bucket, *[
            series_blob if name == "series"
            else None if arrays is None else rollups.pack_stat(name, arrays[name])
            for name in columns
        ]))
    return out


def count_layer_rollups(session: Session, run_id: str, level: int, first: int, last: int
                        ) -> int:
    """How many per-layer rollup rows the run stores at `level` for buckets first..last."""
    return int(session.scalar(
        select(func.count()).select_from(LayerRollup)
        .where(LayerRollup.run_key == run_key(run_id), LayerRollup.level == level,
               LayerRollup.bucket.between(first, last))) or 0)


def layer_rollup_arrays(
    session: Session, run_id: str, ranges: Sequence[tuple[int, int, int]],
    names: Sequence[str] | None = None, rows: Sequence[int] | None = None,
) -> dict[tuple[int, int], rollups.LayerArrays]:
    """{(level, bucket): per-layer worst arrays} of the buckets in `ranges` ((level, first,
    last bucket)) that hold layer statistics: stored rows at `rollups.LAYER_LEVELS`; folded
    from the raw steps below them (at most 16 steps per bucket) and for a `LAYER_FINEST`
    bucket without a row (open, or sparse: at most `DENSE_STEPS` layer steps); the open bucket
    of a coarser level folded from its children (`rollups.open_children`). With `names`, the
    stored rows' arrays hold those statistics only (a heatmap shows one: the others' decoding
    was most of a wide read); folded buckets hold all. With `rows`, every array holds those
    layers only, in that order (`rollups.pick`): a layer's line reads one of 500."""
    stored = [piece for piece in ranges if piece[0] in rollups.LAYER_LEVELS]
    out: dict[tuple[int, int], rollups.LayerArrays] = {}
    folded: dict[tuple[int, int], rollups.LayerArrays] = {}
    if stored:
        out.update(_stored_layer_arrays(session, run_id, stored, names, rows))
        extent = step_extent(session, run_id)
        last_step = -1 if extent is None else extent[1]
        for level, first, last in stored:
            if level == rollups.LAYER_FINEST:
                missing = [bucket for bucket in range(first, min(last, last_step >> level) + 1)
                           if (level, bucket) not in out]
                folded.update(((level, bucket), arrays) for bucket, (arrays, _) in
                              fold_finest(session, run_id, missing).items())
            elif first <= last_step >> level <= last and (level, last_step >> level) not in out:
                arrays = _open_bucket(session, run_id, level, last_step >> level, last_step)
                if arrays is not None:
                    folded[(level, last_step >> level)] = arrays
    for level, first, last in ranges:
        if level in rollups.LAYER_LEVELS:
            continue
        raw = layer_steps_in(session, run_id, first << level, ((last + 1) << level) - 1)
        folded.update(((level, bucket), arrays)
                      for bucket, arrays in rollups.layer_buckets(raw, level).items())
    out.update(folded if rows is None else
               {key: rollups.pick(arrays, rows) for key, arrays in folded.items()})
    return out


def _stored_layer_arrays(
    session: Session, run_id: str, ranges: Sequence[tuple[int, int, int]],
    names: Sequence[str] | None, rows: Sequence[int] | None,
) -> dict[tuple[int, int], rollups.LayerArrays]:
    """The stored `layer_rollups` rows of `ranges`, decoded (all statistics, or `names`; all
    layers, or `rows`)."""
    where = [LayerRollup.run_key == run_key(run_id), or_(*[
        and_(LayerRollup.level == level, LayerRollup.bucket.between(first, last))
        for level, first, last in ranges])]
    if names is not None and is_postgres(session):
        return _layer_segments(session, run_id, where, names, rows)
    return {(int(level), int(bucket)): rollups.unpack_layers(data, names, rows)
            for level, bucket, data in session.execute(
                select(LayerRollup.level, LayerRollup.bucket, LayerRollup.data).where(*where))}


def _layer_segments(session: Session, run_id: str, where: Sequence[ColumnElement[bool]],
                    names: Sequence[str], rows: Sequence[int] | None
                    ) -> dict[tuple[int, int], rollups.LayerArrays]:
    """`_stored_layer_arrays` of some statistics on Postgres: the database cuts each one's
    segment out of the blob (`stat_packing` version 2), reading the head and the segments'
    TOAST chunks only. A whole ~19 KB blob of 500 layers per row (sent as hex text) was most of
    a heatmap's or a layer line's time for one statistic of ~1.9 KB. A row that is not version
    2 (none is written since revision 0015) is read whole."""
    k = len(rollups.ROLLUP_STATS)
    head_size = stat_packing.apart_head_size(k)
    # OFFSET 0 keeps the subquery from being flattened: otherwise every get_byte below would cut
    # its own head out of the stored blob instead of reading the one head of the row.
    blobs = select(LayerRollup.level, LayerRollup.bucket, LayerRollup.data,
                   func.substr(LayerRollup.data, 1, head_size).label("head")
                   ).where(*where).offset(0).subquery()

    def size(index: int) -> ColumnElement[int]:  # the u32 at apart_size_at, as substr's int
        at = stat_packing.apart_size_at(k, index)
        return cast(functools.reduce(operator.add, [
            cast(func.get_byte(blobs.c.head, at + byte), BigInteger) * (1 << 8 * byte)
            for byte in range(4)]), Integer)

    indices = [rollups.ROLLUP_STATS.index(name) for name in names]
    segments = [
        case((func.get_byte(blobs.c.head, 0) == stat_packing.APART, func.substr(
            blobs.c.data, functools.reduce(operator.add, [size(j) for j in range(index)],
                                          head_size + 1), size(index))))
        for index in indices]
    out: dict[tuple[int, int], rollups.LayerArrays] = {}
    whole: list[tuple[int, int]] = []
    for level, bucket, head, *cut in session.execute(
            select(blobs.c.level, blobs.c.bucket, blobs.c.head, *segments)):
        key = (int(level), int(bucket))
        if head[0] != stat_packing.APART:
            whole.append(key)
            continue
        out[key] = {name: rollups.unpack_layer_segment(head, name, piece, rows)
                    for name, piece in zip(names, cut, strict=True)}
    out.update((key, rollups.unpack_layers(data, names, rows))
               for key, data in get_layer_rollups(session, run_id, whole).items())
    return out


def _open_bucket(session: Session, run_id: str, level: int, bucket: int, last_step: int
                 ) -> rollups.LayerArrays | None:
    """The per-layer worst of an open bucket above `LAYER_FINEST` (no row is stored until it
    closes): its closed children's rows and its open child, recursively."""
    closed, open_child = rollups.open_children(level, bucket, last_step)
    child = rollups.children(level, bucket)[0]
    rows = get_layer_rollups(session, run_id, [(child, c) for c in closed])
    parts = [rollups.unpack_layers(rows[(child, c)]) for c in closed if (child, c) in rows]
    if child == rollups.LAYER_FINEST:
        folded = fold_finest(session, run_id,
                             [c for c in closed if (child, c) not in rows] + [open_child])
        parts.extend(arrays for arrays, _ in folded.values())
    else:
        inner = _open_bucket(session, run_id, child, open_child, last_step)
        if inner is not None:
            parts.append(inner)
    return rollups.reduce_layers(parts) if parts else None


def fold_finest(session: Session, run_id: str, buckets: Sequence[int],
                before_id: int | None = None) -> dict[int, tuple[rollups.LayerArrays, int]]:
    """{bucket: (per-layer worst, layer steps)} of `LAYER_FINEST` buckets folded from their raw
    steps (those with an id below `before_id`, when given), one query per run of adjacent
    buckets; a bucket without layer statistics is left out."""
    level = rollups.LAYER_FINEST
    out: dict[int, tuple[rollups.LayerArrays, int]] = {}
    spans: list[list[int]] = []
    for bucket in sorted(set(buckets)):
        if spans and spans[-1][1] == bucket - 1:
            spans[-1][1] = bucket
        else:
            spans.append([bucket, bucket])
    for first, last in spans:
        grouped: dict[int, list[rollups.RawLayers]] = {}
        for step, stats, scale in layer_steps_in(
                session, run_id, first << level, ((last + 1) << level) - 1, before_id):
            grouped.setdefault(step >> level, []).append((stats, scale))
        out.update((bucket, (rollups.reduce_steps(steps), len(steps)))
                   for bucket, steps in grouped.items())
    return out


def layer_step_marks(session: Session, run_id: str, start: int, end: int, before_id: int
                     ) -> tuple[int, int | None, int | None]:
    """(how many, the smallest id, the largest id) of the run's steps in [start, end] that
    carry layer statistics and have an id below `before_id`: what `fold_finest` would fold,
    told apart without reading a blob (`open_buckets` checks a remembered fold against it)."""
    count, first, last = session.execute(
        select(func.count(), func.min(Step.id), func.max(Step.id))
        .select_from(Step).join(LayerStat, LayerStat.step_id == Step.id)
        .where(*step_range(run_id, start, end), Step.id < before_id)
    ).one()
    return int(count), first, last


def layer_steps_in(
    session: Session, run_id: str, start: int, end: int, before_id: int | None = None
) -> list[tuple[int, dict[str, list[Any]], float | None]]:
    """(step, {stat: per-layer values}, scale_before) of the run's steps in [start, end] that
    carry layer statistics (with an id below `before_id`, when given: the steps stored before
    an ingest's own), by step then ingest order."""
    clauses = step_range(run_id, start, end)
    if before_id is not None:
        clauses.append(Step.id < before_id)
    rows = session.execute(
        select(Step.step, Step.scale_before, Step.scale_before_class, LayerStat.data)
        .join(LayerStat, LayerStat.step_id == Step.id)
        .where(*clauses)
        .order_by(Step.step, Step.id)
    )
    return [
        (int(step), dict(zip(LAYER_STAT_NAMES, stat_packing.unpack(data), strict=True)),
         from_storage(scale, scale_cls))
        for step, scale, scale_cls, data in rows
    ]


def rollup_pieces(
    session: Session, run_id: str, ranges: Sequence[tuple[int, int, int]], column: str
) -> list[tuple[int, int, bytes | None]]:
    """(level, bucket, column) of the rollups in `ranges` ((level, first, last bucket)); the
    series of the levels below `rollups.SERIES_LEVELS` folded from the raw steps; a
    per-layer statistic as `rollups.pack_stat` bytes, of the buckets that hold layer
    statistics (see `layer_rollup_arrays`)."""
    if not ranges:
        return []
    if column != "series":
        return [(level, bucket, rollups.pack_stat(column, arrays[column]))
                for (level, bucket), arrays in layer_rollup_arrays(session, run_id, ranges).items()]
    stored = [piece for piece in ranges if piece[0] in rollups.SERIES_LEVELS]
    out: list[tuple[int, int, bytes | None]] = []
    if stored:
        out.extend((int(level), int(bucket), blob) for level, bucket, blob in session.execute(
            select(Rollup.level, Rollup.bucket, Rollup.series)
            .where(Rollup.run_key == run_key(run_id))
            .where(or_(*[
                and_(Rollup.level == level, Rollup.bucket.between(first, last))
                for level, first, last in stored
            ]))
        ))
    for level, first, last in ranges:
        if level not in rollups.SERIES_LEVELS:
            out.extend((level, bucket, blob) for bucket, blob in
                       series_from_steps(session, run_id, level, first, last).items())
    return out


def series_from_steps(session: Session, run_id: str, level: int, first: int, last: int
                      ) -> dict[int, bytes]:
    """{bucket: packed series} of the buckets first…last of a level whose series rollups are
    not stored, folded from the raw steps (`rollups.series_buckets`)."""
    columns = [column for name in rollups.SERIES
               for column in (getattr(Step, name), getattr(Step, f"{name}_class"))]
    rows = session.execute(
        select(Step.step, *columns)
        .where(*step_range(run_id, first << level, ((last + 1) << level) - 1))
        .order_by(Step.step, Step.id)
    )
    steps = ((int(row[0]), [from_storage(row[i], row[i + 1])
                            for i in range(1, len(columns), 2)]) for row in rows)
    return {bucket: rollups.pack_series(accs)
            for bucket, accs in rollups.series_buckets(steps, level).items()}


# --- skip counts (revision 0013) ---------------------------------------------------------------

def stored_steps(session: Session, run_id: str, steps: Sequence[int], before_id: int
                 ) -> set[int]:
    """The step numbers among `steps` that the run already stored (in a step with an id below
    `before_id`: before an ingest's own steps)."""
    found: set[int] = set()
    ordered = sorted(set(steps))
    for start in range(0, len(ordered), KEYS_PER_STATEMENT):
        found.update(int(step) for step in session.execute(
            select(Step.step).distinct()
            .where(Step.run_key == run_key(run_id), Step.id < before_id,
                   Step.step.in_(ordered[start:start + KEYS_PER_STATEMENT]))).scalars())
    return found


def skip_block_maxima(session: Session, run_id: str, level: int, units: int, first: int,
                      last: int, width: int) -> list[tuple[int, float]]:
    """(column, highest block rate) of the run's series rollups of `level` that overlap
    [first, last], in column order.

    A block is `units` consecutive buckets ending at one stored bucket (fewer at the range's
    start, and a gap holds no step: `RANGE`, not `ROWS`); its rate is the skip count over the
    step count of its buckets; its column is (the last step of its last bucket - first) //
    `width`. The database does the sliding sums and the maximum per column, so only the
    columns travel, however many buckets the range spans.
    """
    unit = 1 << level
    skipped: ColumnElement[int]
    counted: ColumnElement[int]
    if units == 1:  # a block is one bucket: no window function (a third of the time on SQLite)
        skipped, counted = Rollup.skip_count.expression, Rollup.step_count.expression
    else:
        frame = (-(units - 1), 0)
        skipped = func.sum(Rollup.skip_count).over(order_by=Rollup.bucket, range_=frame)
        counted = func.sum(Rollup.step_count).over(order_by=Rollup.bucket, range_=frame)
    blocks = (
        select(((Rollup.bucket * unit + (unit - 1 - first)) // width).label("col"),
               (cast(skipped, Double) / func.nullif(counted, 0)).label("rate"))
        .where(Rollup.run_key == run_key(run_id), Rollup.level == level,
               Rollup.bucket.between(first >> level, last >> level))
        .subquery()
    )
    rows = session.execute(select(blocks.c.col, func.max(blocks.c.rate))
                           .group_by(blocks.c.col).order_by(blocks.c.col))
    return [(int(col), float(rate)) for col, rate in rows if rate is not None]


def skipped_buckets(session: Session, run_id: str, level: int, first: int, last: int
                    ) -> list[int]:
    """The run's buckets of `level` that overlap [first, last] and hold a skipped step, in
    order."""
    return [int(bucket) for bucket in session.execute(
        select(Rollup.bucket)
        .where(Rollup.run_key == run_key(run_id), Rollup.level == level,
               Rollup.bucket.between(first >> level, last >> level), Rollup.skip_count > 0)
        .order_by(Rollup.bucket)).scalars()]


def last_step_in(session: Session, run_id: str, first: int, last: int) -> int | None:
    """The run's highest stored step within [first, last] (one index probe)."""
    found = session.execute(
        select(func.max(Step.step)).where(*step_range(run_id, first, last))).scalar_one()
    return None if found is None else int(found)
