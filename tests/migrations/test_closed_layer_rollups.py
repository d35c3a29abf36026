"""Revision 0009 (per-layer rollups of closed, dense-enough buckets only) keeps every value,
both ways, on both dialects.

A run is ingested at the head with non-finite scales, null statistics and counts past 2^53, at
the hook's default cadence with a dense stretch. The downgrade must give back the rows revision
0008 kept (every bucket with layer statistics, open ones included, equal to a brute force over
the raw statistics); the upgrade must give back the head's rows, and the reads what they read.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.store import db, rollups, rollups_repository
from ampscope_server.store.float_storage import from_storage
from ampscope_server.store.models import Step
from ampscope_server.store.sql_support import run_key
from tests.server.wire import batch, layer_stats, new_id, record
from tests.support.ingest import ingest_into

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow

SCALES: dict[int, Any] = {70: "inf", 140: "nan", 210: "-inf", 230: None, 260: 2.0**-3}


def _record(step: int) -> dict[str, Any]:
    stats = layer_stats(seed=1.0 + step % 13)
    stats["amax"] = [None if step % 30 == 0 else 0.5 + step % 11, 0.0]
    stats["inf_count"] = [2**62 + step, 0]
    stats["l2"] = [None, float(step)]
    dense = 200 <= step < 264
    return record(step, scale_before=SCALES.get(step, 65536.0),
                  loss="nan" if step == 9 else 1.0,
                  layers=stats if dense or step % 10 == 0 else None)


def _ingest_steps(url: str, run_id: str, steps: list[int]) -> None:
    ingest_into(url, *(batch([_record(step) for step in steps[start:start + 50]], run_id=run_id)
                       for start in range(0, len(steps), 50)))


def _rows(url: str, table: str = "layer_rollups", keyed: bool = True
          ) -> dict[tuple[str, int, int], bytes]:
    """{(run id, level, bucket): blob} of a rollup table, keyed by `runs.key` (revision 0012
    on) or by the run's id (before)."""
    column = "data" if table == "layer_rollups" else "series"
    join = 'r."key" = t.run_key' if keyed else "r.id = t.run_id"
    engine = db.make_engine(url)
    try:
        with engine.connect() as connection:
            return {(run, int(level), int(bucket)): bytes(data)
                    for run, level, bucket, data in connection.execute(text(
                        f"SELECT r.id, t.level, t.bucket, t.{column} FROM {table} t "
                        f"JOIN runs r ON {join}"))}
    finally:
        engine.dispose()


def _series_reads(url: str, run_id: str) -> dict[int, list[tuple[Any, ...]]]:
    engine = db.make_engine(url)
    try:
        with sessionmaker(engine)() as session:
            return {level: rollups_repository.rollup_rows(session, run_id, level, 0,
                                                          1000 >> level, ["series"])
                    for level in rollups.LEVELS}
    finally:
        engine.dispose()


def _brute_force(session: Session, run_id: str) -> dict[tuple[int, int], rollups.LayerArrays]:
    """Every bucket at `LAYER_LEVELS` with layer statistics, folded one step at a time."""
    out: dict[tuple[int, int], rollups.LayerArrays] = {}
    for step in session.execute(select(Step).where(Step.run_key == run_key(run_id))).scalars():
        found = rollups_repository.layer_steps_in(session, run_id, step.step, step.step)
        if not found:
            continue
        assert len(found) == 1
        arrays = rollups.step_layers(found[0][1], from_storage(
            step.scale_before, step.scale_before_class))
        for level in rollups.LAYER_LEVELS:
            key = (level, step.step >> level)
            out[key] = rollups.merge_layers(out.get(key), arrays)  # type: ignore[assignment]
    return out


def _reads(url: str, run_id: str) -> dict[tuple[int, int], rollups.LayerArrays]:
    engine = db.make_engine(url)
    try:
        with sessionmaker(engine)() as session:
            return rollups_repository.layer_rollup_arrays(
                session, run_id, [(level, 0, 1000 >> level) for level in rollups.LEVELS])
    finally:
        engine.dispose()


def test_0009_keeps_every_value_both_ways(db_url: str) -> None:
    db.upgrade(db_url)
    sparse, dense = new_id(), new_id()
    _ingest_steps(db_url, sparse, list(range(0, 190)))  # every 10th step only: no 64-step row
    _ingest_steps(db_url, dense, list(range(0, 700)))
    head_rows, head_series = _rows(db_url), _rows(db_url, "rollups")
    reads = {run: _reads(db_url, run) for run in (sparse, dense)}
    series_reads = {run: _series_reads(db_url, run) for run in (sparse, dense)}
    assert {key[1] for key in head_series} == set(rollups.SERIES_LEVELS)
    assert {key[1] for key in head_rows if key[0] == sparse} == set()  # no closed wide bucket
    assert (dense, 6, 3) in head_rows and (dense, 6, 2) not in head_rows  # dense, sparse
    assert (dense, 6, 10) not in head_rows and (dense, 8, 2) not in head_rows  # open
    # Folded at the head (its reads are the head's): the raw statistics do not change below.
    engine = db.make_engine(db_url)
    try:
        with sessionmaker(engine)() as session:
            expected = {run: _brute_force(session, run) for run in (sparse, dense)}
    finally:
        engine.dispose()

    db.downgrade(db_url, "0008")
    old_rows, old_series = _rows(db_url, keyed=False), _rows(db_url, "rollups", keyed=False)
    # The 4-step rows are back, equal to what the reads folded; the others untouched.
    assert {key: row for key, row in old_series.items() if key[1] != 2} == head_series
    assert {key: row for key, row in old_series.items() if key[1] == 2} == {
        (run, 2, int(bucket)): series for run in (sparse, dense)
        for bucket, series in series_reads[run][2]}
    assert len(series_reads[dense][2]) == 175
    for run in (sparse, dense):
        got = {(level, bucket): rollups.unpack_layers(data)
               for (owner, level, bucket), data in old_rows.items() if owner == run}
        assert got == expected[run]
        assert {key: arrays for key, arrays in reads[run].items()
                if key[0] in rollups.LAYER_LEVELS} == expected[run]

    db.upgrade(db_url)
    assert _rows(db_url) == head_rows and _rows(db_url, "rollups") == head_series
    assert {run: _series_reads(db_url, run) for run in (sparse, dense)} == series_reads
    assert {run: _reads(db_url, run) for run in (sparse, dense)} == reads
