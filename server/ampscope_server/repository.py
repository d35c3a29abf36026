"""Every SQL statement of the server. Functions take a Session and never commit.

Inserts that must be idempotent use the dialect's INSERT … ON CONFLICT DO NOTHING.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    Row,
    Table,
    and_,
    case,
    func,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from ampscope_server import bulk_repository, codec, rollups, stat_packing
from ampscope_server.models import (
    LAYER_STAT_NAMES,
    ActivationStat,
    Attempt,
    Base,
    Histogram,
    Layer,
    LayerRollup,
    LayerStat,
    MisuseEvent,
    Module,
    Rollup,
    Run,
    Step,
    StepNonfinite,
    StepRecheck,
    SwallowedStat,
)

KEYS_PER_STATEMENT = 1000
"""The longest IN list one statement carries (SQLite's default limit is 32,766 variables)."""


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


def _unpack_stats(data: bytes) -> list[list[Any]]:
    """A step's packed layer statistics as columns in LAYER_STAT_NAMES order."""
    return stat_packing.unpack(data)


def _postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _table(model: type[Base]) -> Table:
    return Base.metadata.tables[model.__tablename__]


def _insert(session: Session, model: type[Any]) -> Any:
    """The dialect's INSERT, which knows ON CONFLICT."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(model)
    return sqlite.insert(model)


# --- runs and attempts -------------------------------------------------------------------------

def touch_run(session: Session, values: dict[str, Any], now: float) -> None:
    """Create the run if new, then bump `updated_at`.

    Both statements write, so on SQLite the transaction takes the write lock first (no read
    snapshot to upgrade) and on Postgres the run's row lock serialises batches of one run.
    """
    session.execute(
        _insert(session, Run)
        .values(**values, status="active", created_at=now, updated_at=now)
        .on_conflict_do_nothing(index_elements=[Run.id])
    )
    session.execute(update(Run).where(Run.id == values["id"]).values(updated_at=now))


def set_run_status(session: Session, run_id: str, status: str) -> None:
    session.execute(update(Run).where(Run.id == run_id).values(status=status))


def get_run(session: Session, run_id: str) -> Run | None:
    return session.get(Run, run_id)


def list_runs(session: Session, project: str | None = None) -> Sequence[Run]:
    """Every run (of `project`, when given), newest first."""
    statement = select(Run).order_by(Run.created_at.desc(), Run.id)
    if project is not None:
        statement = statement.where(Run.project == project)
    return session.scalars(statement).all()


def get_runs(session: Session, run_ids: Iterable[str], project: str | None = None
             ) -> Sequence[Run]:
    """The runs among `run_ids` that exist (in `project`, when given), newest first."""
    statement = (select(Run).where(Run.id.in_(list(run_ids)))
                 .order_by(Run.created_at.desc(), Run.id))
    if project is not None:
        statement = statement.where(Run.project == project)
    return session.scalars(statement).all()


def runs_matching(session: Session, *, prefix: str | None = None, name: str | None = None,
                  limit: int = 2) -> Sequence[Run]:
    """Up to `limit` runs whose id starts with `prefix` or whose name is `name`."""
    statement = select(Run).order_by(Run.created_at.desc(), Run.id).limit(limit)
    if prefix is not None:
        statement = statement.where(Run.id.startswith(prefix, autoescape=True))
    if name is not None:
        statement = statement.where(Run.name == name)
    return session.scalars(statement).all()


def get_attempt(session: Session, attempt_id: str) -> Attempt | None:
    return session.get(Attempt, attempt_id)


def create_attempt(
    session: Session, attempt_id: str, run_id: str, pid: int, started_at: float
) -> Attempt:
    """Add the run's next attempt (ordinal = 1 + the highest so far)."""
    ordinal = session.scalar(
        select(func.coalesce(func.max(Attempt.ordinal), 0) + 1).where(Attempt.run_id == run_id)
    )
    attempt = Attempt(
        id=attempt_id, run_id=run_id, ordinal=int(ordinal or 1), pid=pid, started_at=started_at
    )
    session.add(attempt)
    session.flush()
    return attempt


def set_attempt_client(session: Session, attempt_id: str, values: dict[str, int]) -> None:
    session.execute(update(Attempt).where(Attempt.id == attempt_id).values(**values))


def list_attempts(session: Session, run_id: str) -> Sequence[Attempt]:
    return session.scalars(
        select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.ordinal)
    ).all()


