"""FP16 parameters without an FP32 master copy: ``model.half()`` trained directly.

Each SGD update (lr · grad, around 1e-5) is smaller than half the spacing of FP16 at the
weights' magnitude (about 1e-4 at 0.3), so it rounds away: most elements of every weight never
change, although their gradients are non-zero. ``torch.amp.GradScaler`` refuses FP16
gradients, so such loops run without loss scaling (here: the scaler with ``enabled=False``).
The fix: keep FP32 weights under ``torch.autocast`` (or FP32 master weights).
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
from scenarios.common import Scenario, main, mlp, regression_batch, run_scenario

NAME = "fp16_params_no_master"
LR = 1e-3


def build(steps: int = 40) -> Scenario:
    model = mlp().half()
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> None:
        x, y = regression_batch(gen)
        loss = nn.functional.mse_loss(model(x.half()).float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return Scenario(NAME, model, scaler, optimizer, step, steps, watch={"layer_every": 5})


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
