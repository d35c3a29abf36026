"""A learning rate high enough to explode: plain SGD at lr 3 on a small ReLU MLP.

The loss grows by orders of magnitude within a few steps, the weights get so large that the
FP16 forward overflows, and from then on every step is skipped: the scaler halves its scale each
time, down far below 1, and the model never trains again. No loss scale fixes this: the learning
rate does.
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

NAME = "lr_explodes"
LR = 3.0


def build(steps: int = 60, fp32: bool = False) -> Scenario:
    """``fp32``: the FP32 twin (a disabled scaler: no autocast, no scaling)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 1))
    scaler = torch.amp.GradScaler("cpu", enabled=not fp32)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> torch.Tensor:
        return amp_step(model, scaler, optimizer, *regression_batch(gen))

    return Scenario(NAME, model, scaler, optimizer, step, steps)


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
