"""Tiny-gradient underflow: ``nn.Linear(2, 1)`` fed inputs of 1e-4 under FP16 autocast.

The weight's true gradient is about 2e-8, below half of FP16's smallest subnormal (2^-25 ≈ 3e-8):
at loss scale 1 the FP16 gradient is exactly 0 (``zero_frac`` 1.0, the weight never learns),
at 65536 it is about 1.3e-3 and survives. The scaler is held at ``init_scale`` (no growth within
the run), as when a loop pins the scale at 1 or the scale collapsed earlier.
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
from scenarios.common import Scenario, amp_step, main, run_scenario

NAME = "tiny_gradient_underflow"
INPUT = 1e-4


def build(init_scale: float = 1.0, steps: int = 40) -> Scenario:
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(0.5)
        model.bias.zero_()
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=10**6)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.full((8, 2), INPUT)
    y = torch.zeros(8, 1)

    def step(i: int, mon: Monitor) -> None:
        amp_step(model, scaler, optimizer, x, y)

    return Scenario(NAME, model, scaler, optimizer, step, steps, watch={"layer_every": 1})


def run(init_scale: float = 1.0, **options: Any) -> Monitor:
    return run_scenario(build(init_scale), **options)


if __name__ == "__main__":
    main(build, __doc__)
