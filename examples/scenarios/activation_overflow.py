"""Activations beyond FP16's range: unnormalised inputs in the tens of thousands.

The first linear layer's outputs exceed 65504 under FP16 autocast, become inf, and the loss is
non-finite on every step: a forward overflow, which no loss scale can fix (the scale only
multiplies the backward). The scaler backs off every step and the scale collapses. The FP32
re-check runs the same batches without autocast: the values are finite there, so it is the
format's range (normalise the inputs, or keep that layer in FP32 / use BF16).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ampscope.monitor import Monitor
from scenarios.common import Scenario, amp_step, main, regression_batch, run_scenario

NAME = "activation_overflow"
INPUT_SCALE = 3e4


def build(steps: int = 30, fp32: bool = False) -> Scenario:
    """``fp32``: the FP32 twin (a disabled scaler: no autocast, no scaling)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 1))
    scaler = torch.amp.GradScaler("cpu", enabled=not fp32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> torch.Tensor:
        x, y = regression_batch(gen)
        x = x * INPUT_SCALE  # raw readings, never normalised
        mon.recheck(lambda: nn.functional.mse_loss(model(x).float(), y))
        return amp_step(model, scaler, optimizer, x, y)

    return Scenario(NAME, model, scaler, optimizer, step, steps)


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
