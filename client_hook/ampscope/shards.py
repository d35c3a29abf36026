"""One rank's share of a step's cross-rank reductions: packed on the device (training thread),
read back on the host (sender thread). Pure tensor and float maths; ``collective.py`` reduces.

The ``SUM`` buffer (float64) holds, in order: when sharded, the L squared raw norms (norms
steps) or the ``(L, 6)`` summed partials (stats steps), the ``(L, NUM_BINS)`` histogram;
always the ``(3, W)`` ranks block (loss, share, non-finite layers), rank r writing column r
only, so a NaN stays in its own column. The ``MAX`` buffer (sharded stats steps): L ``amax``,
then L ``-amin``. Partials and squared norms of disjoint pieces merge exactly (``partials.py``),
up to float64 addition order. Without sharding (DDP) only the ranks block is reduced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ampscope.partials import AMAX, AMIN, INF, NAN, NUM_COLUMNS, NUM_SUMS

__all__ = ["RANK_ROWS", "Layout", "empty_share", "nonfinite_layers", "pack", "unpack"]

RANK_ROWS = 3
"""Rows of the ranks block: the loss; the share (0: none, the rank's hook is off; 1: a share
without a loss; 2: with one); the rank's non-finite layers."""
F64 = torch.float64


@dataclass(frozen=True)
class Layout:
    """The shape of one step's share: fixed by the step (the same on every rank)."""

    num_layers: int
    world_size: int
    sharded: bool
    stats: bool  # the capture took the (L, 8) partials, else the L norms
    histogram_bins: int = 0  # NUM_BINS when the capture took the histogram, else 0

    @property
    def reduced_parts(self) -> int:
        """Values of the capture's own parts inside the SUM buffer (0 unless sharded)."""
        if not self.sharded:
            return 0
        n = self.num_layers
        return (NUM_SUMS * n if self.stats else n) + self.histogram_bins * n

    @property
    def sum_size(self) -> int:
        return self.reduced_parts + RANK_ROWS * self.world_size

    @property
    def max_size(self) -> int:
        return 2 * self.num_layers if self.sharded and self.stats else 0


def nonfinite_layers(parts: Sequence[torch.Tensor], stats: bool) -> torch.Tensor:
    """How many layers of this rank's capture hold NaN or ±inf, a 0-d device tensor."""
    if stats:
        table = parts[0]
        return ((table[:, NAN] + table[:, INF]) > 0).sum()
    if len(parts) > 1:
        return (torch.isnan(parts[0]) | parts[1]).sum()
    return (~torch.isfinite(parts[0])).sum()


def pack(
    parts: Sequence[torch.Tensor], layout: Layout, rank: int, loss: torch.Tensor | None,
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor | None]:
    """(parts kept, SUM buffer, MAX buffer or None): the capture as ``rank``'s share, no sync."""
    device = parts[0].device
    w = layout.world_size
    ranks = torch.zeros(RANK_ROWS * w, dtype=F64, device=device)
    share = torch.full((), 1.0 if loss is None else 2.0, dtype=F64, device=device)
    if loss is None:
        loss = torch.zeros((), dtype=F64, device=device)
    own = torch.stack([loss.reshape(()).to(F64), share,
                       nonfinite_layers(parts, layout.stats).to(F64)])
    ranks[rank::w] = own  # columns r, W + r, 2W + r
    if not layout.sharded:
        return list(parts), ranks, None
    if layout.stats:
        table = parts[0]
        head = [table[:, :NUM_SUMS].reshape(-1)]
        head += [p.reshape(-1).to(F64) for p in parts[1:]]  # the histogram's counts
        maxes = torch.cat([table[:, AMAX], table[:, AMIN].neg()])
    else:
        head, maxes = [parts[0].to(F64).square()], None
    return [], torch.cat([*head, ranks]), maxes


def empty_share(sum_size: int, max_size: int, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A share that adds nothing (zeros; -inf under MAX): its rank's column says "no share"."""
    sums = torch.zeros(sum_size, dtype=F64, device=device)
    maxes = (torch.full((max_size,), -math.inf, dtype=F64, device=device) if max_size
             else None)
    return sums, maxes


@dataclass(frozen=True)
class Unpacked:
    """The capture's parts (None: a share missing), each rank's loss and non-finite count."""

    parts: list[float] | None
    losses: list[float | None]
    nonfinite: list[int | None]
    complete: bool


def unpack(own: Sequence[float], sums: Sequence[float], maxes: Sequence[float],
           layout: Layout) -> Unpacked:
    """The host side of ``pack``. A rank that contributed nothing leaves its values and the
    sharded parts unknown; a non-sharded capture is rank 0's own and stays known."""
    n, w = layout.num_layers, layout.world_size
    head = layout.reduced_parts
    block = sums[head : head + RANK_ROWS * w]
    share = [round(block[w + r]) for r in range(w)]
    complete = all(share)
    losses = [block[r] if share[r] == 2 else None for r in range(w)]
    nonfinite = [round(block[2 * w + r]) if share[r] else None for r in range(w)]
    if not layout.sharded:
        return Unpacked(list(own), losses, nonfinite, complete)
    if not complete:
        return Unpacked(None, losses, nonfinite, complete)
    if not layout.stats:
        return Unpacked([math.sqrt(x) for x in sums[:n]], losses, nonfinite, complete)
    rows: list[float] = []
    for i in range(n):
        rows += sums[NUM_SUMS * i : NUM_SUMS * (i + 1)]
        rows += [maxes[i], -maxes[n + i]]
    assert len(rows) == NUM_COLUMNS * n
    rows += sums[NUM_SUMS * n : head]  # the histogram's counts, if any
    return Unpacked(rows, losses, nonfinite, complete)