# --- layers ------------------------------------------------------------------------------------

def get_layers(session: Session, run_id: str) -> Sequence[Layer]:
    return session.scalars(select(Layer).where(Layer.run_id == run_id).order_by(Layer.index)).all()


def layer_numels(session: Session, run_id: str) -> list[int]:
    """The numel of each of the run's layers, in index order (empty: no layer table)."""
    return [int(numel) for numel in session.scalars(
        select(Layer.numel).where(Layer.run_id == run_id).order_by(Layer.index))]


def insert_layers(session: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        session.execute(_insert(session, Layer), rows)


def get_modules(session: Session, run_id: str) -> Sequence[Module]:
    return session.scalars(
        select(Module).where(Module.run_id == run_id).order_by(Module.index)
    ).all()


def insert_modules(session: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        session.execute(_insert(session, Module), rows)


def count_layers(session: Session, run_ids: Iterable[str]) -> dict[str, int]:
    rows = session.execute(
        select(Layer.run_id, func.count()).where(Layer.run_id.in_(list(run_ids)))
        .group_by(Layer.run_id)
    )
    return {run_id: int(count) for run_id, count in rows}


# --- steps -------------------------------------------------------------------------------------

def insert_steps(session: Session, rows: list[dict[str, Any]]) -> dict[int, int]:
    """Insert step rows, skipping (run, attempt, seq) already stored; {seq: new id} of the new."""
    if not rows:
        return {}
    if _postgres(session):
        return {int(seq): int(step_id) for seq, step_id in bulk_repository.insert(
            session, _table(Step), rows, conflict=("run_id", "attempt_id", "seq"),
            returning=("seq", "id"))}
    statement = (
        _insert(session, Step)
        .on_conflict_do_nothing(index_elements=[Step.run_id, Step.attempt_id, Step.seq])
        .returning(Step.seq, Step.id)
    )
    return {int(seq): int(step_id) for seq, step_id in session.execute(statement, rows)}


def insert_rows(session: Session, model: type[Base], rows: list[dict[str, Any]]) -> None:
    """Bulk insert of a step's children: one executemany per table.

    The Core table insert skips the ORM's per-row bookkeeping. On SQLite, where no column of
    the rows needs a bind processor (plain numbers and strings: the layer statistics), the rows
    go to the driver's executemany as tuples: SQLAlchemy's per-row parameter handling was most
    of the ingest time of a 200-layer batch (bench/ingest_rate.py). A float column's processor
    only turns ints into floats, which SQLite's REAL affinity does on storage anyway.
    """
    if not rows:
        return
    table = _table(model)
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
            Step.run_id,
            func.count(),
            func.max(Step.step),
            func.coalesce(func.sum(case((Step.skipped, 1), else_=0)), 0),
            func.max(Step.id),
        )
        .where(Step.run_id.in_(list(run_ids)))
        .group_by(Step.run_id)
    )
    return {
        run_id: (int(n), None if last is None else int(last), int(skipped),
                 None if last_id is None else int(last_id))
        for run_id, n, last, skipped, last_id in rows
    }


def last_scales(session: Session, step_ids: Iterable[int]) -> dict[str, tuple[float | None, int]]:
    """{run_id: (scale_after, scale_after_class)} of the given (last) steps."""
    rows = session.execute(
        select(Step.run_id, Step.scale_after, Step.scale_after_class)
        .where(Step.id.in_(list(step_ids)))
    )
    return {run_id: (value, cls) for run_id, value, cls in rows}


