"""``bench/unscale_norms.py`` on the sweep's smallest model, as a user runs it: every
configuration trains to the same weights, and the C loop did the last step's unscale in the
one-pass configurations only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_configuration_trains_to_the_same_weights() -> None:
    done = subprocess.run(
        [sys.executable, "bench/unscale_norms.py", "--sizes", "0.25M",
         "--rounds", "1", "--steps", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    head = next(line for line in done.stdout.splitlines() if line.startswith("0.25M:"))
    assert head.endswith("the last step unscaled by the C loop: [False, True, False, True]; "
                         "the same weights in every configuration: yes")
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["configuration"])
    assert [" ".join(line.split()[:2]) for line in lines[start + 1:start + 6]] == [
        "no hook", "plain, two", "plain, one", "default, two", "default, one"]
    assert "the passes alone (median of 10): torch's unscale " in done.stdout
