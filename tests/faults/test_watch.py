"""The fault path end to end: ``ampscope.watch`` on a CPU AMP loop, the server killed mid-run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import ampscope
from tests.faults.support import stored_seqs
from tests.support.servers import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo_model import make_training, train_step

pytestmark = pytest.mark.slow


def test_a_real_amp_loop_under_watch_survives_server_kills(
    sqlite_server: ServerProcess, tmp_path: Path
) -> None:
    """End to end: ampscope.watch on a CPU AMP loop while the server is killed and restarted."""
    sqlite_server.start()
    model, scaler, optimizer, gen = make_training()
    mon = ampscope.watch(model, scaler, optimizer, run="faults", server=sqlite_server.url,
                         spool_dir=tmp_path / "spool", layer_every=5)
    steps = 0
    for phase in range(2):
        for _ in range(30):
            train_step(model, scaler, optimizer, gen)
            steps += 1
        if phase < 1:
            sqlite_server.kill()
            for _ in range(15):
                train_step(model, scaler, optimizer, gen)
                steps += 1
            sqlite_server.start()
    mon.close(5.0)
    stats = mon.stats()
    assert stored_seqs(sqlite_server.url, mon.run_id) == list(range(steps))
    assert (stats.produced, stats.acknowledged, stats.spooled, stats.dropped) == (
        steps, steps, 0, 0)
