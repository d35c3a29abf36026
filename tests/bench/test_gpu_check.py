"""``bench/gpu_check.py`` on the CPU, at a tiny shape: the GPU check stays runnable where no GPU
is (its sync and pinned-copy parts only mean something on CUDA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--device", "cpu", "--steps", "6", "--rounds",
         "1", "--segment", "3", "--fsdp-steps", "3", "--vocab", "64", "--d", "32", "--layers",
         "2", "--seq", "16", "--batch", "2", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert json.loads(done.stdout) == summary
    assert summary["syncs_and_copies"] == {
        "steps": 6, "produced": 6, "acknowledged": 6, "records": 6, "internal_errors": 0,
        "with_layers": 6, "copies": {"pinned_with_event": 0, "other": 6}}  # CPU: no copy
    assert summary["fsdp2"] == {"steps": 3, "records": 3, "equal_to_full": 3,
                                "internal_errors": 0}
    cost = summary["cost"]
    assert (cost["rounds"], cost["segment_steps"]) == (1, 3)
    assert cost["ratio_min"] == cost["ratio_median"] == cost["ratio_max"] > 0
