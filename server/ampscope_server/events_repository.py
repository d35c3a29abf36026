"""SQL of the run page's bounded event reads: event steps by page, re-checks and skip flags by
step window. Joins and ranges only: never an IN list of step ids (a long run's skipped steps
would take it past the database's limit on bound parameters)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from sqlalchemy import ColumnElement, Row, or_, select
from sqlalchemy.orm import Session

from ampscope_server.models import Step, StepRecheck

STREAM_ROWS = 10_000
"""Rows fetched per round trip when streaming a run's skip flags."""


def _window(run_id: str, start: int | None, end: int | None) -> list[ColumnElement[bool]]:
    clauses: list[ColumnElement[bool]] = [Step.run_id == run_id]
    if start is not None:
        clauses.append(Step.step >= start)
    if end is not None:
        clauses.append(Step.step <= end)
    return clauses


def event_steps(
    session: Session, run_id: str, start: int | None, end: int | None, limit: int
) -> Sequence[Row[int, int, bool, float | None, int, float | None, int, float | None, int]]:
    """(id, step, skipped, scale_before, class, scale_after, class, loss, class) of the first
    `limit` steps in [start, end] that were skipped or changed the scale, in step order."""
    return session.execute(
        select(Step.id, Step.step, Step.skipped, Step.scale_before, Step.scale_before_class,
               Step.scale_after, Step.scale_after_class, Step.loss, Step.loss_class)
        .where(*_window(run_id, start, end))
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
    """(step id, re-check) of the re-checked steps in [start, end]."""
    return session.execute(
        select(Step.id, StepRecheck)
        .join(StepRecheck, StepRecheck.step_id == Step.id)
        .where(*_window(run_id, start, end))
        .order_by(Step.step, Step.id)
    ).all()


def skip_flags(
    session: Session, run_id: str, start: int | None, end: int | None
) -> Iterator[tuple[int, bool]]:
    """(step, skipped) of every step in [start, end], by step then ingest order, streamed."""
    result = session.execute(
        select(Step.step, Step.skipped).where(*_window(run_id, start, end))
        .order_by(Step.step, Step.id)
        .execution_options(yield_per=STREAM_ROWS))
    for step, skipped in result:
        yield int(step), bool(skipped)
