"""Revision 0020 (wire v4: `runs.world_size`, `step_ranks`, `step_optimizers`) both ways on both
dialects: the runs stored before it read a world size of 1, a distributed run's rows are
stored and dropped with the revision, and every other row stays as it was."""

from __future__ import annotations

from typing import Any

import pytest

from ampscope_server.store import db
from tests.migrations.support import delete_run, query, tables
from tests.server.wire import batch, new_id, record
from tests.support.ingest import ingest_into

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow

RUNS = "SELECT id, name, host, rank, target_format FROM runs ORDER BY id"
STEPS = ("SELECT r.id, s.seq, s.step, s.loss, s.loss_class FROM steps s "
         "JOIN runs r ON r.key = s.run_key ORDER BY r.id, s.seq")


def _v4(run_id: str) -> dict[str, Any]:
    records = [record(i, ranks={"loss": [1.0, "nan" if i else 2.0], "nonfinite": [0, i]},
                      optimizers=[{"skipped": None, "lr": [0.1, None]}]) for i in range(2)]
    payload = batch(records, run_id=run_id, world_size=2)
    payload["schema_version"] = 4
    return payload


def _counts(url: str) -> tuple[int, int]:
    (ranks,), = query(url, "SELECT COUNT(*) FROM step_ranks")
    (optimizers,), = query(url, "SELECT COUNT(*) FROM step_optimizers")
    return int(ranks), int(optimizers)


def test_0020_adds_world_sizes_and_the_rank_tables_and_takes_them_back(db_url: str) -> None:
    old, distributed = sorted([new_id(), new_id()])
    db.upgrade(db_url, "0019")
    _ingest_at_0019(db_url, old)
    before = (query(db_url, RUNS), query(db_url, STEPS))

    db.upgrade(db_url)
    assert query(db_url, "SELECT id, world_size FROM runs") == [(old, 1)]
    assert (query(db_url, RUNS), query(db_url, STEPS)) == before
    ingest_into(db_url, _v4(distributed))
    assert query(db_url, "SELECT id, world_size FROM runs ORDER BY id") == [
        (old, 1), (distributed, 2)]
    # One row per step in each table, the step's number and its non-finite ranks beside.
    assert query(db_url, "SELECT step, ranks, nonfinite_ranks FROM step_ranks ORDER BY step") \
        == [(0, 2, 0), (1, 2, 1)]
    assert query(db_url, "SELECT optimizers FROM step_optimizers") == [(1,), (1,)]
    with_v4 = (query(db_url, RUNS), query(db_url, STEPS))

    db.downgrade(db_url, "0019")
    assert "step_ranks" not in tables(db_url) and "step_optimizers" not in tables(db_url)
    assert (query(db_url, RUNS), query(db_url, STEPS)) == with_v4

    db.upgrade(db_url)
    # The per-rank values went with the downgrade (its docstring says so), the runs read 1.
    assert query(db_url, "SELECT id, world_size FROM runs ORDER BY id") == [
        (old, 1), (distributed, 1)]
    assert _counts(db_url) == (0, 0)
    ingest_into(db_url, _v4(new_id()))
    assert _counts(db_url) == (2, 2)


def test_deleting_a_run_deletes_its_rank_rows(db_url: str) -> None:
    db.upgrade(db_url)
    kept, deleted = new_id(), new_id()
    ingest_into(db_url, _v4(kept))
    ingest_into(db_url, _v4(deleted))
    assert _counts(db_url) == (4, 4)
    delete_run(db_url, deleted)
    assert _counts(db_url) == (2, 2)
    assert {row[0] for row in query(
        db_url, "SELECT r.id FROM step_ranks t JOIN runs r ON r.key = t.run_key")} == {kept}


def _ingest_at_0019(url: str, run_id: str) -> None:
    """A v3 run, stored by plain SQL as the application did at revision 0019 (today's ingest
    writes `world_size`, which that schema does not have)."""
    engine = db.make_engine(url)
    try:
        with engine.begin() as connection:
            key_sql = "SELECT COALESCE(MAX(key), 0) + 1 FROM runs"
            dialect = connection.dialect.name
            columns = ("id, project, name, tags, config, host, rank, target_format, status, "
                       "created_at, updated_at")
            values = (f"'{run_id}', 'default', 'old', '[]', '{{}}', 'h', 0, 'fp16', 'active', 1.0, "
                      "1.0")
            if dialect == "sqlite":
                connection.exec_driver_sql(
                    f"INSERT INTO runs (key, {columns}) VALUES (({key_sql}), {values})")
            else:
                connection.exec_driver_sql(f"INSERT INTO runs ({columns}) VALUES ({values})")
            (key,), = connection.exec_driver_sql(
                f"SELECT key FROM runs WHERE id = '{run_id}'").all()
            for seq, (loss, cls) in enumerate([(2.5, 0), (None, 1)]):
                connection.exec_driver_sql(
                    "INSERT INTO steps (run_key, attempt, seq, step, wall_time, loss, loss_class,"
                    " scale_before_class, scale_after_class, grad_norm_class, lr_class, "
                    "duration_class, found_inf, skipped) VALUES "
                    f"({key}, 1, {seq}, {seq}, 1.0, {'NULL' if loss is None else loss}, {cls}, "
                    "0, 0, 0, 0, 0, false, false)")
    finally:
        engine.dispose()


