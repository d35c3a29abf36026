"""A NaN in the data at one step (a corrupt sample), with the FP32 re-check registered.

One batch carries a NaN: its loss and every gradient are NaN, the scaler skips the step and
halves the scale for nothing. The hook's FP32 re-check (``mon.recheck``) runs the same batch
without autocast and scaling: the NaN persists, so it is the data, not the format's range.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ampscope.monitor import Monitor
from scenarios.common import (
    Scenario,
    amp_step,
    main,
    mlp,
    regression_batch,
    run_scenario,
)

NAME = "nan_in_data"
BAD_STEP = 40


def build(steps: int = 60, bad_step: int = BAD_STEP) -> Scenario:
    model = mlp()
    scaler = torch.amp.GradScaler("cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> None:
        x, y = regression_batch(gen)
        if i == bad_step:
            x[5, 2] = math.nan  # one corrupt feature of one sample
        mon.recheck(lambda: nn.functional.mse_loss(model(x).float(), y))
        amp_step(model, scaler, optimizer, x, y)

    return Scenario(NAME, model, scaler, optimizer, step, steps)


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
