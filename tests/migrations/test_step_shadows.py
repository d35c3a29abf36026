"""Revision 0024 (`step_shadows`, #30) on both dialects, up, down and up again: a shadow step
stored at 0024 is read back bit for bit (NaN, ±inf and None in its packed arrays, a -inf loss),
a downgrade drops the table and with it the shadow steps (its docstring says so) while every
step stays, and the upgrade after it brings the table back empty."""

from __future__ import annotations

from typing import Any

import pytest

from ampscope_server.store import db, stat_packing
from ampscope_server.store.float_storage import FloatClass
from tests.migrations.support import query, tables
from tests.server.wire import batch_v2, new_id, record_v2
from tests.support.ingest import ingest_into

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations.
pytestmark = pytest.mark.slow

SHADOW: dict[str, Any] = {"status": "ok", "loss": "-inf", "rel_err": [2.0**-1074, "nan"],
                          "cosine": [None, "inf"], "norm": [0.0, 2.0**-1074],
                          "detail": None}
STEPS = "SELECT run_key, step, seq FROM steps ORDER BY run_key, step"
SHADOWS = "SELECT status, loss, loss_class, layers, data, detail FROM step_shadows"


def test_0024_adds_step_shadows_and_takes_them_back(db_url: str) -> None:
    db.upgrade(db_url)
    records = [record_v2(0), {**record_v2(1), "shadow": SHADOW}]
    ingest_into(db_url, dict(batch_v2(records, run_id=new_id()), schema_version=6))
    (status, loss, loss_class, layers, data, detail), = query(db_url, SHADOWS)
    assert (status, layers, detail) == ("ok", 2, None)
    assert (loss, loss_class) == (None, FloatClass.NEG_INF)
    rel_err, cosine, norm = stat_packing.unpack(bytes(data))
    assert rel_err[0] == 2.0**-1074 and rel_err[1] != rel_err[1]
    assert cosine == [None, float("inf")]
    assert norm == [0.0, 2.0**-1074]
    steps = query(db_url, STEPS)
    assert len(steps) == 2

    db.downgrade(db_url, "0023")
    assert "step_shadows" not in tables(db_url)
    assert query(db_url, STEPS) == steps

    db.upgrade(db_url)
    assert "step_shadows" in tables(db_url)
    assert query(db_url, SHADOWS) == []  # lost, as said
    assert query(db_url, STEPS) == steps
