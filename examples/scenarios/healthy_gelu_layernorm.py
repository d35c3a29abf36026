"""A healthy FP16 AMP run of a pre-norm residual MLP: two blocks ``x + Linear(GELU(Linear(
LayerNorm(x))))``, the feed-forward half of a transformer, on the healthy scenario's data.

The eighth healthy model (issue #30): where the Tanh and ReLU MLPs differ in their exact zeros,
this one differs in its small values. GELU's negative tail passes back gradients that are tiny
but not zero (unlike ReLU's exact zeros), LayerNorm divides by the activations' spread and
subtracts their mean, so its input gradient cancels, and the residual stream carries the
gradient past the blocks, leaving the blocks' own weights small gradients. A long low tail of
gradient values is the model's normal, in FP32 as in FP16, well above FP16's floor at the
scaler's scale. ampscope should find nothing here.
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

NAME = "healthy_gelu_layernorm"
WIDTH = 32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                                 nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.mlp(self.norm(x))
        return out


def build(steps: int = 120, fp32: bool = False) -> Scenario:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, WIDTH), Block(), Block(), nn.Linear(WIDTH, 1))
    scaler = torch.amp.GradScaler("cpu", enabled=not fp32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> torch.Tensor:
        return amp_step(model, scaler, optimizer, *regression_batch(gen), mon=mon)

    return Scenario(NAME, model, scaler, optimizer, step, steps)


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
