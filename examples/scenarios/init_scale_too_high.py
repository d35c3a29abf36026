"""An initial loss scale far too high: ``GradScaler(init_scale=2**40)``.

The first steps overflow (scaled gradients beyond FP16's 65504) and are skipped while the scaler
halves its scale once per step; after about twenty skipped steps it settles and training runs
clean. The skips are calibration, harmless but avoidable with a lower ``init_scale``.
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

NAME = "init_scale_too_high"
INIT_SCALE = 2.0**40


def build(init_scale: float = INIT_SCALE, steps: int = 80) -> Scenario:
    model = mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step(i: int, mon: Monitor) -> None:
        amp_step(model, scaler, optimizer, *regression_batch(gen))

    return Scenario(NAME, model, scaler, optimizer, step, steps)


def run(init_scale: float = INIT_SCALE, **options: Any) -> Monitor:
    return run_scenario(build(init_scale), **options)


if __name__ == "__main__":
    main(build, __doc__)