def steps_after(
    session: Session, run_id: str, after_id: int, limit: int
) -> Sequence[Row[Step, int]]:
    """(Step, attempt ordinal) with id > after_id, in ingest (id) order."""
    return session.execute(
        select(Step, Attempt.ordinal)
        .join(Attempt, Attempt.id == Step.attempt_id)
        .where(Step.run_id == run_id, Step.id > after_id)
        .order_by(Step.id)
        .limit(limit)
    ).all()


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
        for index, values in enumerate(zip(*_unpack_stats(data), strict=True))
    ]


def activation_stats_of(session: Session, step_ids: Sequence[int]) -> Sequence[ActivationStat]:
    if not step_ids:
        return []
    return session.scalars(
        select(ActivationStat)
        .where(ActivationStat.step_id.in_(step_ids))
        .order_by(ActivationStat.step_id, ActivationStat.module_index)
    ).all()


def nonfinite_of(session: Session, step_ids: Sequence[int]) -> Sequence[StepNonfinite]:
    """Non-finite layers of the given steps, each step's in backward order."""
    if not step_ids:
        return []
    return session.scalars(
        select(StepNonfinite)
        .where(StepNonfinite.step_id.in_(step_ids))
        .order_by(StepNonfinite.step_id, StepNonfinite.position)
    ).all()


def misuse_of(session: Session, step_ids: Sequence[int]) -> Sequence[MisuseEvent]:
    if not step_ids:
        return []
    return session.scalars(
        select(MisuseEvent)
        .where(MisuseEvent.step_id.in_(step_ids))
        .order_by(MisuseEvent.step_id, MisuseEvent.position)
    ).all()


def histograms_of(session: Session, step_ids: Sequence[int]) -> Sequence[Histogram]:
    if not step_ids:
        return []
    return session.scalars(
        select(Histogram)
        .where(Histogram.step_id.in_(step_ids))
        .order_by(Histogram.step_id, Histogram.layer_index)
    ).all()


def _step_range(run_id: str, start: int | None, end: int | None) -> list[ColumnElement[bool]]:
    clauses: list[ColumnElement[bool]] = [Step.run_id == run_id]
    if start is not None:
        clauses.append(Step.step >= start)
    if end is not None:
        clauses.append(Step.step <= end)
    return clauses


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
        .where(*_step_range(run_id, start, end))
        .where(or_(value.is_not(None), value_class != 0))
        .order_by(Step.step, Step.id)
    )
    if applied_only:
        statement = statement.where(Step.skipped.is_(False))
    return session.execute(statement).all()


def skipped_nonfinite(session: Session, run_id: str, start: int | None = None,
                      end: int | None = None) -> Sequence[StepNonfinite]:
    """Non-finite layers of the run's skipped steps (within [start, end]), each step's in
    backward order: a join, not an IN list of step ids, which a long run's thousands of skipped
    steps would take past the database's limit on bound parameters."""
    return session.scalars(
        select(StepNonfinite)
        .join(Step, Step.id == StepNonfinite.step_id)
        .where(*_step_range(run_id, start, end), Step.skipped.is_(True))
        .order_by(StepNonfinite.step_id, StepNonfinite.position)
    ).all()


def event_rows(
    session: Session, run_id: str, start: int | None = None, end: int | None = None,
    limit: int | None = None,
) -> Sequence[Row[int, int, bool, float | None, int, float | None, int, float | None, int]]:
    """(id, step, skipped, scale_before, its class, scale_after, its class, loss, its class) of
    the (first `limit`) steps (within [start, end]) that were skipped or whose scale changed (or
    is non-finite), in step order."""
    return session.execute(
        select(Step.id, Step.step, Step.skipped, Step.scale_before, Step.scale_before_class,
               Step.scale_after, Step.scale_after_class, Step.loss, Step.loss_class)
        .where(*_step_range(run_id, start, end))
        .where(or_(
            Step.skipped.is_(True),
            Step.scale_before != Step.scale_after,
            Step.scale_before_class != Step.scale_after_class,
        ))
        .order_by(Step.step, Step.id)
        .limit(limit)
    ).all()


