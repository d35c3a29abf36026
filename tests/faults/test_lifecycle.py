"""Process lifecycle around a watched run: resume as a new attempt, exit without close(), fork."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
import torch

import ampscope
from tests.support.servers import ServerProcess

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
from demo_model import make_batch, make_training, train_step  # noqa: E402

pytestmark = pytest.mark.slow


def steps_by_attempt(url: str, run_id: str) -> dict[int, list[tuple[int, int]]]:
    body = httpx.get(f"{url}/api/runs/{run_id}/steps", params={"limit": 100_000}).json()
    out: dict[int, list[tuple[int, int]]] = {}
    for s in body["steps"]:
        out.setdefault(s["attempt"], []).append((s["seq"], s["step"]))
    return out


def test_a_resumed_run_opens_a_new_attempt_and_overwrites_nothing(
    sqlite_server: ServerProcess, tmp_path: Path
) -> None:
    sqlite_server.start()
    model, scaler, optimizer, gen = make_training()
    first = ampscope.watch(model, scaler, optimizer, run="resumed", server=sqlite_server.url,
                           spool_dir=tmp_path / "spool")
    for _ in range(12):
        train_step(model, scaler, optimizer, gen)
    first.close()
    # "Restart": a new Monitor on the same run id, as a resumed training process would do.
    model2, scaler2, optimizer2, gen2 = make_training(seed=1)
    second = ampscope.watch(model2, scaler2, optimizer2, run="resumed", run_id=first.run_id,
                            server=sqlite_server.url, spool_dir=tmp_path / "spool")
    for _ in range(7):
        train_step(model2, scaler2, optimizer2, gen2)
    second.close()

    assert second.attempt_id != first.attempt_id
    assert steps_by_attempt(sqlite_server.url, first.run_id) == {
        1: [(i, i) for i in range(12)],
        2: [(i, i) for i in range(7)],
    }
    run = httpx.get(f"{sqlite_server.url}/api/runs/{first.run_id}").json()
    assert [a["id"] for a in run["attempts"]] == [first.attempt_id, second.attempt_id]
    assert run["status"] == "finished"


def test_exit_without_close_flushes_and_exits_cleanly(
    sqlite_server: ServerProcess, tmp_path: Path
) -> None:
    sqlite_server.start()
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(EXAMPLES)!r})
        import ampscope
        from demo_model import make_training, train_step
        model, scaler, optimizer, gen = make_training()
        mon = ampscope.watch(model, scaler, optimizer, run="no-close",
                             server={sqlite_server.url!r}, spool_dir={str(tmp_path / "spool")!r})
        for _ in range(25):
            train_step(model, scaler, optimizer, gen)
        print(mon.run_id)
        # no mon.close(): the atexit hook must flush and let the interpreter exit
    """)
    # A hang at exit fails on the timeout; it is a bound, not a speed (60 s was exceeded by a
    # healthy run on a 2-core host at load 12).
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    run_id = done.stdout.strip()
    assert steps_by_attempt(sqlite_server.url, run_id) == {1: [(i, i) for i in range(25)]}
    assert httpx.get(f"{sqlite_server.url}/api/runs/{run_id}").json()["status"] == "finished"


class _Batches(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = make_batch(torch.Generator().manual_seed(index), batch=1)
        return x[0], y[0]


def test_forked_dataloader_workers_neither_deadlock_nor_duplicate(
    sqlite_server: ServerProcess, tmp_path: Path
) -> None:
    sqlite_server.start()
    model, scaler, optimizer, _ = make_training()
    mon = ampscope.watch(model, scaler, optimizer, run="fork", server=sqlite_server.url,
                         spool_dir=tmp_path / "spool", layer_every=1)
    loader = torch.utils.data.DataLoader(_Batches(), batch_size=8, num_workers=2,
                                         multiprocessing_context="fork")
    steps = 0
    for _epoch in range(2):  # workers are forked again for each epoch, mid-stream
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            steps += 1
    mon.close()
    assert steps == 16
    assert steps_by_attempt(sqlite_server.url, mon.run_id) == {1: [(i, i) for i in range(16)]}
    stats = mon.stats()
    assert (stats.produced, stats.acknowledged, stats.dropped) == (16, 16, 0)
