"""Gradient clipping on *scaled* gradients: ``clip_grad_norm_`` before ``scaler.unscale_``.

The loop clips right after ``backward()``, while the gradients are still multiplied by the loss
scale (65536 and up): the scaled norm is always far above the threshold, so every step is
clipped to a scaled norm of exactly 1.0, i.e. a true gradient norm of 1/scale, and training
crawls. The correct order is ``scaler.unscale_(opt)`` → clip → ``scaler.step(opt)``. The hook
sees the gradients written between the end of ``backward()`` and ``unscale_``: the misuse is
counted on every step it happens, whether or not the scale ever moves (default
``growth_interval``).
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

NAME = "clip_before_unscale"
MAX_NORM = 1.0


def build(steps: int = 60) -> Scenario:
    model = mlp()
    scaler = torch.amp.GradScaler("cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> None:
        x, y = regression_batch(gen)
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        loss = nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)  # the bug: still scaled
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return Scenario(NAME, model, scaler, optimizer, step, steps, watch={"layer_every": 5})


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
