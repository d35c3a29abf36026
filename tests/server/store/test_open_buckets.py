"""The remembered fold of a run's open bucket, on both dialects: kept only once its batch
commits, taken only while the database holds exactly the steps it was folded from, and the
rollups written with it equal to those folded from the raw steps."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.ingest import batches as ingest
from ampscope_server.ingest.wire import IngestBatch
from ampscope_server.store import db, open_buckets, rollups, rollups_repository
from ampscope_server.store.models import LayerRollup, Run, Step
from ampscope_server.store.sql_support import run_key
from tests.server.wire import batch, new_id, record
from tests.support.ingest import ingest_payload

WIDTH = 1 << rollups.LAYER_FINEST
NO_LIMIT = 2**62


def _steps(run_id: str, first: int, count: int) -> dict[str, Any]:
    return batch([record(seq, step=seq) for seq in range(first, first + count)], run_id=run_id)


def _run(session: Session, run_id: str) -> open_buckets.RunKey:
    return run_id, session.execute(select(Run.key).where(Run.id == run_id)).scalar_one()


def _ids(session: Session, run_id: str, first: int, last: int) -> list[int]:
    return list(session.execute(
        select(Step.id).where(Step.run_key == run_key(run_id), Step.step.between(first, last))
        .order_by(Step.id)).scalars())


def _folded(session: Session, run_id: str, bucket: int) -> tuple[rollups.LayerArrays, int]:
    return rollups_repository.fold_finest(session, run_id, [bucket])[bucket]


def test_a_committed_batch_leaves_the_fold_of_its_open_bucket(
    sessions: sessionmaker[Session]
) -> None:
    run_id = new_id()
    ingest_payload(sessions, _steps(run_id, 0, 40))
    ingest_payload(sessions, _steps(run_id, 40, 50))  # closes bucket 0, leaves 64..89 open
    with sessions() as session:
        run = _run(session, run_id)
        entry = open_buckets.recall(session, run, 1, NO_LIMIT)
        ids = _ids(session, run_id, WIDTH, 89)
        layers, count = _folded(session, run_id, 1)
        assert entry == open_buckets.OpenBucket(1, layers, 26, ids[0], ids[-1])
        assert count == 26
        assert open_buckets.recall(session, run, 0, NO_LIMIT) is None  # another bucket


def test_a_rolled_back_batch_leaves_the_remembered_fold_as_it_was(
    sessions: sessionmaker[Session]
) -> None:
    run_id = new_id()
    ingest_payload(sessions, _steps(run_id, 0, 30))
    with sessions() as session:
        before = open_buckets.recall(session, _run(session, run_id), 0, NO_LIMIT)
    assert before is not None and before.layer_steps == 30
    with pytest.raises(RuntimeError), sessions() as session, session.begin():
        ingest.ingest_batch(session, IngestBatch.model_validate_json(
            json.dumps(_steps(run_id, 30, 10))))
        raise RuntimeError("the transaction fails after the batch")
    with sessions() as session:
        assert open_buckets.recall(session, _run(session, run_id), 0, NO_LIMIT) == before
    ingest_payload(sessions, _steps(run_id, 30, 10))
    with sessions() as session:
        after = open_buckets.recall(session, _run(session, run_id), 0, NO_LIMIT)
        assert after is not None
        assert (after.layers, after.layer_steps) == _folded(session, run_id, 0)
        assert after.layer_steps == 40


def test_steps_stored_by_another_process_make_the_fold_stale(
    sessions: sessionmaker[Session], migrated_url: str
) -> None:
    """Another engine (as another worker would) adds steps to the open bucket: this process's
    remembered fold no longer matches, the next batch folds the raw steps, and the bucket's
    row holds every step."""
    run_id = new_id()
    ingest_payload(sessions, _steps(run_id, 0, 20))
    other = db.make_engine(migrated_url)
    try:
        ingest_payload(db.make_session_factory(other), _steps(run_id, 20, 20))
    finally:
        other.dispose()
    with sessions() as session:
        assert open_buckets.recall(session, _run(session, run_id), 0, NO_LIMIT) is None
    ingest_payload(sessions, _steps(run_id, 40, 40))  # closes bucket 0
    with sessions() as session:
        stored = session.execute(select(LayerRollup.data).where(
            LayerRollup.run_key == run_key(run_id), LayerRollup.level == rollups.LAYER_FINEST,
            LayerRollup.bucket == 0)).scalar_one()
        layers, count = _folded(session, run_id, 0)
        assert count == WIDTH
        assert rollups.unpack_layers(stored) == layers


def test_a_resent_step_in_the_open_bucket_joins_its_fold(
    sessions: sessionmaker[Session]
) -> None:
    """A resumed attempt re-sends step 10 (a new row of the same step number): the fold covers
    both rows, as the raw fold does."""
    run_id = new_id()
    ingest_payload(sessions, _steps(run_id, 0, 20))
    ingest_payload(sessions, batch([record(20, step=10), record(21, step=20)], run_id=run_id))
    with sessions() as session:
        entry = open_buckets.recall(session, _run(session, run_id), 0, NO_LIMIT)
        assert entry is not None
        assert (entry.layers, entry.layer_steps) == _folded(session, run_id, 0)
        assert entry.layer_steps == 22


def test_at_most_capacity_runs_are_remembered(
    sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(open_buckets, "CAPACITY", 2)
    runs = [new_id() for _ in range(3)]
    for run_id in runs:
        ingest_payload(sessions, _steps(run_id, 0, 5))
    with sessions() as session:
        found = [open_buckets.recall(session, _run(session, run_id), 0, NO_LIMIT)
                 for run_id in runs]
    assert [entry is not None for entry in found] == [False, True, True]
