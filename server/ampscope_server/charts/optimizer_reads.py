"""Reading wire v4's `optimizers` back as charts (`GET /api/runs/{id}/optimizers`): for each
watched optimizer, the steps it skipped and the lr of each parameter group over the steps.

A run sends the block only with several optimizers or parameter groups (one optimizer with one
group is the step's own `skipped` and `lr`), so most runs have no row here and read back an
empty list. `tracks` is pure: rows in, the response out.

Cost: one `step_optimizers` row per step that carried the block is read and unpacked (there
are no rollups of this table): a long run with several optimizers reads all of its rows, and
unpacking them (`stat_packing`'s compressed format) is nearly all of the read's time
(docs/storage.md#the-optimizer-tracks-cost).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from ampscope_server.charts import series_math
from ampscope_server.charts.schemas import (
    OptimizerGroupRead,
    OptimizersRead,
    OptimizerTrackRead,
    SeriesPointRead,
)
from ampscope_server.store import rank_packing, ranks_repository
from ampscope_server.store.models import Run
from ampscope_server.store.rank_packing import Optimizer

OPTIMIZER_SKIPS_LISTED = 10_000
"""The most skipped steps listed per optimizer (the count is always exact)."""
OPTIMIZER_GROUPS_CHARTED = 16
"""The most parameter groups of one optimizer whose lr is charted (`groups` counts them all)."""


@dataclass
class _Track:
    steps: int = 0
    skipped: int = 0
    unknown: int = 0
    skipped_steps: list[int] = field(default_factory=list)
    groups: int = 0
    lr: list[tuple[list[int], list[float]]] = field(default_factory=list)
    """Per charted group: the steps where it had an lr, and that lr (NaN and ±inf included)."""

    def add(self, step: int, optimizer: Optimizer) -> None:
        self.steps += 1
        if optimizer.skipped is None:
            self.unknown += 1
        elif optimizer.skipped:
            self.skipped += 1
            if len(self.skipped_steps) < OPTIMIZER_SKIPS_LISTED:
                self.skipped_steps.append(step)
        self.groups = max(self.groups, len(optimizer.lr))
        for group, lr in enumerate(optimizer.lr[:OPTIMIZER_GROUPS_CHARTED]):
            while len(self.lr) <= group:
                self.lr.append(([], []))
            if lr is not None:
                self.lr[group][0].append(step)
                self.lr[group][1].append(lr)


def tracks(rows: Iterable[tuple[int, Sequence[Optimizer]]], max_points: int) -> OptimizersRead:
    """Each optimizer's skips and each of its groups' lr (`max_points` buckets at most, min/max/
    last per bucket, never strided) from (step, that step's optimizers) rows sorted by step.
    A step may carry fewer optimizers or groups than another; a group's lr of None is no
    point, NaN and ±inf are points."""
    found: list[_Track] = []
    last_step: int | None = None
    for step, optimizers in rows:
        last_step = step
        for index, optimizer in enumerate(optimizers):
            while len(found) <= index:
                found.append(_Track())
            found[index].add(step, optimizer)
    return OptimizersRead(optimizers=[
        OptimizerTrackRead(
            optimizer=index, steps=track.steps, skipped=track.skipped, unknown=track.unknown,
            skipped_steps=track.skipped_steps, groups=track.groups,
            lr=[_group(group, steps, values, max_points)
                for group, (steps, values) in enumerate(track.lr) if steps])
        for index, track in enumerate(found)
    ], last_step=last_step)


def _group(group: int, steps: list[int], values: list[float], max_points: int
           ) -> OptimizerGroupRead:
    points, downsampled = series_math.downsample(steps, values, max_points)
    return OptimizerGroupRead(group=group, downsampled=downsampled, points=[
        SeriesPointRead(step=p.step, min=p.min, max=p.max, last=p.last) for p in points])


def optimizers_read(session: Session, run: Run, max_points: int, start: int | None,
                    end: int | None) -> OptimizersRead:
    """The run's optimizers over its steps in [start, end] (None: unbounded)."""
    rows = ((step, rank_packing.unpack_optimizers(data, lr))
            for step, data, lr in ranks_repository.optimizers_by_step(
                session, run.id, start, end))
    return tracks(rows, max_points)
