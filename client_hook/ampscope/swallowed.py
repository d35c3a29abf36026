"""Swallowed updates: parameters held in FP16/BF16 whose update rounds away (contract "Wire v3").

A low-precision parameter (``model.half()``, no FP32 master copy) changes only when its update
exceeds half the format's spacing at its magnitude; smaller updates silently do nothing. On
layer-stat steps ``scaler.step`` is bracketed: the stepping optimizer's low-precision parameters
are copied before, and after it each layer's ``swallowed`` fraction is counted on the device: of
the elements with a finite non-zero gradient, the share bit-identical after the step. Cost: none
without FP16/BF16 parameters; else one copy and two reductions per layer on those steps, no
sync. A skipped step's fractions are not sent.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["LOW_PRECISION", "SwallowProbe"]

LOW_PRECISION = (torch.float16, torch.bfloat16)

Snapshot = list[tuple[int, torch.nn.Parameter, torch.Tensor]]


class SwallowProbe:
    """Per-cycle counts; ``for_params`` returns None when no parameter is low precision."""

    def __init__(self, lowp: Sequence[tuple[int, torch.nn.Parameter]], num_layers: int) -> None:
        self._lowp = list(lowp)
        self._num_layers = num_layers
        self._counts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def for_params(cls, params: Sequence[torch.nn.Parameter]) -> SwallowProbe | None:
        lowp = [(i, p) for i, p in enumerate(params) if p.dtype in LOW_PRECISION]
        return cls(lowp, len(params)) if lowp else None

    def reset(self) -> None:
        self._counts = {}

    def before_step(self, optimizer: torch.optim.Optimizer) -> Snapshot:
        """Copies of the optimizer's low-precision watched parameters that have a gradient."""
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        return [(i, p, p.detach().clone()) for i, p in self._lowp
                if id(p) in owned and p.grad is not None]

    def after_step(self, snapshot: Snapshot) -> None:
        for i, p, old in snapshot:
            grad = p.grad
            if grad is None:
                continue
            moving = (grad != 0) & torch.isfinite(grad)
            unchanged = (p.detach() == old) & moving
            counts = (unchanged.sum(), moving.sum())
            if i in self._counts:  # a parameter in two optimizers' groups: add up
                counts = (self._counts[i][0] + counts[0], self._counts[i][1] + counts[1])
            self._counts[i] = counts

    def block(self) -> torch.Tensor | None:
        """Per layer: the swallowed fraction, NaN where not measured; None when nothing was."""
        if not self._counts:
            return None
        device = next(iter(self._counts.values()))[0].device
        f64 = torch.float64
        nan = torch.full((), float("nan"), dtype=f64, device=device)
        # 0 / 0 (no element had a non-zero gradient) is NaN too: nothing to judge. One stack
        # of 0-d tensors: no index tensor to copy to the device.
        out = torch.stack([
            self._counts[i][0].to(f64) / self._counts[i][1].to(f64) if i in self._counts else nan
            for i in range(self._num_layers)
        ])
        return out
