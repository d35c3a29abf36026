"""Repository: wire v4's per-rank and per-optimizer rows of a run's steps (`step_ranks`,
`step_optimizers`). Functions take a Session and never commit; the rows come back packed
(`rank_packing` unpacks them)."""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from ampscope_server.store.models import RANKS_NONFINITE, Step, StepOptimizers, StepRanks
from ampscope_server.store.sql_support import run_key


def ranks_of(session: Session, run_id: str, first_id: int, last_id: int) -> dict[int, bytes]:
    """{step id: its `step_ranks.data`} of the run's steps with ids in [first_id, last_id]
    that carry ranks: a page of steps (`steps_repository.steps_after`) is such a range, read
    through the (run_key, step_id) index without an IN list of its ids."""
    rows = session.execute(
        select(StepRanks.step_id, StepRanks.data)
        .where(StepRanks.run_key == run_key(run_id),
               StepRanks.step_id.between(first_id, last_id)))
    return {int(step_id): bytes(data) for step_id, data in rows}


def optimizers_of(session: Session, run_id: str, first_id: int, last_id: int
                  ) -> dict[int, tuple[bytes, bytes]]:
    """{step id: its `step_optimizers` (data, lr)} of the run's steps with ids in
    [first_id, last_id] that carry optimizers (as `ranks_of`)."""
    rows = session.execute(
        select(StepOptimizers.step_id, StepOptimizers.data, StepOptimizers.lr)
        .where(StepOptimizers.run_key == run_key(run_id),
               StepOptimizers.step_id.between(first_id, last_id)))
    return {int(step_id): (bytes(data), bytes(lr)) for step_id, data, lr in rows}


def optimizers_by_step(session: Session, run_id: str, start: int | None, end: int | None
                       ) -> Iterator[tuple[int, bytes, bytes]]:
    """(step, data, lr) of the run's steps in [start, end] (None: unbounded) that carry
    optimizers, by step then ingest order. One row per such step: a run sends them only with
    several optimizers or parameter groups."""
    query = (select(Step.step, StepOptimizers.data, StepOptimizers.lr)
             .join(Step, Step.id == StepOptimizers.step_id)
             .where(StepOptimizers.run_key == run_key(run_id)))
    if start is not None:
        query = query.where(Step.step >= start)
    if end is not None:
        query = query.where(Step.step <= end)
    for step, data, lr in session.execute(query.order_by(Step.step, StepOptimizers.step_id)):
        yield int(step), bytes(data), bytes(lr)


def first_nonfinite(session: Session, run_id: str) -> tuple[int, bytes] | None:
    """(step, data) of the run's earliest step where some rank went non-finite (by step, then
    ingest order), or None. One probe of `ix_step_ranks_run_key_nonfinite_step`: the query
    holds the index's condition as written (`RANKS_NONFINITE`), as SQLite needs to use it."""
    row = session.execute(
        select(StepRanks.step, StepRanks.data)
        .where(StepRanks.run_key == run_key(run_id), text(RANKS_NONFINITE))
        .order_by(StepRanks.step, StepRanks.step_id)
        .limit(1)
    ).first()
    return None if row is None else (int(row[0]), bytes(row[1]))
