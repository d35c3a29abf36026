"""A healthy FP16 AMP run of a recurrent model: an ``nn.LSTMCell`` (hidden size 32) unrolled
over 6 time steps, then a linear head regressing a smooth function of the whole sequence.

A hard case for a false alarm: the gradient of the early time steps passes back through every
later step's sigmoid and tanh gates, shrinking each time (the vanishing gradient of recurrent
nets), and saturated gates pass back values near zero. Small recurrent gradients are the model's
nature, as large in FP32 as in FP16, not the format flushing them. ampscope should find nothing
here (issue #30).
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

NAME = "healthy_lstm"
FEATURES = 8
LENGTH = 6
HIDDEN = 32


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(FEATURES, HIDDEN)
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], HIDDEN)
        c = x.new_zeros(x.shape[0], HIDDEN)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        out: torch.Tensor = self.head(h)
        return out


def sequence_batch(gen: torch.Generator, batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard-normal sequences; the target: a bounded function of features 0-1 over time."""
    x = torch.randn(batch, LENGTH, FEATURES, generator=gen)
    return x, torch.sin(x[:, :, :2].sum(dim=(1, 2)) / 2).unsqueeze(1)


def build(steps: int = 60, fp32: bool = False) -> Scenario:
    torch.manual_seed(0)
    model = Recurrent()
    scaler = torch.amp.GradScaler("cpu", enabled=not fp32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> torch.Tensor:
        return amp_step(model, scaler, optimizer, *sequence_batch(gen), mon=mon)

    return Scenario(NAME, model, scaler, optimizer, step, steps)


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
