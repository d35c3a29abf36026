"""SQL of the run counters (`models.RunCounters`) and of the runs list's pages.

The runs list is read by keyset pagination over (sort key, run id): each page is one walk of
the narrow keys of `runs` (joined to the counters only when sorted by one of them), then one
load of the page's own rows; never a count over steps and never an OFFSET (which reads and
throws away every row before the page).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import ColumnElement, Float, case, cast, func, literal, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, defer

from ampscope_server.store.float_storage import FloatClass
from ampscope_server.store.models import Run, RunCounters

SortKey = Literal["started", "updated", "name", "project", "status", "steps", "skip_rate",
                  "scale", "underflow", "headroom"]
SORT_KEYS: tuple[SortKey, ...] = ("started", "updated", "name", "project", "status", "steps",
                                  "skip_rate", "scale", "underflow", "headroom")
_MISSING = 1e300
"""Stands in for a missing numeric key (no steps, nothing measured) so it sorts last either
way: below every value when descending, above when ascending. Every stored value is smaller."""


@dataclass(frozen=True)
class CountersDelta:
    """What one batch's new steps add to their run's counters."""

    num_steps: int
    skipped_steps: int
    nonfinite_steps: int
    last_step: int
    last_id: int
    last_scale: tuple[float | None, int]
    last_loss: tuple[float | None, int]


def add_steps(session: Session, run_id: str, delta: CountersDelta) -> None:
    """Fold a batch's new steps into the run's counters, creating the row with its first steps.

    One upsert: batches of one run are serialised by `touch_run`'s row write, and the batch's
    newest step id is the run's newest (ids grow), so `last_*` is simply overwritten.
    """
    insert = (postgresql.insert(RunCounters) if session.get_bind().dialect.name == "postgresql"
              else sqlite.insert(RunCounters))
    statement = insert.values(
        run_id=run_id, version=1, num_steps=delta.num_steps, skipped_steps=delta.skipped_steps,
        nonfinite_steps=delta.nonfinite_steps, last_step=delta.last_step, last_id=delta.last_id,
        last_scale=delta.last_scale[0], last_scale_class=delta.last_scale[1],
        last_loss=delta.last_loss[0], last_loss_class=delta.last_loss[1],
        headroom_bits_class=FloatClass.FINITE_OR_NULL,
    )
    new = statement.excluded
    stored = RunCounters.__table__.c
    statement = statement.on_conflict_do_update(
        index_elements=[RunCounters.run_id],
        set_={
            "version": stored.version + 1,
            "num_steps": stored.num_steps + new.num_steps,
            "skipped_steps": stored.skipped_steps + new.skipped_steps,
            "nonfinite_steps": stored.nonfinite_steps + new.nonfinite_steps,
            "last_step": case((or_(stored.last_step.is_(None), new.last_step > stored.last_step),
                               new.last_step), else_=stored.last_step),
            "last_id": new.last_id,
            "last_scale": new.last_scale, "last_scale_class": new.last_scale_class,
            "last_loss": new.last_loss, "last_loss_class": new.last_loss_class,
        },
    )
    session.execute(statement)


def counters_of(session: Session, run_ids: Iterable[str]) -> dict[str, RunCounters]:
    ids = list(run_ids)
    if not ids:
        return {}
    rows = session.scalars(select(RunCounters).where(RunCounters.run_id.in_(ids)))
    return {row.run_id: row for row in rows}


def store_summary(session: Session, run_id: str, values: dict[str, Any]) -> None:
    """Write the cached summary block (`summary_*` and the columns it names) of one run."""
    session.execute(update(RunCounters).where(RunCounters.run_id == run_id).values(**values))


def _status_rank(crashed_before: float) -> ColumnElement[int]:
    """The derived status as the list orders it: active 0, crashed 1 (active but silent since
    before `crashed_before`), finished 2."""
    return case(
        (Run.status == "finished", 2),
        (Run.updated_at < crashed_before, 1),
        else_=0,
    )


def _classed(value: Any, value_class: Any) -> ColumnElement[float]:
    """A classed float as one sortable number: +inf above every finite value, -inf below,
    NaN and NULL missing."""
    return case(
        (value_class == FloatClass.POS_INF, _MISSING / 10),
        (value_class == FloatClass.NEG_INF, -_MISSING / 10),
        (value_class == FloatClass.NAN, None),
        else_=value,
    )


def _sort_expression(key: SortKey, crashed_before: float) -> ColumnElement[Any]:
    counters = RunCounters
    steps = func.coalesce(counters.num_steps, 0)
    expressions: dict[str, Any] = {
        "started": Run.created_at,
        "updated": Run.updated_at,
        "name": func.lower(Run.name),
        "project": func.lower(Run.project),
        "status": _status_rank(crashed_before),
        "steps": steps,
        "skip_rate": case((steps == 0, None),
                          else_=cast(counters.skipped_steps, Float) / cast(steps, Float)),
        "scale": _classed(counters.last_scale, counters.last_scale_class),
        "underflow": counters.underflow_frac,
        "headroom": _classed(counters.headroom_bits, counters.headroom_bits_class),
    }
    found: ColumnElement[Any] = expressions[key]
    return found


_TEXT_KEYS = frozenset({"name", "project"})
_COUNTER_KEYS = frozenset({"steps", "skip_rate", "scale", "underflow", "headroom"})
"""The sort keys read from `run_counters` (the others are the runs table's own)."""


@dataclass(frozen=True, slots=True)
class ListedKey:
    """One run as the list's key walk reads it: what the order and the filter need, nothing
    more (no config, no counters row): the walk may read every run when filtered."""

    id: str
    sort_value: Any
    name: str
    project: str
    status: str
    updated_at: float
    tags: list[Any]


def page_keys(
    session: Session, *, project: str | None, key: SortKey, descending: bool,
    after: tuple[Any, str] | None, limit: int, crashed_before: float,
) -> list[ListedKey]:
    """Up to `limit` runs (of `project`, when given) ordered by `key` (then id), after the
    (sort value, id) of the previous page's last run. Numeric keys that are missing sort last
    in both directions (`_MISSING`).

    Narrow on purpose: the database sorts (id, value) and a few short columns, not whole runs
    (whose config may be large); `page_rows` then loads the runs of the page alone."""
    value = _sort_expression(key, crashed_before)
    if key not in _TEXT_KEYS and key not in ("started", "updated", "status", "steps"):
        value = func.coalesce(value, literal(-_MISSING if descending else _MISSING))
    statement = select(Run.id, value.label("sort_value"), Run.name, Run.project, Run.status,
                       Run.updated_at, Run.tags)
    if key in _COUNTER_KEYS:
        statement = statement.outerjoin(RunCounters, RunCounters.run_id == Run.id)
    if project is not None:
        statement = statement.where(Run.project == project)
    if after is not None:
        after_value, after_id = after
        beyond = value < after_value if descending else value > after_value
        statement = statement.where(or_(beyond, (value == after_value) & (Run.id > after_id)))
    statement = statement.order_by(value.desc() if descending else value.asc(), Run.id)
    return [ListedKey(*row) for row in session.execute(statement.limit(limit))]


def page_rows(session: Session, run_ids: Sequence[str]
              ) -> dict[str, tuple[Run, RunCounters | None]]:
    """{run id: (run, its counters or None)} of the runs of one page, their config unread (a
    summary does not show it)."""
    if not run_ids:
        return {}
    rows = session.execute(
        select(Run, RunCounters).outerjoin(RunCounters, RunCounters.run_id == Run.id)
        .where(Run.id.in_(run_ids)).options(defer(Run.config)))
    return {run.id: (run, counters) for run, counters in rows}


def count_runs(session: Session, project: str | None) -> int:
    statement = select(func.count()).select_from(Run)
    if project is not None:
        statement = statement.where(Run.project == project)
    return int(session.scalar(statement) or 0)


def active_run_ids(session: Session, project: str | None, limit: int) -> Sequence[str]:
    """Ids of up to `limit` runs stored as active (live or turned crashed by silence), newest
    first: the runs whose shown status can change without a new batch."""
    statement = select(Run.id).where(Run.status == "active")
    if project is not None:
        statement = statement.where(Run.project == project)
    return session.scalars(
        statement.order_by(Run.updated_at.desc(), Run.id).limit(limit)).all()