def rechecks_in(
    session: Session, run_id: str, start: int | None, end: int | None
) -> Sequence[Row[int, StepRecheck]]:
    """(step id, re-check) of the re-checked steps within [start, end], in step order."""
    return session.execute(
        select(Step.id, StepRecheck)
        .join(StepRecheck, StepRecheck.step_id == Step.id)
        .where(*_step_range(run_id, start, end))
        .order_by(Step.step, Step.id)
    ).all()


SKIP_FLAG_ROWS = 10_000
"""Rows fetched per round trip when streaming a run's skip flags."""


def skip_flags(
    session: Session, run_id: str, start: int | None, end: int | None
) -> Iterator[tuple[int, bool]]:
    """(step, skipped) of every step within [start, end], by step then ingest order, streamed
    (the skip rate's input: the rollups do not count skips)."""
    result = session.execute(
        select(Step.step, Step.skipped).where(*_step_range(run_id, start, end))
        .order_by(Step.step, Step.id)
        .execution_options(yield_per=SKIP_FLAG_ROWS))
    for step, skipped in result:
        yield int(step), bool(skipped)


def misuse_rows(
    session: Session, run_id: str, start: int | None = None, end: int | None = None
) -> Sequence[Row[int, int, float | None, int, float | None, int, str, str]]:
    """(step id, step, scale_before, its class, scale_after, its class, kind, detail) of every
    misuse event of the run (within [start, end]), in step order, then as reported."""
    return session.execute(
        select(Step.id, Step.step, Step.scale_before, Step.scale_before_class,
               Step.scale_after, Step.scale_after_class, MisuseEvent.kind, MisuseEvent.detail)
        .join(MisuseEvent, MisuseEvent.step_id == Step.id)
        .where(*_step_range(run_id, start, end))
        .order_by(Step.step, Step.id, MisuseEvent.position)
    ).all()


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
            .where(*_step_range(run_id, start, end))
            .order_by(Step.step, Step.id)
        ):
            columns = _unpack_stats(data)
            picked = [columns[position] for position in positions]
            out.extend((step_id, step, scale, scale_cls, index, *values)
                       for index, values in enumerate(zip(*picked, strict=True)))
        return out
    index = ActivationStat.module_index
    stats = [getattr(ActivationStat, name) for name in stat_columns]
    rows = session.execute(
        select(Step.id, Step.step, Step.scale_before, Step.scale_before_class, index, *stats)
        .join(ActivationStat, ActivationStat.step_id == Step.id)
        .where(*_step_range(run_id, start, end))
        .order_by(Step.step, Step.id, index)
    )
    return [tuple(row) for row in rows]


# --- runs page and comparison (read-only; one block, kept at the end) ---------------------------

def last_layer_stat_steps(session: Session, run_ids: Iterable[str]) -> dict[str, int]:
    """{run_id: id of the run's last ingested step that carries layer statistics}.

    Bounded per run: a correlated `ORDER BY id DESC LIMIT 1` over `ix_steps_run_id_id` that stops
    at the first step with a `layer_stats` row (a primary-key probe), so it reads the steps since
    the last layer-stat step, never the whole run. Runs without layer statistics are left out.
    """
    has_stats = select(LayerStat.step_id).where(LayerStat.step_id == Step.id).exists()
    last = (
        select(Step.id).where(Step.run_id == Run.id, has_stats)
        .order_by(Step.id.desc()).limit(1).correlate(Run).scalar_subquery()
    )
    rows = session.execute(select(Run.id, last).where(Run.id.in_(list(run_ids))))
    return {run_id: int(step_id) for run_id, step_id in rows if step_id is not None}


