"""Repository: runs, their attempts, and their layer and module tables. Functions take a
Session and never commit; idempotent inserts use the dialect's INSERT … ON CONFLICT DO NOTHING."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import (
    func,
    select,
    update,
)
from sqlalchemy.orm import Session

from ampscope_server.store.models import (
    Attempt,
    Layer,
    Module,
    Run,
)
from ampscope_server.store.sql_support import (
    dialect_insert,
    is_postgres,
)

# --- runs and attempts -------------------------------------------------------------------------

def touch_run(session: Session, values: dict[str, Any], now: float) -> int:
    """Create the run if new, then bump `updated_at`; the run's `key`.

    Both statements write, so on SQLite the transaction takes the write lock first (no read
    snapshot to upgrade) and on Postgres the run's row lock serialises batches of one run.
    A new run's key: Postgres' identity; on SQLite the largest + 1, safe because the INSERT
    runs under SQLite's one write lock.
    """
    insert = dialect_insert(session, Run).values(
        **values, status="active", created_at=now, updated_at=now)
    if not is_postgres(session):
        insert = insert.values(
            key=select(func.coalesce(func.max(Run.key), 0) + 1).scalar_subquery())
    session.execute(insert.on_conflict_do_nothing(index_elements=[Run.id]))
    return int(session.execute(
        update(Run).where(Run.id == values["id"]).values(updated_at=now).returning(Run.key)
    ).scalar_one())


def key_of(session: Session, run_id: str) -> int | None:
    """The run's integer key (`runs.key`), None for an unknown run."""
    key = session.scalar(select(Run.key).where(Run.id == run_id))
    return None if key is None else int(key)


def set_run_annotations(session: Session, run_id: str, values: dict[str, Any]) -> None:
    """Set the run's `notes` and/or `tags` (the keys of `values`); nothing else changes (not
    `updated_at`: an edit is not training activity)."""
    if values:
        session.execute(update(Run).where(Run.id == run_id).values(**values))


def set_run_status(session: Session, run_id: str, status: str) -> None:
    session.execute(update(Run).where(Run.id == run_id).values(status=status))


def get_run(session: Session, run_id: str) -> Run | None:
    """The run of this id as given, else of its lower-case form: ingest stores a run's UUID
    lower-case (`wire.Uuid`), so `ABC…` and `abc…` name one run; a run stored in another case
    before that still matches exactly."""
    run = session.get(Run, run_id)
    if run is None and run_id != run_id.lower():
        run = session.get(Run, run_id.lower())
    return run


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


def layer_names(session: Session, run_id: str) -> list[str]:
    """The name of each of the run's layers, in index order: the column alone, not 500 ORM
    objects with their JSON shapes (most of an events page's time on a large model)."""
    return list(session.scalars(
        select(Layer.name).where(Layer.run_id == run_id).order_by(Layer.index)))


def layer_shapes(session: Session, run_id: str) -> list[tuple[str, list[int]]]:
    """The name and shape of each of the run's layers, in index order: two columns."""
    return [(name, list(shape)) for name, shape in session.execute(
        select(Layer.name, Layer.shape).where(Layer.run_id == run_id).order_by(Layer.index))]


def layer_numels(session: Session, run_id: str) -> list[int]:
    """The numel of each of the run's layers, in index order (empty: no layer table)."""
    return [int(numel) for numel in session.scalars(
        select(Layer.numel).where(Layer.run_id == run_id).order_by(Layer.index))]


def insert_layers(session: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        session.execute(dialect_insert(session, Layer), rows)


def get_modules(session: Session, run_id: str) -> Sequence[Module]:
    return session.scalars(
        select(Module).where(Module.run_id == run_id).order_by(Module.index)
    ).all()


def insert_modules(session: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        session.execute(dialect_insert(session, Module), rows)


def count_layers(session: Session, run_ids: Iterable[str]) -> dict[str, int]:
    rows = session.execute(
        select(Layer.run_id, func.count()).where(Layer.run_id.in_(list(run_ids)))
        .group_by(Layer.run_id)
    )
    return {run_id: int(count) for run_id, count in rows}
