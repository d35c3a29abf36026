"""The keyed reads of rollup rows on both dialects: every asked key that is stored, none other,
whether the keys fit one statement or need several."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server import ingest, rollups, rollups_repository
from ampscope_server.models import LayerRollup, Rollup
from ampscope_server.sql_support import run_key
from ampscope_server.wire import IngestBatch
from tests.server.wire import batch, new_id, record

STEPS = 600


@pytest.fixture
def run_id(sessions: sessionmaker[Session]) -> str:
    run_id = new_id()
    with sessions() as session, session.begin():
        ingest.ingest_batch(session, IngestBatch.model_validate_json(json.dumps(
            batch([record(seq) for seq in range(STEPS)], run_id=run_id))))
    return run_id


def _asked() -> list[tuple[int, int]]:
    """Every bucket of every level up to twice the run's length: stored and absent ones."""
    return [(level, bucket) for level in rollups.LEVELS
            for bucket in range(((2 * STEPS) >> level) + 1)]


@pytest.mark.parametrize("per_statement", [1000, 3])
def test_get_rollups_reads_exactly_the_stored_keys(
    sessions: sessionmaker[Session], run_id: str, per_statement: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rollups_repository, "KEYS_PER_STATEMENT", per_statement)
    with sessions() as session:
        stored = {(level, bucket): (series, steps) for level, bucket, series, steps in
                  session.execute(select(Rollup.level, Rollup.bucket, Rollup.series,
                                         Rollup.step_count)
                                  .where(Rollup.run_key == run_key(run_id)))}
        got = rollups_repository.get_rollups(session, run_id, _asked(),
                                             ("series", "step_count"))
    assert len(stored) == 38 + 10 + 3 + 4  # 600 steps in buckets of 16, 64, 256, 1024 and up
    assert sorted(got) == sorted((level, bucket, *value)
                                 for (level, bucket), value in stored.items())


@pytest.mark.parametrize("per_statement", [1000, 3])
def test_get_layer_rollups_reads_exactly_the_stored_keys(
    sessions: sessionmaker[Session], run_id: str, per_statement: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rollups_repository, "KEYS_PER_STATEMENT", per_statement)
    with sessions() as session:
        stored = dict(((level, bucket), data) for level, bucket, data in session.execute(
            select(LayerRollup.level, LayerRollup.bucket, LayerRollup.data)
            .where(LayerRollup.run_key == run_key(run_id))).all())
        got = rollups_repository.get_layer_rollups(session, run_id, _asked())
    # Closed buckets only: 9 of 64 steps, 2 of 256 (every step has layer statistics).
    assert sorted(stored) == [(6, bucket) for bucket in range(9)] + [(8, 0), (8, 1)]
    assert got == stored
