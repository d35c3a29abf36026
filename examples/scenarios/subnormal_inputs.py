"""Inputs in raw units of 5e-8: subnormal in FP16, one layer computing from what is left.

A sensor's readings arrive in SI units (tens of nanoseconds, say) and are never normalised. Under
FP16 autocast the first linear layer casts them to FP16, where 5e-8 is a subnormal whose spacing
(2^-24, ~6e-8) is as large as the values: one or two significant bits survive. Nothing
overflows, no step is skipped and the loss looks ordinary, but that layer's weight gradient is
computed from those few bits and is a quarter off the FP32 one; every other layer's is within
the format's rounding (~1e-3). Only a comparison with FP32 sees it: the FP32 shadow step
(``shadow_every``) names that layer as precision-sensitive (keep it in FP32, or normalise the
inputs).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ampscope.monitor import Monitor
from scenarios.common import Scenario, amp_step, main, mlp, regression_batch, run_scenario

NAME = "subnormal_inputs"
INPUT_SCALE = 5e-8
SHADOW_EVERY = 5


def batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The regression batch, its inputs in raw units of INPUT_SCALE."""
    x, y = regression_batch(gen)
    return x * INPUT_SCALE, y


def build(steps: int = 60, fp32: bool = False) -> Scenario:
    """``fp32``: the FP32 twin (a disabled scaler: no autocast, no scaling)."""
    model = mlp()
    scaler = torch.amp.GradScaler("cpu", enabled=not fp32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> torch.Tensor:
        x, y = batch(gen)
        return amp_step(model, scaler, optimizer, x, y, mon=mon)

    return Scenario(NAME, model, scaler, optimizer, step, steps,
                    watch={"shadow_every": SHADOW_EVERY})


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
