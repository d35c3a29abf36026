"""SGD at lr 2 with momentum 0.9: a divergence that builds up over a few steps.

The loss climbs 0.4 → 3 → 9 → 2000 → … and the FP16 forward overflows from the tens of steps
on; each re-check (``mon.recheck``) of a skipped step runs the AMP run's frozen weights in FP32
and stays finite, but at a loss orders of magnitude above the run's own: the FP32 twin of this
loop diverges as well. The learning rate is the cause; the overflow storm, the collapsed scale
and the non-finite losses follow from it. ``python -m scenarios.momentum_diverges``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ampscope.monitor import Monitor
from scenarios import lr_diverges_in_fp32
from scenarios.common import Scenario, main, run_scenario

NAME = "momentum_diverges"
LR = 2.0
MOMENTUM = 0.9


def build(steps: int = 60, fp32: bool = False) -> Scenario:
    """``fp32``: the FP32 twin (no autocast, no scaling)."""
    return lr_diverges_in_fp32.build(steps, fp32, lr=LR, momentum=MOMENTUM, name=NAME)


def run(**options: Any) -> Monitor:
    return run_scenario(build(), **options)


if __name__ == "__main__":
    main(build, __doc__)
