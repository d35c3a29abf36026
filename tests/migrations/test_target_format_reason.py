"""Revision 0022 (`runs.target_format_reason`, #30) keeps every run both ways, on both
dialects: a run whose client sent no reason has none (null), and a downgrade drops the reasons
the hooks sent (its docstring says so), the formats staying."""

from __future__ import annotations

import pytest

from ampscope_server.store import db
from tests.migrations.support import columns, query
from tests.server.wire import batch, new_id, record
from tests.support.ingest import ingest_into

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow

RUN_ROWS = "SELECT id, name, target_format FROM runs ORDER BY id"



def test_0022_adds_the_reason_and_takes_it_back(db_url: str) -> None:
    db.upgrade(db_url)
    before = new_id()  # a client before the reason (wire v1)
    ingest_into(db_url, batch([record(0)], run_id=before, name="before"))
    after = new_id()
    payload = batch([record(0)], run_id=after, name="after", target_format="bf16",
                    target_format_reason="32 of 32 parameter tensors are BF16")
    ingest_into(db_url, dict(payload, schema_version=6))
    reasons = "SELECT id, target_format_reason FROM runs ORDER BY id"
    assert query(db_url, reasons) == sorted(
        [(before, None), (after, "32 of 32 parameter tensors are BF16")])
    rows = query(db_url, RUN_ROWS)

    db.downgrade(db_url, "0021")
    assert "target_format_reason" not in columns(db_url, "runs")
    assert query(db_url, RUN_ROWS) == rows

    db.upgrade(db_url)
    assert query(db_url, RUN_ROWS) == rows
    assert query(db_url, reasons) == sorted([(before, None), (after, None)])  # lost, as said
