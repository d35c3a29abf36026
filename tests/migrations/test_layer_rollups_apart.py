"""Revision 0015 (per-layer rollups with each statistic compressed apart) keeps every value bit
for bit, both ways, on both dialects: the blobs of 0014 come back byte for byte after an upgrade
and a downgrade, and at 0015 each holds the values it held, NaN, ±inf, -0.0 and None included,
over more rows than one round trip of the migration takes."""

from __future__ import annotations

import math
import random
import struct

import pytest
from sqlalchemy import text

from ampscope_server.store import db, rollups, stat_packing
from tests.migrations.support import query
from tests.migrations.test_rollup_run_keys import ingest_steps
from tests.server.wire import new_id

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow

ROWS = 1200  # more than the migration's 500 rows a round trip
LAYERS = 7


def _columns(rng: random.Random) -> list[list[float | int | None]]:
    """Ten statistics of LAYERS layers, the floats with every kind of special value."""
    def value(kind: str) -> float | int | None:
        if kind == stat_packing.INT:
            return rng.choice([0, 3, 2**62 + rng.randrange(100), -1])
        return rng.choice([rng.lognormvariate(0, 20), 0.0, -0.0, math.nan, math.inf,
                           -math.inf, None, 5e-324])
    kinds = _kinds()
    return [[value(kind) for _ in range(LAYERS)] for kind in kinds]


def _kinds() -> str:
    return "".join(stat_packing.INT if name in rollups.INT_STATS else stat_packing.FLOAT
                   for name in rollups.ROLLUP_STATS)


def _bits(columns: list[list[float | int | None]]) -> list[list[object]]:
    return [[struct.pack("<d", v) if isinstance(v, float) else v for v in column]
            for column in columns]


def _blobs(url: str) -> dict[tuple[int, int], bytes]:
    return {(level, bucket): data for level, bucket, data in query(
        url, "SELECT level, bucket, data FROM layer_rollups ORDER BY level, bucket")}


def test_0015_rewrites_every_blob_and_keeps_every_value(db_url: str) -> None:
    # The run's row, written by today's ingest (at the head: its models may hold later
    # columns, e.g. 0018's `layers.raw_name`), then taken back to 0014.
    db.upgrade(db_url)
    run_id = new_id()
    ingest_steps(db_url, run_id, [0, 1])
    db.downgrade(db_url, "0014")
    rng = random.Random(15)
    columns = {(6 + 2 * (i % 3), i): _columns(rng) for i in range(ROWS)}
    engine = db.make_engine(db_url)
    try:
        with engine.begin() as connection:
            key = connection.execute(text('SELECT "key" FROM runs WHERE id = :id'),
                                     {"id": run_id}).scalar_one()
            connection.execute(text("DELETE FROM layer_rollups"))
            connection.execute(
                text("INSERT INTO layer_rollups (run_key, level, bucket, data) "
                     "VALUES (:k, :l, :b, :d)"),
                [{"k": key, "l": level, "b": bucket,
                  "d": stat_packing.pack(values, _kinds())}
                 for (level, bucket), values in columns.items()])
    finally:
        engine.dispose()
    before = _blobs(db_url)
    assert {blob[0] for blob in before.values()} == {stat_packing.VERSION}

    db.upgrade(db_url)
    after = _blobs(db_url)
    assert set(after) == set(columns)
    assert {blob[0] for blob in after.values()} == {stat_packing.APART}
    for position, (where, blob) in enumerate(sorted(after.items())):
        assert _bits(stat_packing.unpack(blob)) == _bits(columns[where]), where
        if position % 100 == 0:  # one column alone reads what the whole unpack reads
            assert _bits(list(stat_packing.unpack_columns(blob, [3]).values())) == _bits(
                [columns[where][3]]), where

    db.downgrade(db_url, "0014")
    assert _blobs(db_url) == before
