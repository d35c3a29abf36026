"""``bench/deepspeed_overhead.py`` at a tiny size: the bench keeps running (its figures are for
``docs/hook-cost.md``, never asserted)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import free_port

pytestmark = pytest.mark.frameworks

ROOT = Path(__file__).resolve().parents[2]


def test_the_deepspeed_bench_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "bench/deepspeed_overhead.py", "--rounds", "1", "--steps", "3",
         "--warmup", "2", "--width", "16"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "MASTER_PORT": str(free_port())})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()  # DeepSpeed prints what it builds, first
    head = next(line for line in lines if line.startswith("DeepSpeed 0.19.8, torch "))
    assert "0.00M parameters, ZeRO stage 2, fp32, 1 rounds x 3 steps (+2 warm-up)" in head
    assert [line.split()[0] for line in lines if re.match(r"(ampscope|control) +median", line)
            ] == ["ampscope", "control"]
