"""Running a real multi-process job of ``tests/client_hook/dist_worker.py`` (gloo on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.servers import free_port


def run_job(tmp_path: Path, mode: str, world: int = 2) -> list[dict[str, Any]]:
    """``world`` ranks of ``dist_worker`` in ``mode`` (see there), each to its end; what each
    wrote, by rank."""
    store = tmp_path / "store"
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
               "PYTHONWARNINGS": "ignore"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.client_hook.dist_worker", str(store),
             str(tmp_path / f"rank{rank}.json"), mode],
            env=env, cwd=Path(__file__).resolve().parents[2],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for rank, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}: {out[-3000:]}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def launch(module: str, args: list[str], world: int = 2, timeout: float = 300) -> None:
    """``world`` ranks of ``python -m module *args`` started as ``torchrun`` starts them
    (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` on a free local
    port), each to its end; an assertion names the rank that failed, with its output."""
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
             "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "PYTHONWARNINGS": "ignore"}) for rank in range(world)]
    for rank, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}: {out[-3000:]}"
