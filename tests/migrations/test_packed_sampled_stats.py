"""Revision 0011 (activation statistics, histograms and swallowed fractions packed one row
per step with the run's key) keeps every value, both ways, on both dialects.

The runs of `test_integer_run_keys` (activation statistics with NaN and +inf, nulls, counts
past 2^40, histograms, swallowed fractions with nulls) are read at the head by the
repository; after the downgrade the row-per-entry tables must hold exactly those values (the
non-finite ones as their storage class), and after the upgrade the reads must give back the
same again.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from ampscope_server.store import db, steps_repository
from tests.migrations.test_integer_run_keys import ingest_runs

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow


def _reads(url: str) -> dict[str, list[tuple[Any, ...]]]:
    engine = db.make_engine(url)
    try:
        with sessionmaker(engine)() as session:
            ids = [int(i) for i in session.execute(text("SELECT id FROM steps ORDER BY id"))
                   .scalars()]
            return {
                "activation_stats": [
                    (r.step_id, r.module_index, r.amax, r.amax_class, r.amin_nz,
                     r.amin_nz_class, r.zero_frac, r.subnormal_frac, r.underflow_frac,
                     r.nan_count, r.inf_count, r.l2, r.l2_class)
                    for r in steps_repository.activation_stats_of(session, ids)],
                "histograms": [(r.step_id, r.layer_index, r.min_exp, r.max_exp, r.counts)
                               for r in steps_repository.histograms_of(session, ids)],
                "swallowed_stats": [(r.step_id, r.layer_index, r.frac)
                                    for r in steps_repository.swallowed_of(session, ids)],
            }
    finally:
        engine.dispose()


def _old_rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as connection:
            def rows(sql: str) -> list[tuple[Any, ...]]:
                return [tuple(row) for row in connection.execute(text(sql))]
            return {
                "activation_stats": rows(
                    "SELECT step_id, module_index, amax, amax_class, amin_nz, amin_nz_class, "
                    "zero_frac, subnormal_frac, underflow_frac, nan_count, inf_count, l2, "
                    "l2_class FROM activation_stats ORDER BY step_id, module_index"),
                "histograms": [
                    (*row[:4], json.loads(row[4]) if isinstance(row[4], str) else row[4])
                    for row in rows("SELECT step_id, layer_index, min_exp, max_exp, counts "
                                    "FROM histograms ORDER BY step_id, layer_index")],
                "swallowed_stats": rows("SELECT step_id, layer_index, frac FROM swallowed_stats "
                                        "ORDER BY step_id, layer_index"),
            }
    finally:
        engine.dispose()


def _packed_rows(url: str) -> list[tuple[Any, ...]]:
    """(table, rows, rows with a run key that is their step's) of the packed tables."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as connection:
            return [(table, *connection.execute(text(
                f"SELECT count(*), sum(CASE WHEN t.run_key = s.run_key THEN 1 ELSE 0 END) "
                f"FROM {table} t JOIN steps s ON s.id = t.step_id")).one())
                for table in ("activation_stats", "histograms", "swallowed_stats")]
    finally:
        engine.dispose()


def test_0011_keeps_every_value_both_ways(db_url: str) -> None:
    ingest_runs(db_url)
    head = _reads(db_url)
    assert {table: len(rows) for table, rows in head.items()} == {
        "activation_stats": 21, "histograms": 12, "swallowed_stats": 12}
    # One packed row per step, keyed by its run: 7, 6 and 6 steps carry them.
    assert _packed_rows(db_url) == [("activation_stats", 7, 7), ("histograms", 6, 6),
                                    ("swallowed_stats", 6, 6)]
    # The module that reported "inf" amax and "nan" amin_nz keeps them as their classes.
    assert {(r[2], r[3], r[4], r[5], r[10]) for r in head["activation_stats"]
            if r[1] == 1} == {(None, 2, None, 1, 2**40)}
    assert {r[2] for r in head["swallowed_stats"]} == {0.5, None}

    db.downgrade(db_url, "0010")
    assert _old_rows(db_url) == head

    db.upgrade(db_url)
    assert _reads(db_url) == head
    assert _packed_rows(db_url) == [("activation_stats", 7, 7), ("histograms", 6, 6),
                                    ("swallowed_stats", 6, 6)]