def named_layer_stats(
    session: Session, step_ids: Iterable[int]
) -> Sequence[tuple[str, float | None, int, int, str, float, float, float | None]]:
    """(run_id, scale_before, its class, layer index, layer name, zero_frac, underflow_frac, amax)
    of every layer (of the run's layer table) at the given steps, by run then model order."""
    ids = list(step_ids)
    if not ids:
        return []
    rows = session.execute(
        select(Step.run_id, Step.scale_before, Step.scale_before_class, LayerStat.data)
        .join(LayerStat, LayerStat.step_id == Step.id)
        .where(Step.id.in_(ids))
        .order_by(Step.run_id, Step.id)
    ).all()
    names: dict[tuple[str, int], str] = {
        (run_id, int(index)): name for run_id, index, name in session.execute(
            select(Layer.run_id, Layer.index, Layer.name)
            .where(Layer.run_id.in_({row[0] for row in rows})))
    }
    zero, under, amax = (LAYER_STAT_NAMES.index(name)
                         for name in ("zero_frac", "underflow_frac", "amax"))
    out: list[tuple[str, float | None, int, int, str, float, float, float | None]] = []
    for run_id, scale, scale_cls, data in rows:
        columns = _unpack_stats(data)
        for index, values in enumerate(zip(columns[zero], columns[under], columns[amax],
                                           strict=True)):
            name = names.get((run_id, index))
            if name is not None:
                out.append((run_id, scale, scale_cls, index, name, *values))
    return out


# --- rollups -----------------------------------------------------------------------------------

def get_rollups(
    session: Session, run_id: str, keys: Sequence[tuple[int, int]], columns: Sequence[str]
) -> list[tuple[Any, ...]]:
    """(level, bucket, *columns) of the run's stored series rollups among `keys` (level,
    bucket)."""
    found: list[tuple[Any, ...]] = []
    # In slices: a batch of 10k records touches ~10k buckets, and one IN list that long is
    # more than Postgres' planner takes (StatementTooComplex).
    for start in range(0, len(keys), KEYS_PER_STATEMENT):
        chunk = list(keys[start:start + KEYS_PER_STATEMENT])
        rows = session.execute(
            select(Rollup.level, Rollup.bucket, *[getattr(Rollup, name) for name in columns])
            .where(Rollup.run_id == run_id, tuple_(Rollup.level, Rollup.bucket).in_(chunk))
        )
        found.extend(tuple(row) for row in rows)
    return found


def get_layer_rollups(
    session: Session, run_id: str, keys: Sequence[tuple[int, int]]
) -> dict[tuple[int, int], bytes]:
    """{(level, bucket): packed per-layer rollup} of the run's stored ones among `keys`."""
    found: dict[tuple[int, int], bytes] = {}
    for start in range(0, len(keys), KEYS_PER_STATEMENT):
        chunk = list(keys[start:start + KEYS_PER_STATEMENT])
        rows = session.execute(
            select(LayerRollup.level, LayerRollup.bucket, LayerRollup.data)
            .where(LayerRollup.run_id == run_id,
                   tuple_(LayerRollup.level, LayerRollup.bucket).in_(chunk))
        )
        found.update(((int(level), int(bucket)), data) for level, bucket, data in rows)
    return found


