"""A healthy FP16 AMP run of a ReLU MLP: the healthy scenario with ReLU instead of Tanh.

ReLU units that are off for a whole batch pass back exact zeros, so the weight gradients feeding
them hold whole rows of exact zeros in the FP32 master gradient. Those zeros are structural (a
dead unit), not FP16 underflow: ampscope must not warn about them (issue #14). Some first-layer
biases start negative enough to keep a few units off for every input, as happens in practice.
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

NAME = "healthy_relu"
DEAD_UNITS = 4
"""First-layer units whose bias starts at -DEAD_BIAS: off for every standard-normal input."""
DEAD_BIAS = 50.0


def build(steps: int = 120) -> Scenario:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 1))
    with torch.no_grad():
        first = model[0]
        assert isinstance(first, nn.Linear)
        first.bias[:DEAD_UNITS] = -DEAD_BIAS
    scaler = torch.amp.GradScaler("cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> None:
        amp_step(model, scaler, optimizer, *regression_batch(gen), mon=mon)

    return Scenario(NAME, model, scaler, optimizer, step, steps)


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
