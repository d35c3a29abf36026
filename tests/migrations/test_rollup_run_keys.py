"""Revision 0012 (`rollups` and `layer_rollups` keyed by the integer run key) keeps every row
bit for bit, both ways, on both dialects.

Two runs are ingested at the head, one resumed by a second attempt that re-sends old steps,
with NaN and ±inf losses and scales (so the series blobs hold non-finite values), null
statistics and counts past 2^53, dense enough for closed per-layer rollups at every stored
level up to 256 steps. Every row of both tables is read by raw SQL in terms of the public run
id (the layout-independent view): the 0011 rows after the downgrade must equal the head's,
and so must the head's after the upgrade again. Deleting a run cascades through the key.
"""

from __future__ import annotations

from typing import Any

import pytest

from ampscope_server.store import db
from tests.migrations.support import delete_run, query
from tests.server.wire import batch, layer_stats, new_id, record
from tests.support.ingest import ingest_into

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow

SCALES: dict[int, Any] = {70: "inf", 140: "nan", 210: "-inf", 230: None, 260: 2.0**-3}
LOSSES: dict[int, Any] = {9: "nan", 300: "inf", 301: "-inf"}


def make_record(seq: int, step: int) -> dict[str, Any]:
    """A step with non-finite values here and there, layer statistics on most steps, skipped
    on every seventh and in a burst of 40 from step 500, and (sent by a resumed attempt, whose
    seq is not the step) on every third."""
    stats = layer_stats(seed=1.0 + step % 13)
    stats["amax"] = [None if step % 30 == 0 else 0.5 + step % 11, 0.0]
    stats["inf_count"] = [2**62 + step, 0]
    skipped = step % 7 == 3 or 500 <= step < 540 or (seq != step and step % 3 == 0)
    return record(seq, step=step, scale_before=SCALES.get(step, 65536.0),
                  loss=LOSSES.get(step, 1.0 + step), skipped=skipped, found_inf=skipped,
                  layers=stats if step % 5 else None)


def ingest_steps(url: str, run_id: str, steps: list[int], attempt_id: str | None = None,
                 per_batch: int = 50) -> None:
    ingest_into(url, *(batch([make_record(start + i, step)
                              for i, step in enumerate(steps[start:start + per_batch])],
                             run_id=run_id, attempt_id=attempt_id)
                       for start in range(0, len(steps), per_batch)))


def ingest_runs(url: str) -> tuple[str, str]:
    """Two runs at the head, the first resumed from step 600 by a second attempt; (first,
    second)."""
    db.upgrade(url)
    first, second = new_id(), new_id()
    ingest_steps(url, first, list(range(0, 700)))
    ingest_steps(url, second, list(range(0, 330)))
    ingest_steps(url, first, list(range(600, 760)), attempt_id=new_id())
    return first, second


def snapshot(url: str, keyed: bool, extra: str = "") -> dict[str, list[tuple[Any, ...]]]:
    """Every row of both rollup tables by the run's public id, in key order; `extra`: more
    columns of `rollups` to read."""
    join = 'r."key" = t.run_key' if keyed else "r.id = t.run_id"
    return {
        table: query(url, f"SELECT r.id, t.level, t.bucket, t.{blob}"
                          f"{extra if table == 'rollups' else ''} FROM {table} t JOIN runs r "
                          f"ON {join} "
                          "ORDER BY r.id, t.level, t.bucket")
        for table, blob in (("rollups", "series"), ("layer_rollups", "data"))
    }


def test_0012_keeps_every_rollup_row_both_ways(db_url: str) -> None:
    first, second = ingest_runs(db_url)
    db.downgrade(db_url, "0012")
    head = snapshot(db_url, keyed=True)
    levels = {(run, level) for run, level, *_ in head["layer_rollups"]}
    assert {(first, 6), (first, 8), (second, 6), (second, 8)} <= levels
    # A series row for every bucket from 16 steps that holds a step: runs of 760 and 330 steps.
    assert len(head["rollups"]) == sum((last >> level) + 1 for last in (759, 329)
                                       for level in (4, 6, 8, 10, 12, 14, 16))
    assert any(b"\x7f\xf0\x00\x00\x00\x00\x00\x00"[::-1] in row[3] for row in head["rollups"])

    db.downgrade(db_url, "0011")
    assert snapshot(db_url, keyed=False) == head
    db.upgrade(db_url, "0012")
    assert snapshot(db_url, keyed=True) == head

    # The key cascades: deleting a run deletes its rollups, only its.
    db.upgrade(db_url)
    keys = query(db_url, f"SELECT \"key\" FROM runs WHERE id = '{second}'")
    delete_run(db_url, second)
    for table in ("rollups", "layer_rollups"):
        assert query(db_url, f"SELECT count(*) FROM {table} WHERE run_key = {keys[0][0]}") == [
            (0,)]
        assert query(db_url, f"SELECT count(*) FROM {table}") == [
            (sum(1 for row in head[table] if row[0] == first),)]
