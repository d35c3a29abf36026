"""A healthy FP16 AMP run: normalised inputs, a modest learning rate, the default scaler.

The reference the other scenarios are judged against: no step overflows after the default
``init_scale`` (65536) settles, no gradient underflows, no misuse. ampscope should find nothing
worth a warning here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

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

NAME = "healthy"


def build(steps: int = 120) -> Scenario:
    model = mlp()
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
