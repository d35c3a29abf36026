"""Running a real multi-process job of ``tests/client_hook/dist_worker.py`` (gloo on the CPU)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from tests.support.servers import free_port


def run_job(tmp_path: Path, mode: str, world: int = 2) -> list[dict[str, Any]]:
    """``world`` ranks of ``dist_worker`` in ``mode`` (see there), each to its end; what each
    wrote, by rank."""
    return run_jobs(tmp_path, [mode], world)[mode]


def run_jobs(tmp_path: Path, modes: list[str], world: int = 2
             ) -> dict[str, list[dict[str, Any]]]:
    """Several jobs of ``dist_worker`` one after the other in one launch of ``world`` ranks
    (an interpreter and a torch import per rank, not per job); what each rank wrote, by job."""
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
               "PYTHONWARNINGS": "ignore"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.client_hook.dist_worker", str(tmp_path / "store"),
             str(tmp_path / f"rank{rank}-JOB.json"), ",".join(modes)],
            env=env, cwd=Path(__file__).resolve().parents[2],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for rank, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=180 * len(modes))
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}: {out[-3000:]}"
    return {mode: [json.loads((tmp_path / f"rank{r}-{i}.json").read_text())
                   for r in range(world)] for i, mode in enumerate(modes)}


def launch(module: str, args: list[str], world: int = 2, timeout: float = 300,
           env: dict[str, str] | None = None) -> None:
    """``world`` ranks of ``python -m module *args`` started as ``torchrun`` starts them
    (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` on a free local
    port; ``env`` added to the environment), each to its end; an assertion names the rank that
    failed, with its output."""
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **(env or {}), "RANK": str(rank), "LOCAL_RANK": str(rank),
             "WORLD_SIZE": str(world),
             "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "PYTHONWARNINGS": "ignore"}) for rank in range(world)]
    for rank, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}: {out[-3000:]}"


def without_deepspeed_shm_build() -> None:
    """Keep DeepSpeed from building its shared-memory all-reduce, a C++ extension compiled on
    the first ``init_distributed`` of a machine (47 s and ~60 s of CPU here, cold). Only its
    ``inference_all_reduce`` uses it; ZeRO's training collectives go through
    ``torch.distributed`` (gloo) either way. DeepSpeed reads ``__compatible_ops__`` to decide
    and keeps the dict it probed, so an op marked incompatible there is never built."""
    import deepspeed
    from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def leave() -> NoReturn:
    """End a worker now that its work is done and its output written, skipping the interpreter's
    teardown. torch 2.13's gloo teardown sometimes aborts a process there ("terminate called
    without an active exception", SIGABRT, no Python frame), after ``destroy_process_group``:
    reproduced in 3 of 60 plain 2-process DDP jobs run two at a time, with no ampscope in them
    (a known class of c10d bugs: pytorch#190489, pytorch PR #179291). A worker's exit status
    must say whether its work failed, not whether torch's teardown did."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@contextlib.contextmanager
def capture_logs() -> Iterator[list[str]]:
    """The ampscope logger's warnings while the block runs."""
    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("ampscope")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
