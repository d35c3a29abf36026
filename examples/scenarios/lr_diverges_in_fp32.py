"""A learning rate of 1e6: the run diverges in FP32 just as much, with the FP32 re-check on.

Plain SGD at lr 1e6 on a small GELU MLP: after the first update the weights are ~1e5 and the
loss, in FP32 as well, is ~1e26. Under FP16 autocast that loss is non-finite and every step is
skipped; the FP32 re-check (``mon.recheck``) of those steps gives a finite loss, but 10^26 x the
run's own healthy loss: not a range problem that BF16 or a better scale would fix, a divergence.
Lower the learning rate. ``python -m scenarios.lr_diverges_in_fp32`` (from examples/).
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

NAME = "lr_diverges_in_fp32"
LR = 1e6


def gelu_mlp(seed: int = 0) -> nn.Module:
    """A small regression MLP with GELU (no dead units: every gradient is dense)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(),
                         nn.Linear(32, 1))


def build(steps: int = 30, fp32: bool = False, lr: float = LR,
          momentum: float = 0.0, name: str = NAME) -> Scenario:
    """``fp32``: the FP32 twin (a disabled scaler: no autocast, no scaling)."""
    model = gelu_mlp()
    scaler = torch.amp.GradScaler("cpu", enabled=not fp32)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> torch.Tensor:
        x, y = regression_batch(gen)
        mon.recheck(lambda: nn.functional.mse_loss(model(x).float(), y))
        return amp_step(model, scaler, optimizer, x, y)

    return Scenario(name, model, scaler, optimizer, step, steps)


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
