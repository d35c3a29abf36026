"""The one capture shape: what the training thread takes from the gradients, and how the sender
thread turns it into numbers (docs/hook-cost.md#one-capture-shape).

At the cycle's first ``unscale_``/``step`` the training thread makes ONE call, ``take``: one read
of the gradients returning raw device tensors (as stored, times the scale where scaled), never
finalized there: ``NORMS``, the L per-layer L2 norms (``GradStats.raw_norms``), or on per-layer
and histogram steps ``STATS``, the ``(L, 8)`` partials and the ``(L, NUM_BINS)`` histogram from
the same read. ``finish`` does all other arithmetic (scale division, global norm, fractions:
``partials.finalize_host``) on the sender thread, on host floats: on the training thread each
extra op would cost microseconds on the CPU, a launch on a GPU. ``Taken`` says how to read the
tensors back.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul

import torch

from ampscope.histogram import NUM_BINS
from ampscope.partials import NUM_COLUMNS, HostStats, finalize_host
from ampscope.reductions import GradStats
from ampscope.shards import Layout

__all__ = ["Finished", "Kind", "Parts", "Taken", "finish", "global_norm", "take"]


class Kind(enum.Enum):
    NORMS = "norms"
    STATS = "stats"


Parts = list[torch.Tensor]
"""A capture's device tensors: the ``(L,)`` norms, or the partials then the histogram."""


@dataclass(frozen=True)
class Taken:
    """How to read a capture back; a queued GPU record keeps this, not the device tensors."""

    kind: Kind
    device: torch.device
    scaled: tuple[bool, ...]
    histogram: bool = False
    float32_norms: bool = False
    # NORMS read by ``GradStats.checked_norms``: L inf-element flags follow the L norms.
    checked: bool = False
    path: str = "norms"  # "norms", "fused" or "eager": which read made them (tests, benchmarks)
    # Under torch.distributed: the shape of this rank's share of the step's reductions
    # (``shards.py``); the parts are then the kept parts, the SUM buffer and the MAX buffer.
    layout: Layout | None = None

    @property
    def all_scaled(self) -> bool:
        return all(self.scaled)

    def size(self, num_layers: int) -> int:
        """Float values in the capture's parts, flattened (packed with a ``layout``)."""
        own = self.own_size(num_layers)
        if self.layout is None:
            return own
        kept = 0 if self.layout.sharded else own
        return kept + self.layout.sum_size + self.layout.max_size

    def own_size(self, num_layers: int) -> int:
        """How many float values the capture's own parts hold, before any packing."""
        if self.kind is Kind.NORMS:
            return num_layers * (2 if self.checked else 1)
        return NUM_COLUMNS * num_layers + (NUM_BINS * num_layers if self.histogram else 0)


def take(
    stats: GradStats,
    grads: Sequence[torch.Tensor | None],
    scale: torch.Tensor | float,
    scaled: Sequence[bool] | bool,
    *,
    per_layer: bool,
    histogram: bool,
    checked: bool = False,
) -> tuple[Parts, Taken]:
    """The capture's one read, no host sync: the partials (and histogram) on ``per_layer`` or
    ``histogram`` steps, else the raw norms (``checked``: ``GradStats.checked_norms``)."""
    flags = tuple([scaled] * len(grads) if isinstance(scaled, bool) else scaled)
    if per_layer or histogram:
        table, counts = stats.partials(grads, scale, flags, histogram)
        parts: Parts = [table] if counts is None else [table, counts]
        return parts, Taken(Kind.STATS, table.device, flags, histogram=counts is not None,
                            path=stats.last_path or "eager")
    flags_t = None
    if checked:
        norms, flags_t = stats.checked_norms(grads)
    else:
        norms = stats.raw_norms(grads)
    device = norms.device if len(norms) else (
        scale.device if isinstance(scale, torch.Tensor) else torch.device("cpu"))
    if flags_t is not None:
        return [norms, flags_t], Taken(Kind.NORMS, device, flags, checked=True)
    return [norms], Taken(Kind.NORMS, device, flags, float32_norms=stats.float32_norms)


@dataclass(frozen=True)
class Finished:
    """A capture's numbers on the host: the global norm, raw norms or stats, histogram rows."""

    grad_norm: float | None
    # NORMS: each layer's raw norm; None where it is finite but unknown (a checked float32
    # read that overflowed).
    norms: list[float | None] | None = None
    layers: HostStats | None = None
    histogram: list[list[int]] | None = None


def finish(
    taken: Taken,
    values: Sequence[float],
    numels: torch.Tensor,
    scale: float | None,
    table: torch.Tensor | None = None,
) -> Finished:
    """The sender thread's half of a capture: ``values`` the parts' host copy (partials apart in
    ``table``), ``scale`` ``scale_before`` (None: unknown, and so is a scaled layer's norm)."""
    n = len(taken.scaled)
    if taken.kind is Kind.NORMS:
        raw = list(values[:n])
        # ``in`` first: a C scan of the list, where the generator is a Python step per layer.
        if taken.checked and math.inf in raw and any(
                x == math.inf and not inf_element for x, inf_element in zip(
                    raw, values[n : 2 * n], strict=True)):
            # A float32 sum of squares overflowed where no element was inf: those layers'
            # norms (and so the global one) are unknown, not infinite, and they are finite.
            known: list[float | None] = [
                None if x == math.inf and not f else x
                for x, f in zip(raw, values[n : 2 * n], strict=True)]
            return Finished(None, norms=known)
        return Finished(global_norm(raw, scale, taken.scaled), norms=list(raw))
    if table is None:
        table = torch.tensor(values[: NUM_COLUMNS * n], dtype=torch.float64).reshape(
            n, NUM_COLUMNS)
        values = values[NUM_COLUMNS * n :]
    else:
        table = table.reshape(n, NUM_COLUMNS)
    s = math.nan if scale is None else scale
    inv = 1.0 / s if s != 0.0 else math.inf  # IEEE, as the device's reciprocal
    flags = taken.scaled
    to_true: float | torch.Tensor = inv if all(flags) else 1.0
    if flags and not all(flags) and any(flags):
        to_true = torch.where(torch.tensor(flags), torch.tensor(inv, dtype=torch.float64), 1.0)
    stats = finalize_host(table, numels, to_true)
    histogram = None
    if taken.histogram:
        histogram = [[round(c) for c in values[i * NUM_BINS : (i + 1) * NUM_BINS]]
                     for i in range(n)]
    unknown = scale is None and any(taken.scaled)
    return Finished(None if unknown else stats.norm, layers=stats, histogram=histogram)


def _div(x: float, s: float) -> float:
    if s == 0.0:  # a collapsed scale: IEEE division, as torch would do it
        return math.nan if x == 0.0 or math.isnan(x) else math.inf
    return x / s


def global_norm(raw: Sequence[float], scale: float | None, scaled: Sequence[bool]) -> float | None:
    """sqrt(Σ (raw_i / s_i)²) in float64 (s_i the scale where layer i is scaled, else 1): NaN if
    a norm is NaN, else +inf if one is; None when a scaled layer needs an unknown scale."""
    # ``map(mul, raw, raw)``: the same squares summed in the same order, without a Python frame
    # per layer (the sender thread runs this for every record).
    if not any(scaled):
        return math.sqrt(sum(map(mul, raw, raw)))
    if scale is None:
        return None
    if all(scaled):  # one factor: divide once, as the device path does
        return _div(math.sqrt(sum(map(mul, raw, raw))), scale)
    true = [_div(x, scale) if f else x for x, f in zip(raw, scaled, strict=True)]
    return math.sqrt(sum(x * x for x in true))
