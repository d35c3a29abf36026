"""SQL of the bounded reads the findings against a baseline add (`diagnosis.load_run_data`):
the steps of a window and the first layer-stat step at or after a step number, each an index
range or probe, never every step of the run."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ampscope_server.models import LayerStat, Step

_FINDINGS_COLUMNS = (
    Step.id, Step.step, Step.scale_before, Step.scale_before_class, Step.scale_after,
    Step.scale_after_class, Step.found_inf, Step.skipped, Step.loss, Step.loss_class,
    Step.grad_norm, Step.grad_norm_class, Step.lr, Step.lr_class, Step.growth_tracker)


def steps_between(session: Session, run_id: str, first: int, last: int) -> list[tuple[Any, ...]]:
    """The step rows of `repository.findings_steps` for the steps first…last (inclusive)."""
    rows = session.execute(
        select(*_FINDINGS_COLUMNS)
        .where(Step.run_id == run_id, Step.step.between(first, last))
        .order_by(Step.step, Step.id))
    return [tuple(row) for row in rows]


def layer_stat_step_at(session: Session, run_id: str, step: int) -> int | None:
    """Id of the run's first step at or after `step` that carries layer statistics: walks the
    step index forward from `step` and stops at the first hit (a cadence's worth of probes)."""
    has_stats = select(LayerStat.step_id).where(LayerStat.step_id == Step.id).exists()
    found = session.scalar(
        select(Step.id).where(Step.run_id == run_id, Step.step >= step, has_stats)
        .order_by(Step.step, Step.id).limit(1))
    return None if found is None else int(found)
