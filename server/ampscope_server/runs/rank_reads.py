"""Reading wire v4 back: each step's per-rank and per-optimizer values (the steps page, the
export) and which rank of a distributed run went non-finite first (`GET /api/runs/{id}/ranks`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from ampscope_server.runs.schemas import (
    FirstNonfiniteRead,
    OptimizerRead,
    RanksRead,
    RanksSummaryRead,
)
from ampscope_server.store import rank_packing, ranks_repository
from ampscope_server.store.models import Run


def step_fields(session: Session, run_id: str, step_ids: Sequence[int]
                ) -> dict[int, dict[str, object]]:
    """{step id: {"ranks", "optimizers"}} for a page of the run's steps (ids ascending, as
    `steps_repository.steps_after` gives them), each null where the step carried none."""
    fields: dict[int, dict[str, object]] = {
        step_id: {"ranks": None, "optimizers": None} for step_id in step_ids}
    if not step_ids:
        return fields
    first, last = step_ids[0], step_ids[-1]
    for step_id, data in ranks_repository.ranks_of(session, run_id, first, last).items():
        ranks = rank_packing.unpack_ranks(data)
        fields[step_id]["ranks"] = RanksRead(loss=ranks.loss, nonfinite=ranks.nonfinite)
    for step_id, (data, lr) in ranks_repository.optimizers_of(
            session, run_id, first, last).items():
        fields[step_id]["optimizers"] = [
            OptimizerRead(skipped=opt.skipped, lr=opt.lr)
            for opt in rank_packing.unpack_optimizers(data, lr)]
    return fields


def ranks_summary(session: Session, run: Run) -> RanksSummaryRead:
    """The run's world size and its earliest step where some rank's loss was NaN/±inf or
    some rank's gradient held one, with the ranks that did and every rank's values there."""
    found = ranks_repository.first_nonfinite(session, run.id)
    if found is None:
        return RanksSummaryRead(world_size=run.world_size, first_nonfinite=None)
    step, data = found
    ranks = rank_packing.unpack_ranks(data)
    return RanksSummaryRead(world_size=run.world_size, first_nonfinite=FirstNonfiniteRead(
        step=step, ranks=rank_packing.origin_ranks(ranks.loss, ranks.nonfinite),
        loss=ranks.loss, nonfinite=ranks.nonfinite))
