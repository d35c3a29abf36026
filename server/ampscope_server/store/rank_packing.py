"""Wire v4's per-rank and per-optimizer values of a step, packed one row per step and back. Pure.

`step_ranks.data` holds two columns of one value per rank (`models.RANK_KINDS`): the loss as
float64 bits (NaN and ±inf come back exactly on both dialects, None kept apart by the mask) and
the rank's count of layers with a non-finite gradient. `step_optimizers.data` holds two int64
columns of one value per optimizer, its skip flag (1, 0, None) and its number of parameter
groups, and `step_optimizers.lr` every group's lr in one float64 column, optimizer after
optimizer. A 64-rank job adds one row per step, not 64 (`stat_packing` keeps it compact).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ampscope_server.store import stat_packing
from ampscope_server.store.models import RANK_KINDS


@dataclass(frozen=True, slots=True)
class Ranks:
    """One step's per-rank values, rank r at index r."""

    loss: list[float | None]
    nonfinite: list[int | None]


@dataclass(frozen=True, slots=True)
class Optimizer:
    """One watched optimizer at one step."""

    skipped: bool | None
    lr: list[float | None]


def nonfinite_ranks(loss: Sequence[float | None], nonfinite: Sequence[int | None]) -> list[int]:
    """The ranks whose loss was NaN or ±inf or whose gradient held one (count > 0), ascending."""
    return [rank for rank, (value, count) in enumerate(zip(loss, nonfinite, strict=True))
            if (value is not None and not math.isfinite(value))
            or (count is not None and count > 0)]


def origin_ranks(loss: Sequence[float | None], nonfinite: Sequence[int | None]) -> list[int]:
    """Where a bad step started: the ranks whose own loss was NaN or ±inf, when any; else those
    whose gradients held one. Why the loss first: the gradients a rank reports are after the
    all-reduce (DDP averages them, FSDP reduce-scatters them), so one rank's NaN makes every
    rank's gradients NaN at that same step, while each loss is its rank's own forward."""
    own = [rank for rank, value in enumerate(loss)
           if value is not None and not math.isfinite(value)]
    return own or nonfinite_ranks(loss, nonfinite)


def ranks_row(step: int, loss: Sequence[float | None],
              nonfinite: Sequence[int | None]) -> dict[str, Any]:
    """A step's `step_ranks` row (without step_id and run_key): rank r's values at index r."""
    return {"step": step, "ranks": len(loss),
            "nonfinite_ranks": len(nonfinite_ranks(loss, nonfinite)),
            "data": stat_packing.pack([list(loss), list(nonfinite)], RANK_KINDS)}


def unpack_ranks(data: bytes) -> Ranks:
    loss, nonfinite = stat_packing.unpack(data)
    return Ranks(loss=[None if value is None else float(value) for value in loss],
                 nonfinite=[None if count is None else int(count) for count in nonfinite])


def optimizers_row(optimizers: Sequence[tuple[bool | None, Sequence[float | None]]]
                   ) -> dict[str, Any]:
    """A step's `step_optimizers` row (without step_id and run_key), from each optimizer's
    (skip flag, every group's lr)."""
    skipped = [None if flag is None else int(flag) for flag, _ in optimizers]
    groups = [len(lr) for _, lr in optimizers]
    flat = [value for _, lr in optimizers for value in lr]
    return {"optimizers": len(optimizers),
            "data": stat_packing.pack([skipped, groups], stat_packing.INT * 2),
            "lr": stat_packing.pack([flat], stat_packing.FLOAT)}


def unpack_optimizers(data: bytes, lr: bytes) -> list[Optimizer]:
    skipped, groups = stat_packing.unpack(data)
    (flat,) = stat_packing.unpack(lr)
    out, at = [], 0
    for flag, count in zip(skipped, groups, strict=True):
        n = int(count or 0)
        out.append(Optimizer(skipped=None if flag is None else bool(flag),
                             lr=[None if value is None else float(value)
                                 for value in flat[at:at + n]]))
        at += n
    return out
