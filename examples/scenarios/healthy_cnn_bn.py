"""A healthy FP16 AMP run of a small CNN with BatchNorm: two Conv2d + BatchNorm2d + ReLU blocks
and a linear head, classifying 8x8 single-channel images by their brightest quadrant.

A hard case for a false alarm: BatchNorm subtracts the batch mean, so the gradient reaching
each conv is centred and partly cancels (its values spread over many octaves, small ones
included), the ReLUs after it pass back exact zeros for every unit off at a position, and
BatchNorm's own affine parameters get per-channel sums. None of that is FP16 losing anything:
the same run in FP32 has the same zeros. ampscope should find nothing here (issue #30).
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

NAME = "healthy_cnn_bn"
SIZE = 8
"""Images are SIZE x SIZE, one channel."""
CLASSES = 4
"""The label: which quadrant of the image has the largest mean."""


def cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 8, 3, padding=1, stride=2), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * (SIZE // 2) ** 2, CLASSES))


def quadrant_batch(gen: torch.Generator, batch: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard-normal images with one random quadrant brightened; the label is that quadrant."""
    y = torch.randint(0, CLASSES, (batch,), generator=gen)
    half = SIZE // 2
    quadrants = torch.nn.functional.one_hot(y, CLASSES).float().view(batch, 1, 2, 2)
    bright = quadrants.repeat_interleave(half, dim=2).repeat_interleave(half, dim=3)
    return torch.randn(batch, 1, SIZE, SIZE, generator=gen) + bright, y


def build(steps: int = 60, fp32: bool = False) -> Scenario:
    model = cnn()
    scaler = torch.amp.GradScaler("cpu", enabled=not fp32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> torch.Tensor:
        return amp_step(model, scaler, optimizer, *quadrant_batch(gen),
                        loss_fn=nn.functional.cross_entropy, mon=mon)

    return Scenario(NAME, model, scaler, optimizer, step, steps)


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
