"""Revision 0025 (`step_formats`, #33) on both dialects, up, down and up again: a sampled
step's format what-ifs stored at 0025 are read back bit for bit (NaN, ±inf, -0.0 in the raw
float64 bytes), Postgres keeps the blob `STORAGE EXTERNAL` (sliced, not compressed), a
downgrade drops the table and with it the what-ifs (its docstring says so) while every step
stays, and the upgrade after it brings the table back empty."""

from __future__ import annotations

import math
import struct

import pytest

from ampscope_server.store import db
from tests.migrations.support import query, tables
from tests.server.wire import batch_v2, f64le, format_values, new_id, record_v2
from tests.support.ingest import ingest_into

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations.
pytestmark = pytest.mark.slow

STEPS = "SELECT run_key, step, seq FROM steps ORDER BY run_key, step"
FORMATS = "SELECT step, recipes, layers, data FROM step_formats"


def test_0025_adds_step_formats_and_takes_them_back(db_url: str) -> None:
    db.upgrade(db_url)
    values, operands = format_values([1, 0], ["mxfp8"])
    values[:4] = [math.nan, math.inf, -math.inf, -0.0]
    block = {"recipes": ["mxfp8"], "layers": [1, 0], "values": f64le(values),
             "operands": f64le(operands)}
    records = [record_v2(0), {**record_v2(1, step=100), "formats": block}]
    ingest_into(db_url, dict(batch_v2(records, run_id=new_id()), schema_version=7))
    (step, recipes, layers, data), = query(db_url, FORMATS)
    assert (step, recipes, layers) == (100, "mxfp8", "1,0")
    assert data == struct.pack(f"<{len(values) + len(operands)}d", *values, *operands)
    if not db.is_sqlite(db_url):
        assert query(db_url, "SELECT attstorage FROM pg_attribute WHERE attname = 'data' "
                             "AND attrelid = 'step_formats'::regclass") == [("e",)]
    steps = query(db_url, STEPS)
    assert len(steps) == 2

    db.downgrade(db_url, "0024")
    assert "step_formats" not in tables(db_url)
    assert query(db_url, STEPS) == steps

    db.upgrade(db_url)
    assert "step_formats" in tables(db_url)
    assert query(db_url, FORMATS) == []  # lost, as said
    assert query(db_url, STEPS) == steps
