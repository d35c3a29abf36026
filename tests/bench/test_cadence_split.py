"""``bench/cadence_split.py`` on the sweep's smallest model, as a user runs it: the steps after
the first segment, grouped by what the hook's defaults read at each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_steps_are_grouped_by_kind() -> None:
    done = subprocess.run(
        [sys.executable, "bench/cadence_split.py", "--size", "0.25M",
         "--rounds", "6"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("0.25M: 50 steps each; no-hook median step ")
    # Steps 10-59 at the defaults (layer_every 10, activations every 50): 45 plain, 4 per-layer
    # (10, 20, 30, 40), one activation step (50).
    assert [(line.split()[0], line.split()[1]) for line in lines[2:]] == [
        ("plain", "45"), ("per-layer", "4"), ("activations", "1")]