def _upsert(session: Session, model: type[Rollup] | type[LayerRollup],
            rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    keys = ("run_id", "level", "bucket")
    statement = _insert(session, model)
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
    first = select(func.min(Step.step)).where(Step.run_id == run_id).scalar_subquery()
    last = select(func.max(Step.step)).where(Step.run_id == run_id).scalar_subquery()
    lo, hi = session.execute(select(first, last)).one()
    return None if lo is None else (int(lo), int(hi))


def rollup_rows(
    session: Session, run_id: str, level: int, first: int, last: int, columns: Sequence[str]
) -> list[tuple[Any, ...]]:
    """(bucket, *columns) of the run's rollups of one level, buckets first…last, in order.

    A column is "series" or a per-layer statistic of `rollups.ROLLUP_STATS`, given as
    `rollups.pack_stat` bytes (None for a bucket without layer statistics), at any level of
    `rollups.LEVELS`: below `rollups.LAYER_LEVELS` folded from the raw steps.
    """
    rows = session.execute(
        select(Rollup.bucket, Rollup.series)
        .where(Rollup.run_id == run_id, Rollup.level == level,
               Rollup.bucket.between(first, last))
        .order_by(Rollup.bucket)
    ).all()
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


def layer_rollup_arrays(
    session: Session, run_id: str, ranges: Sequence[tuple[int, int, int]]
) -> dict[tuple[int, int], rollups.LayerArrays]:
    """{(level, bucket): per-layer worst arrays} of the buckets in `ranges` ((level, first,
    last bucket)) that hold layer statistics: stored ones at `rollups.LAYER_LEVELS`, the finer
    ones folded from the raw steps (at most 16 steps per bucket)."""
    stored = [piece for piece in ranges if piece[0] in rollups.LAYER_LEVELS]
    out: dict[tuple[int, int], rollups.LayerArrays] = {}
    if stored:
        for level, bucket, data in session.execute(
            select(LayerRollup.level, LayerRollup.bucket, LayerRollup.data)
            .where(LayerRollup.run_id == run_id)
            .where(or_(*[
                and_(LayerRollup.level == level, LayerRollup.bucket.between(first, last))
                for level, first, last in stored
            ]))
        ):
            out[(int(level), int(bucket))] = rollups.unpack_layers(data)
    for level, first, last in ranges:
        if level in rollups.LAYER_LEVELS:
            continue
        raw = layer_steps_in(session, run_id, first << level, ((last + 1) << level) - 1)
        out.update(((level, bucket), arrays)
                   for bucket, arrays in rollups.layer_buckets(raw, level).items())
    return out


def layer_steps_in(
    session: Session, run_id: str, start: int, end: int
) -> list[tuple[int, dict[str, list[Any]], float | None]]:
    """(step, {stat: per-layer values}, scale_before) of the run's steps in [start, end] that
    carry layer statistics, by step then ingest order."""
    rows = session.execute(
        select(Step.step, Step.scale_before, Step.scale_before_class, LayerStat.data)
        .join(LayerStat, LayerStat.step_id == Step.id)
        .where(*_step_range(run_id, start, end))
        .order_by(Step.step, Step.id)
    )
    return [
        (int(step), dict(zip(LAYER_STAT_NAMES, _unpack_stats(data), strict=True)),
         codec.from_storage(scale, scale_cls))
        for step, scale, scale_cls, data in rows
    ]


def rollup_pieces(
    session: Session, run_id: str, ranges: Sequence[tuple[int, int, int]], column: str
) -> list[tuple[int, int, bytes | None]]:
    """(level, bucket, column) of the rollups in `ranges` ((level, first, last bucket)); a
    per-layer statistic as `rollups.pack_stat` bytes, of the buckets that hold layer
    statistics (see `layer_rollup_arrays`)."""
    if not ranges:
        return []
    if column != "series":
        return [(level, bucket, rollups.pack_stat(column, arrays[column]))
                for (level, bucket), arrays in layer_rollup_arrays(session, run_id, ranges).items()]
    rows = session.execute(
        select(Rollup.level, Rollup.bucket, Rollup.series)
        .where(Rollup.run_id == run_id)
        .where(or_(*[
            and_(Rollup.level == level, Rollup.bucket.between(first, last))
            for level, first, last in ranges
        ]))
    )
    return [(int(level), int(bucket), blob) for level, bucket, blob in rows]


# --- wire v3: FP32 re-checks and swallowed updates ----------------------------------------------

def rechecks_of(session: Session, step_ids: Sequence[int]) -> Sequence[StepRecheck]:
    """The FP32 re-checks of the given steps (steps that were not re-checked have none)."""
    if not step_ids:
        return []
    return session.scalars(
        select(StepRecheck).where(StepRecheck.step_id.in_(step_ids)).order_by(StepRecheck.step_id)
    ).all()


def run_rechecks(session: Session, run_id: str) -> Sequence[Row[int, int, StepRecheck]]:
    """(step id, step, re-check) of every re-checked step of the run, in step order."""
    return session.execute(
        select(Step.id, Step.step, StepRecheck)
        .join(StepRecheck, StepRecheck.step_id == Step.id)
        .where(Step.run_id == run_id)
        .order_by(Step.step, Step.id)
    ).all()


def swallowed_of(session: Session, step_ids: Sequence[int]) -> Sequence[SwallowedStat]:
    """The swallowed fractions of the given steps, by step then layer."""
    if not step_ids:
        return []
    return session.scalars(
        select(SwallowedStat)
        .where(SwallowedStat.step_id.in_(step_ids))
        .order_by(SwallowedStat.step_id, SwallowedStat.layer_index)
    ).all()


def swallowed_rows(
    session: Session, run_id: str, start: int | None, end: int | None
) -> Sequence[Row[int, int, int, float | None]]:
    """(step id, step, layer index, fraction) of the run's swallowed fractions in range, by
    step, ingest order, layer."""
    return session.execute(
        select(Step.id, Step.step, SwallowedStat.layer_index, SwallowedStat.frac)
        .join(SwallowedStat, SwallowedStat.step_id == Step.id)
        .where(*_step_range(run_id, start, end))
        .order_by(Step.step, Step.id, SwallowedStat.layer_index)
    ).all()


# --- findings (diagnosis.py): bounded reads of a run's snapshot ---------------------------------

def findings_steps(session: Session, run_id: str, every_step: bool) -> list[tuple[Any, ...]]:
    """(id, step, scale_before, class, scale_after, class, found_inf, skipped, loss, class,
    grad_norm, class, lr, class, growth_tracker) by step then ingest order.

    With `every_step` False only the steps the detectors read: skipped or `found_inf`, scale
    changed, loss or grad norm non-finite, the step after each skipped one (did the LR move?),
    and the run's first and last step: O(events) rows, not O(steps).
    """
    columns = (Step.id, Step.step, Step.scale_before, Step.scale_before_class, Step.scale_after,
               Step.scale_after_class, Step.found_inf, Step.skipped, Step.loss, Step.loss_class,
               Step.grad_norm, Step.grad_norm_class, Step.lr, Step.lr_class, Step.growth_tracker)
    statement = select(*columns).where(Step.run_id == run_id)
    if not every_step:
        after_skip = select(Step.step + 1).where(Step.run_id == run_id, Step.skipped.is_(True))
        first = select(func.min(Step.step)).where(Step.run_id == run_id).scalar_subquery()
        last = select(func.max(Step.step)).where(Step.run_id == run_id).scalar_subquery()
        statement = statement.where(or_(
            Step.skipped.is_(True), Step.found_inf.is_(True),
            Step.scale_before != Step.scale_after,
            Step.scale_before_class != Step.scale_after_class,
            Step.loss_class != 0, Step.grad_norm_class != 0,
            Step.step.in_(after_skip), Step.step == first, Step.step == last,
        ))
    return [tuple(row) for row in session.execute(statement.order_by(Step.step, Step.id))]


def layer_stat_steps_last(
    session: Session, run_id: str, limit: int, before_step: int | None = None
) -> list[int]:
    """Ids of the run's last `limit` steps that carry layer statistics (before `before_step`
    when given), newest first. Walks the step index backwards and stops after `limit` hits."""
    has_stats = select(LayerStat.step_id).where(LayerStat.step_id == Step.id).exists()
    statement = select(Step.id).where(Step.run_id == run_id, has_stats)
    if before_step is not None:
        statement = statement.where(Step.step < before_step).order_by(Step.step.desc(),
                                                                      Step.id.desc())
    else:
        statement = statement.order_by(Step.id.desc())
    return [int(step_id) for step_id in session.scalars(statement.limit(limit))]


def layer_stat_steps_all(session: Session, run_id: str) -> list[tuple[int, int]]:
    """(id, step) of every step of the run that carries layer statistics, by step: one light
    row per layer-stat step (a tenth of the steps at the default cadence)."""
    has_stats = select(LayerStat.step_id).where(LayerStat.step_id == Step.id).exists()
    rows = session.execute(
        select(Step.id, Step.step).where(Step.run_id == run_id, has_stats)
        .order_by(Step.step, Step.id))
    return [(int(step_id), int(step)) for step_id, step in rows]


def layer_samples_at(session: Session, step_ids: Sequence[int]) -> list[tuple[Any, ...]]:
    """(step id, step, scale_before, class, layer index, amax, amin_nz, zero_frac,
    subnormal_frac, underflow_frac, nan_count, inf_count, l2) at the given steps."""
    if not step_ids:
        return []
    rows = session.execute(
        select(Step.id, Step.step, Step.scale_before, Step.scale_before_class, LayerStat.data)
        .join(LayerStat, LayerStat.step_id == Step.id)
        .where(Step.id.in_(list(step_ids)))
        .order_by(Step.step, Step.id))
    return [
        (step_id, step, scale, scale_cls, index, *values)
        for step_id, step, scale, scale_cls, data in rows
        for index, values in enumerate(zip(*_unpack_stats(data), strict=True))
    ]


def swallowed_last(
    session: Session, run_id: str, limit: int
) -> list[tuple[int, int, float | None]]:
    """(step, layer index, fraction) at the run's last `limit` steps (ingest order) that carry
    swallowed fractions."""
    has_rows = select(SwallowedStat.step_id).where(SwallowedStat.step_id == Step.id).exists()
    last = (select(Step.id).where(Step.run_id == run_id, has_rows)
            .order_by(Step.id.desc()).limit(limit))
    rows = session.execute(
        select(Step.step, SwallowedStat.layer_index, SwallowedStat.frac)
        .join(SwallowedStat, SwallowedStat.step_id == Step.id)
        .where(Step.id.in_(last))
        .order_by(Step.step, Step.id, SwallowedStat.layer_index))
    return [(int(step), int(index), frac) for step, index, frac in rows]


def recheck_statuses(session: Session, run_id: str, limit: int) -> list[tuple[int, str]]:
    """(step, status) of the run's first `limit` FP32 re-checks, in step order."""
    rows = session.execute(
        select(Step.step, StepRecheck.status)
        .join(StepRecheck, StepRecheck.step_id == Step.id)
        .where(Step.run_id == run_id).order_by(Step.step, Step.id).limit(limit))
    return [(int(step), str(status)) for step, status in rows]


def misuse_first(session: Session, run_id: str, limit: int) -> list[tuple[int, str, str]]:
    """(step, kind, detail) of the run's first `limit` misuse events, in step order."""
    rows = session.execute(
        select(Step.step, MisuseEvent.kind, MisuseEvent.detail)
        .join(MisuseEvent, MisuseEvent.step_id == Step.id)
        .where(Step.run_id == run_id)
        .order_by(Step.step, Step.id, MisuseEvent.position).limit(limit))
    return [(int(step), str(kind), str(detail)) for step, kind, detail in rows]


# --- exponent histograms for the "what if x k" view (diagnosis.histogram_read) ----------------
def histogram_steps_last(
    session: Session, run_id: str, limit: int
) -> list[tuple[int, int, float | None, int]]:
    """(step id, step, scale_before, its class) of the run's last `limit` steps that carry an
    exponent histogram, newest first."""
    has_histogram = select(Histogram.step_id).where(Histogram.step_id == Step.id).exists()
    rows = session.execute(
        select(Step.id, Step.step, Step.scale_before, Step.scale_before_class)
        .where(Step.run_id == run_id, has_histogram)
        .order_by(Step.step.desc(), Step.id.desc()).limit(limit))
    return [(int(i), int(step), scale, int(cls)) for i, step, scale, cls in rows]
