"""Revision 0026 (`step_formats.scales`, #33) keeps every sample both ways, on both dialects:
a sample from a client before wire v8 has no scales (null), one from v8 keeps them bit for bit
(a NaN top included), Postgres keeps the blob `STORAGE EXTERNAL`, and a downgrade drops the
scales the hooks sent (its docstring says so), the samples staying."""

from __future__ import annotations

import math
import struct

import pytest

from ampscope_server.store import db
from tests.migrations.support import columns, query
from tests.server.wire import batch_v2, f64le, formats, new_id, record_v2, scale_values
from tests.support.ingest import ingest_into

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations.
pytestmark = pytest.mark.slow

FORMATS = "SELECT step, recipes, layers, data FROM step_formats ORDER BY step"
SCALES = "SELECT scales FROM step_formats ORDER BY step"


def test_0026_adds_the_scales_and_takes_them_back(db_url: str) -> None:
    db.upgrade(db_url)
    scales = scale_values([0], ["mxfp8"])
    scales[:17] = [math.nan] + [0.0] * 16  # no block held a value
    run_id = new_id()
    old = {**record_v2(0), "formats": formats([0], ["mxfp8"])}
    ingest_into(db_url, dict(batch_v2([old], run_id=run_id), schema_version=7))
    new = {**record_v2(1, step=100),
           "formats": {**formats([0], ["mxfp8"]), "scales": f64le(scales)}}
    ingest_into(db_url, dict(batch_v2([new], run_id=run_id, attempt_id=new_id()),
                             schema_version=8))
    stored = query(db_url, SCALES)
    assert [None if s is None else bytes(s) for (s,) in stored] == [
        None, struct.pack(f"<{len(scales)}d", *scales)]
    if not db.is_sqlite(db_url):
        assert query(db_url, "SELECT attstorage FROM pg_attribute WHERE attname = 'scales' "
                             "AND attrelid = 'step_formats'::regclass") == [("e",)]
    rows = query(db_url, FORMATS)
    assert len(rows) == 2

    db.downgrade(db_url, "0025")
    assert "scales" not in columns(db_url, "step_formats")
    assert query(db_url, FORMATS) == rows

    db.upgrade(db_url)
    assert query(db_url, FORMATS) == rows
    assert query(db_url, SCALES) == [(None,), (None,)]  # lost, as said
