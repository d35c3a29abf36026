"""Repository: a run's steps and what rides on them (packed layer statistics, activation
stats, histograms, non-finite layers, misuse, re-checks, swallowed updates): the batch's inserts
and the bounded reads of charts, events, heatmaps and comparisons. Functions take a Session and
never commit."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple, TypeVar, cast

from sqlalchemy import (
    Float,
    Row,
    Select,
    case,
    func,
    or_,
    select,
    text,
)
from sqlalchemy.orm import Session

from ampscope_server.store import bulk_repository, stat_packing
from ampscope_server.store.float_storage import to_storage
from ampscope_server.store.models import (
    LAYER_STAT_NAMES,
    STEP_HAS_MISUSE,
    STEP_IS_EVENT,
    ActivationStat,
    Base,
    Histogram,
    Layer,
    LayerStat,
    MisuseEvent,
    Run,
    Step,
    StepFormats,
    StepNonfinite,
    StepRecheck,
    StepShadow,
    SwallowedStat,
)
from ampscope_server.store.sql_support import (
    KEYS_PER_STATEMENT,
    dialect_insert,
    in_ids,
    is_postgres,
    run_key,
    step_range,
    table_of,
)

# --- steps -------------------------------------------------------------------------------------

def insert_steps(session: Session, rows: list[dict[str, Any]]) -> dict[int, int]:
    """Insert step rows, skipping (run_key, attempt, seq) already stored; {seq: new id} of the
    new."""
    if not rows:
        return {}
    table = table_of(Step)
    if is_postgres(session):
        return {int(seq): int(step_id) for seq, step_id in bulk_repository.insert(
            session, table, rows, conflict=("run_key", "attempt", "seq"),
            returning=("seq", "id"))}
    # The Core table, not the ORM entity: an ORM bulk insert leaves a row's None values out of
    # its parameters, so rows that differ in which fields are None (a loss here, a grad norm
    # there) split into one statement each, and splicing their RETURNING rows together grew
    # quadratically (docs/storage.md#ingests-statements). A Core insert binds None as NULL:
    # one multi-row statement per driver batch.
    statement = (
        dialect_insert(session, table)
        .on_conflict_do_nothing(index_elements=[table.c.run_key, table.c.attempt, table.c.seq])
        .returning(table.c.seq, table.c.id)
    )
    return {int(seq): int(step_id) for seq, step_id in session.execute(statement, rows)}


def insert_rows(session: Session, model: type[Base], rows: list[dict[str, Any]]) -> None:
    """Bulk insert of a step's children: one executemany per table.

    The Core table insert skips the ORM's per-row bookkeeping. On SQLite, where no column of
    the rows needs a bind processor (plain numbers and strings: the layer statistics), the rows
    go to the driver's executemany as tuples: SQLAlchemy's per-row parameter handling was most
    of the ingest time of a 200-layer batch (docs/storage.md#ingests-statements). A float
    column's processor only turns ints into floats, which SQLite's REAL affinity does on
    storage anyway.
    """
    if not rows:
        return
    table = table_of(model)
    dialect = session.get_bind().dialect
    names = list(rows[0])
    if dialect.name == "postgresql" and bulk_repository.supported(table, names):
        bulk_repository.copy(session, table, rows)
        return
    if dialect.name == "sqlite" and len(names) > 1 and all(
        isinstance(table.c[name].type, Float)
        or table.c[name].type._cached_bind_processor(dialect) is None
        for name in names
    ):
        quote = dialect.identifier_preparer.quote
        sql = (f"INSERT INTO {quote(table.name)} ({', '.join(map(quote, names))}) "
               f"VALUES ({', '.join('?' * len(names))})")
        session.connection().exec_driver_sql(sql, list(map(itemgetter(*names), rows)))
        return
    session.execute(table.insert(), rows)


def step_aggregates(
    session: Session, run_ids: Iterable[str]
) -> dict[str, tuple[int, int | None, int, int | None]]:
    """{run_id: (num_steps, last_step, skipped_steps, last_id)}."""
    rows = session.execute(
        select(
            Run.id,
            func.count(),
            func.max(Step.step),
            func.coalesce(func.sum(case((Step.skipped, 1), else_=0)), 0),
            func.max(Step.id),
        )
        .join(Run, Run.key == Step.run_key)
        .where(Run.id.in_(list(run_ids)))
        .group_by(Run.id)
    )
    return {
        run_id: (int(n), None if last is None else int(last), int(skipped),
                 None if last_id is None else int(last_id))
        for run_id, n, last, skipped, last_id in rows
    }


def steps_after(
    session: Session, run_id: str, after_id: int, limit: int
) -> Sequence[Row[Step, int]]:
    """(Step, attempt ordinal) with id > after_id, in ingest (id) order."""
    return session.execute(
        select(Step, Step.attempt)
        .where(Step.run_key == run_key(run_id), Step.id > after_id)
        .order_by(Step.id)
        .limit(limit)
    ).all()


@dataclass(frozen=True, slots=True)
class LayerStatRow:
    """One layer's statistics at one step, as unpacked from the step's `layer_stats` row."""

    step_id: int
    layer_index: int
    amax: float | None
    amin_nz: float | None
    zero_frac: float
    subnormal_frac: float
    underflow_frac: float
    nan_count: int
    inf_count: int
    l2: float | None


def layer_stats_of(session: Session, step_ids: Sequence[int]) -> Sequence[LayerStatRow]:
    """Every layer's statistics at the given steps, by step id then layer index."""
    if not step_ids:
        return []
    rows = session.execute(
        select(LayerStat.step_id, LayerStat.data)
        .where(LayerStat.step_id.in_(step_ids))
        .order_by(LayerStat.step_id)
    )
    return [
        LayerStatRow(int(step_id), index, *values)
        for step_id, data in rows
        for index, values in enumerate(zip(*stat_packing.unpack(data), strict=True))
    ]


@dataclass(frozen=True, slots=True)
class ActivationStatRow:
    """One module's `grad_output` statistics at one step, as unpacked from the step's
    `activation_stats` row; amax, amin_nz and l2 as (value, class) like the step floats
    (`to_storage`: None with class 1, 2, 3 for NaN, +inf, -inf)."""

    step_id: int
    module_index: int
    amax: float | None
    amax_class: int
    amin_nz: float | None
    amin_nz_class: int
    zero_frac: float
    subnormal_frac: float
    underflow_frac: float
    nan_count: int
    inf_count: int
    l2: float | None
    l2_class: int


def _activation_rows(step_id: int, data: bytes) -> list[ActivationStatRow]:
    return [
        ActivationStatRow(step_id, index, *to_storage(amax), *to_storage(amin),
                          zero, sub, under, nan, inf, *to_storage(l2))
        for index, (amax, amin, zero, sub, under, nan, inf, l2) in enumerate(
            zip(*stat_packing.unpack(data), strict=True))
    ]


def activation_stats_of(session: Session, step_ids: Sequence[int]
                        ) -> Sequence[ActivationStatRow]:
    """Every module's activation statistics at the given steps, by step id then module."""
    if not step_ids:
        return []
    rows = session.execute(
        select(ActivationStat.step_id, ActivationStat.data)
        .where(ActivationStat.step_id.in_(step_ids))
        .order_by(ActivationStat.step_id)
    )
    return [row for step_id, data in rows for row in _activation_rows(int(step_id), data)]


class NonfiniteRow(NamedTuple):
    """One layer that went non-finite at one step (a `step_nonfinite` row, without its order)."""

    step_id: int
    layer_index: int
    kind: str


def nonfinite_of(session: Session, step_ids: Sequence[int]) -> list[NonfiniteRow]:
    """Non-finite layers of the given steps, by step id, each step's in backward order.

    Primary-key probes for these steps only, KEYS_PER_STATEMENT ids a statement: an events
    page reads its own skipped steps' layers, whatever the run holds besides, and a whole list
    (the report) may hold more skipped steps than a statement takes bound parameters. Plain
    tuples, not ORM objects: building those was half of an events page's time."""
    ids = sorted(set(step_ids))
    out: list[NonfiniteRow] = []
    for first in range(0, len(ids), KEYS_PER_STATEMENT):
        out.extend(NonfiniteRow(*row) for row in session.execute(
            select(StepNonfinite.step_id, StepNonfinite.layer_index, StepNonfinite.kind)
            .where(in_ids(session, StepNonfinite.step_id,
                          ids[first:first + KEYS_PER_STATEMENT]))
            .order_by(StepNonfinite.step_id, StepNonfinite.position)
        ))
    return out


def misuse_of(session: Session, step_ids: Sequence[int]) -> Sequence[MisuseEvent]:
    if not step_ids:
        return []
    return session.scalars(
        select(MisuseEvent)
        .where(MisuseEvent.step_id.in_(step_ids))
        .order_by(MisuseEvent.step_id, MisuseEvent.position)
    ).all()


@dataclass(frozen=True, slots=True)
class HistogramRow:
    """One layer's exponent histogram at one step, as unpacked from the step's `histograms`
    row: max_exp - min_exp + 5 counts."""

    step_id: int
    layer_index: int
    min_exp: int
    max_exp: int
    counts: list[int]


def histograms_of(session: Session, step_ids: Sequence[int]) -> Sequence[HistogramRow]:
    """Every layer's histogram at the given steps, by step id then layer."""
    if not step_ids:
        return []
    out: list[HistogramRow] = []
    for step_id, min_exp, max_exp, layers, data in session.execute(
        select(Histogram.step_id, Histogram.min_exp, Histogram.max_exp, Histogram.layers,
               Histogram.data)
        .where(Histogram.step_id.in_(step_ids))
        .order_by(Histogram.step_id)
    ):
        # One int64 column without nulls: ingest packs the wire's counts, all ints.
        flat = cast(list[int], stat_packing.unpack(data)[0])
        bins = len(flat) // layers if layers else 0
        out.extend(HistogramRow(int(step_id), index, int(min_exp), int(max_exp),
                                flat[index * bins:(index + 1) * bins])
                   for index in range(layers))
    return out


def series_rows(
    session: Session, run_id: str, column: str, start: int | None, end: int | None,
    applied_only: bool = False,
) -> Sequence[Row[int, float | None, int]]:
    """(step, value, value_class) of one classed step column, by step then ingest order; with
    `applied_only`, of the steps the optimizer took (not skipped) only."""
    value = getattr(Step, column)
    value_class = getattr(Step, f"{column}_class")
    statement = (
        select(Step.step, value, value_class)
        .where(*step_range(run_id, start, end))
        .where(or_(value.is_not(None), value_class != 0))
        .order_by(Step.step, Step.id)
    )
    if applied_only:
        statement = statement.where(Step.skipped.is_(False))
    return session.execute(statement).all()


def event_rows(
    session: Session, run_id: str, start: int | None = None, end: int | None = None,
    limit: int | None = None,
) -> Sequence[Row[int, int, bool, bool, float | None, int, float | None, int, float | None,
                 int]]:
    """(id, step, skipped, found_inf, scale_before, its class, scale_after, its class, loss, its
    class) of the (first `limit`) steps (within [start, end]) that were skipped, held a
    non-finite gradient or whose scale changed (or is non-finite), in step order."""
    return session.execute(event_rows_statement(run_id, start, end, limit)).all()


def event_rows_statement(run_id: str, start: int | None = None, end: int | None = None,
                         limit: int | None = None
                         ) -> Select[int, int, bool, bool, float | None, int, float | None, int,
                                     float | None, int]:
    """`event_rows`' query: its condition is the partial index's (`models.STEP_IS_EVENT`), as
    written, so both dialects read the event steps from that index (revision 0014)."""
    return (
        select(Step.id, Step.step, Step.skipped, Step.found_inf, Step.scale_before,
               Step.scale_before_class, Step.scale_after, Step.scale_after_class, Step.loss,
               Step.loss_class)
        .where(*step_range(run_id, start, end))
        .where(text(f"({STEP_IS_EVENT})"))
        .order_by(Step.step, Step.id)
        .limit(limit)
    )


SKIP_FLAG_ROWS = 10_000
"""Rows fetched per round trip when streaming a run's skip flags."""


def skip_flags(
    session: Session, run_id: str, start: int | None, end: int | None
) -> Iterator[tuple[int, bool]]:
    """(step, skipped) of every step within [start, end], by step then ingest order, streamed
    (the skip rate's input: the rollups do not count skips)."""
    result = session.execute(
        select(Step.step, Step.skipped).where(*step_range(run_id, start, end))
        .order_by(Step.step, Step.id)
        .execution_options(yield_per=SKIP_FLAG_ROWS))
    for step, skipped in result:
        yield int(step), bool(skipped)


def misuse_rows_statement(run_id: str, start: int | None = None, end: int | None = None
                          ) -> Select[int, int, float | None, int, float | None, int, str, str]:
    """The statement of `misuse_rows`. Its steps come from the partial index of the steps that
    reported misuse (revision 0016: the condition `models.STEP_HAS_MISUSE` as written), not
    from every step of the range joined to `misuse_events` (~500k steps for the first events
    page of a 1M-step run)."""
    return (
        select(Step.id, Step.step, Step.scale_before, Step.scale_before_class,
               Step.scale_after, Step.scale_after_class, MisuseEvent.kind, MisuseEvent.detail)
        .join(MisuseEvent, MisuseEvent.step_id == Step.id)
        .where(*step_range(run_id, start, end), text(STEP_HAS_MISUSE))
        .order_by(Step.step, Step.id, MisuseEvent.position)
    )


def misuse_rows(
    session: Session, run_id: str, start: int | None = None, end: int | None = None
) -> Sequence[Row[int, int, float | None, int, float | None, int, str, str]]:
    """(step id, step, scale_before, its class, scale_after, its class, kind, detail) of every
    misuse event of the run (within [start, end]), in step order, then as reported."""
    return session.execute(misuse_rows_statement(run_id, start, end)).all()


def heatmap_rows(
    session: Session, run_id: str, source: str, stat_columns: Sequence[str], start: int | None,
    end: int | None,
) -> list[tuple[Any, ...]]:
    """(step_id, step, scale_before, scale_before_class, index, *stats) by step order.

    `source` "param" reads `layer_stats` (index = layer), "activation" `activation_stats`
    (index = module).
    """
    if source != "activation":
        positions = [LAYER_STAT_NAMES.index(name) for name in stat_columns]
        out: list[tuple[Any, ...]] = []
        for step_id, step, scale, scale_cls, data in session.execute(
            select(Step.id, Step.step, Step.scale_before, Step.scale_before_class,
                   LayerStat.data)
            .join(LayerStat, LayerStat.step_id == Step.id)
            .where(*step_range(run_id, start, end))
            .order_by(Step.step, Step.id)
        ):
            columns = stat_packing.unpack(data)
            picked = [columns[position] for position in positions]
            out.extend((step_id, step, scale, scale_cls, index, *values)
                       for index, values in enumerate(zip(*picked, strict=True)))
        return out
    out = []
    for step_id, step, scale, scale_cls, data in session.execute(
        select(Step.id, Step.step, Step.scale_before, Step.scale_before_class,
               ActivationStat.data)
        .join(ActivationStat, ActivationStat.step_id == Step.id)
        .where(*step_range(run_id, start, end))
        .order_by(Step.step, Step.id)
    ):
        out.extend((step_id, step, scale, scale_cls, row.module_index,
                    *[getattr(row, name) for name in stat_columns])
                   for row in _activation_rows(int(step_id), data))
    return out


# --- runs page and comparison (read-only; one block, kept at the end) ---------------------------

def last_layer_stat_steps(session: Session, run_ids: Iterable[str]) -> dict[str, int]:
    """{run_id: id of the run's last ingested step that carries layer statistics}.

    Bounded per run: a correlated `ORDER BY id DESC LIMIT 1` over `ix_steps_run_id_id` that stops
    at the first step with a `layer_stats` row (a primary-key probe), so it reads the steps since
    the last layer-stat step, never the whole run. Runs without layer statistics are left out.
    """
    has_stats = select(LayerStat.step_id).where(LayerStat.step_id == Step.id).exists()
    last = (
        select(Step.id).where(Step.run_key == Run.key, has_stats)
        .order_by(Step.id.desc()).limit(1).correlate(Run).scalar_subquery()
    )
    rows = session.execute(select(Run.id, last).where(Run.id.in_(list(run_ids))))
    return {run_id: int(step_id) for run_id, step_id in rows if step_id is not None}


def named_layer_stats(
    session: Session, step_ids: Iterable[int]
) -> Sequence[tuple[str, float | None, int, int, str, float, float, float | None, int]]:
    """(run_id, scale_before, its class, layer index, layer name, zero_frac, underflow_frac, amax,
    nan_count + inf_count) of every layer (of the run's layer table) at the given steps, by run
    then model order."""
    ids = list(step_ids)
    if not ids:
        return []
    rows = session.execute(
        select(Run.id, Step.scale_before, Step.scale_before_class, LayerStat.data)
        .join(LayerStat, LayerStat.step_id == Step.id)
        .join(Run, Run.key == Step.run_key)
        .where(Step.id.in_(ids))
        .order_by(Run.id, Step.id)
    ).all()
    names: dict[tuple[str, int], str] = {
        (run_id, int(index)): name for run_id, index, name in session.execute(
            select(Layer.run_id, Layer.index, Layer.name)
            .where(Layer.run_id.in_({row[0] for row in rows})))
    }
    zero, under, amax, nans, infs = (
        LAYER_STAT_NAMES.index(name)
        for name in ("zero_frac", "underflow_frac", "amax", "nan_count", "inf_count"))
    out: list[tuple[str, float | None, int, int, str, float, float, float | None, int]] = []
    for run_id, scale, scale_cls, data in rows:
        columns: list[list[Any]] = stat_packing.unpack(data)  # floats and counts by column
        for index, (z, u, a, n, i) in enumerate(zip(columns[zero], columns[under], columns[amax],
                                                    columns[nans], columns[infs], strict=True)):
            name = names.get((run_id, index))
            if name is not None:
                out.append((run_id, scale, scale_cls, index, name, z, u, a, (n or 0) + (i or 0)))
    return out


# --- wire v3: FP32 re-checks and swallowed updates ----------------------------------------------

def rechecks_of(session: Session, step_ids: Sequence[int]) -> list[StepRecheck]:
    """The FP32 re-checks of the given steps (steps that were not re-checked have none), by
    step id."""
    return _rows_of(session, StepRecheck, step_ids)


def shadows_of(session: Session, step_ids: Sequence[int]) -> list[StepShadow]:
    """The FP32 shadow steps of the given steps (most steps have none), by step id."""
    return _rows_of(session, StepShadow, step_ids)


def formats_of(session: Session, step_ids: Sequence[int]) -> list[StepFormats]:
    """The formats samples of the given steps (most steps have none), by step id."""
    return _rows_of(session, StepFormats, step_ids)


_StepChild = TypeVar("_StepChild", StepRecheck, StepShadow, StepFormats)


def _rows_of(session: Session, model: type[_StepChild],
             step_ids: Sequence[int]) -> list[_StepChild]:
    """`model`'s rows (one per step at most) of the given steps, by step id;
    KEYS_PER_STATEMENT ids a statement (see `nonfinite_of`)."""
    ids = sorted(set(step_ids))
    out: list[_StepChild] = []
    for first in range(0, len(ids), KEYS_PER_STATEMENT):
        out.extend(session.scalars(
            select(model)
            .where(in_ids(session, model.step_id, ids[first:first + KEYS_PER_STATEMENT]))
            .order_by(model.step_id)
        ))
    return out


@dataclass(frozen=True, slots=True)
class SwallowedRow:
    """One layer's swallowed fraction at one step (None: not measured), as unpacked from the
    step's `swallowed_stats` row."""

    step_id: int
    layer_index: int
    frac: float | None


def swallowed_fractions(data: bytes) -> list[float | None]:
    """The per-layer fractions of a `swallowed_stats.data` blob, in layer order."""
    return [None if frac is None else float(frac) for frac in stat_packing.unpack(data)[0]]


def swallowed_of(session: Session, step_ids: Sequence[int]) -> Sequence[SwallowedRow]:
    """The swallowed fractions of the given steps, by step then layer."""
    if not step_ids:
        return []
    rows = session.execute(
        select(SwallowedStat.step_id, SwallowedStat.data)
        .where(SwallowedStat.step_id.in_(step_ids))
        .order_by(SwallowedStat.step_id)
    )
    return [SwallowedRow(int(step_id), index, frac) for step_id, data in rows
            for index, frac in enumerate(swallowed_fractions(data))]


def swallowed_rows(
    session: Session, run_id: str, start: int | None, end: int | None
) -> list[tuple[int, int, int, float | None]]:
    """(step id, step, layer index, fraction) of the run's swallowed fractions in range, by
    step, ingest order, layer."""
    rows = session.execute(
        select(Step.id, Step.step, SwallowedStat.data)
        .join(SwallowedStat, SwallowedStat.step_id == Step.id)
        .where(*step_range(run_id, start, end))
        .order_by(Step.step, Step.id)
    )
    return [(int(step_id), int(step), index, frac) for step_id, step, data in rows
            for index, frac in enumerate(swallowed_fractions(data))]
