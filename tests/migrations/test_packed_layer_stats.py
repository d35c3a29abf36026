"""Revision 0006 (packed layer statistics) keeps every value, both ways, on both dialects.

A database is filled as the releases before 0006 stored data (per-layer rows from revision
0002, rollups backfilled by revision 0003), with non-finite scales and losses, null statistics
and counts past 2^53. After the upgrade the application's reads give back every stored value
and every rollup exactly; after the downgrade the old tables hold exactly what they held.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.store import db, rollups, rollups_repository, steps_repository

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow

STEPS = 300
LAYERS = 3
STATS = ("amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac", "nan_count",
         "inf_count", "l2")
CLASS_OF_STEP = {7: 2, 40: 1, 41: 3}  # steps whose scale_before is inf, NaN, -inf


def _step_rows() -> list[dict[str, Any]]:
    rows = []
    for step in range(STEPS):
        cls = CLASS_OF_STEP.get(step, 0)
        rows.append({
            "seq": step, "step": step, "wall": 1.7e9 + step,
            "loss": None if step == 9 else 2.0 - step / 7, "loss_class": 1 if step == 9 else 0,
            "scale": None if cls else 2.0 ** (16 - step % 5), "scale_class": cls,
            "grad_norm": None if step == 10 else 1.0 + step / 3,
            "grad_norm_class": 3 if step == 10 else 0,
        })
    return rows


def _stat_rows(step_ids: dict[int, int]) -> list[dict[str, Any]]:
    rng = random.Random(11)
    rows = []
    for step, step_id in sorted(step_ids.items()):
        if step % 3:
            continue  # layer statistics every third step, as a sampled cadence stores them
        for index in range(LAYERS):
            amax = None if (step, index) == (30, 1) else rng.lognormvariate(-3, 3)
            rows.append({
                "step_id": step_id, "layer_index": index,
                "amax": amax, "amin_nz": None if amax is None else amax * rng.random() * 1e-6,
                "zero_frac": rng.randrange(1000) / 1000 if index else 0.0,
                "subnormal_frac": rng.random() / 3, "underflow_frac": rng.randrange(7) / 4096,
                "nan_count": 2**53 + 1 if step == 60 else 0, "inf_count": step % 2,
                "l2": None if amax is None else amax * 100 * rng.random(),
            })
    return rows


def _fill_as_of_0002(url: str) -> None:
    engine = db.make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO runs VALUES ('r', 'p', 'n', '[]', '{}', 'h', 0, "
                                    "'fp16', 'active', 1, 1)"))
            connection.execute(text("INSERT INTO attempts (id, run_id, ordinal, pid, started_at) "
                                    "VALUES ('a', 'r', 1, 7, 1.0)"))
            connection.execute(text(
                "INSERT INTO steps (run_id, attempt_id, seq, step, wall_time, loss, loss_class, "
                "scale_before, scale_before_class, scale_after, scale_after_class, found_inf, "
                "skipped, grad_norm, grad_norm_class, lr, lr_class, duration, duration_class) "
                "VALUES ('r', 'a', :seq, :step, :wall, :loss, :loss_class, :scale, :scale_class,"
                " :scale, :scale_class, false, false, :grad_norm, :grad_norm_class, 0.001, 0, "
                "0.01, 0)"
            ), _step_rows())
            step_ids = {int(step): int(step_id) for step, step_id in connection.execute(
                text("SELECT step, id FROM steps"))}
            connection.execute(text(
                f"INSERT INTO layer_stats (step_id, layer_index, {', '.join(STATS)}) VALUES "
                f"(:step_id, :layer_index, {', '.join(':' + name for name in STATS)})"
            ), _stat_rows(step_ids))
    finally:
        engine.dispose()


def _old_tables(url: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(layer_stats rows, rollups rows) of a database at revision 0005, in key order."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as connection:
            stats = [tuple(row) for row in connection.execute(text(
                f"SELECT step_id, layer_index, {', '.join(STATS)} FROM layer_stats "
                "ORDER BY step_id, layer_index"))]
            rolled = [tuple(row) for row in connection.execute(text(
                f"SELECT level, bucket, series, {', '.join(rollups.ROLLUP_STATS)} FROM rollups "
                "WHERE run_id = 'r' ORDER BY level, bucket"))]
    finally:
        engine.dispose()
    return stats, [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                   for row in rolled]


def _same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN, and of the same type (an int count stays an int)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def test_0006_keeps_every_value_both_ways(db_url: str) -> None:
    db.upgrade(db_url, "0002")
    _fill_as_of_0002(db_url)
    db.upgrade(db_url, "0005")
    old_stats, old_rollups = _old_tables(db_url)
    assert len(old_stats) == LAYERS * STEPS // 3
    assert {row[0] for row in old_rollups} == set(rollups.LEVELS)
    sent = _stat_rows({step: step_id for step_id, step in _step_ids(db_url)})
    assert [row[2:] for row in old_stats] == [tuple(r[n] for n in STATS) for r in sent]

    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with sessionmaker(engine)() as session:
            got = steps_repository.layer_stats_of(session, [row[0] for row in old_stats[::LAYERS]])
            assert len(got) == len(old_stats)
            for row, want in zip(got, sent, strict=True):
                assert (row.step_id, row.layer_index) == (want["step_id"], want["layer_index"])
                for name in STATS:
                    assert _same(getattr(row, name), want[name]), (row, name)
            assert _rollups_now(session) == old_rollups
            assert session.execute(text("SELECT count(*) FROM layer_stats")).scalar() == STEPS // 3
            assert session.execute(text(
                'SELECT count(*) FROM layer_stats l JOIN runs r ON r."key" = l.run_key '
                "WHERE r.id = 'r'")).scalar() == STEPS // 3
    finally:
        engine.dispose()

    db.downgrade(db_url, "0005")
    stats_back, rollups_back = _old_tables(db_url)
    assert len(stats_back) == len(old_stats)
    for back, before in zip(stats_back, old_stats, strict=True):
        assert all(_same(a, b) for a, b in zip(back, before, strict=True)), (back, before)
    assert rollups_back == old_rollups


def _step_ids(url: str) -> list[tuple[int, int]]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as connection:
            return [(int(i), int(s)) for i, s in connection.execute(
                text("SELECT id, step FROM steps ORDER BY step"))]
    finally:
        engine.dispose()


def _rollups_now(session: Session) -> list[tuple[Any, ...]]:
    """Every rollup of run 'r', as the application reads it, in the old rows' shape."""
    out: list[tuple[Any, ...]] = []
    for level in rollups.LEVELS:
        for bucket, *columns in rollups_repository.rollup_rows(
            session, "r", level, 0, STEPS >> level, ["series", *rollups.ROLLUP_STATS]
        ):
            out.append((level, bucket, *columns))
    return out
