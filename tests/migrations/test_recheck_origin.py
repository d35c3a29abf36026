"""Revision 0023 (`step_rechecks.origin`, #30) keeps every re-check both ways, on both
dialects: a re-check whose client sent no origin has none (null), and a downgrade drops the
origins the hooks sent (its docstring says so), the re-checks staying."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ampscope_server.store import db
from tests.migrations.support import columns, query
from tests.server.wire import batch_v2, new_id, record_v2
from tests.support.ingest import ingest_into

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow

RECHECKS = ("SELECT s.run_key, s.step, r.status, r.loss_class FROM step_rechecks r "
            "JOIN steps s ON s.id = r.step_id ORDER BY s.run_key, s.step")
ORIGIN = {"module": "encoder.0", "input_finite": True, "format": "fp16"}



def _skipped(recheck: dict[str, Any]) -> dict[str, Any]:
    return record_v2(0, recheck=recheck, swallowed=None, found_inf=True, skipped=True,
                     scale_after=32768.0, loss="inf")


def _origins(url: str) -> list[Any]:
    return [row[0] for row in query(url, "SELECT origin FROM step_rechecks ORDER BY step_id")]


def test_0023_adds_the_origin_and_takes_it_back(db_url: str) -> None:
    db.upgrade(db_url)
    old: dict[str, Any] = {"status": "persisted", "loss": "inf", "layers": [], "detail": None}
    before = dict(batch_v2([_skipped(old)], run_id=new_id()), schema_version=3)
    ingest_into(db_url, before)
    after = dict(batch_v2([_skipped({**old, "origin": ORIGIN})], run_id=new_id()),
                 schema_version=6)
    ingest_into(db_url, after)
    origins = _origins(db_url)
    assert [None if o is None else db_json(o) for o in origins] == [None, ORIGIN]
    rows = query(db_url, RECHECKS)

    db.downgrade(db_url, "0022")
    assert "origin" not in columns(db_url, "step_rechecks")
    assert query(db_url, RECHECKS) == rows

    db.upgrade(db_url)
    assert query(db_url, RECHECKS) == rows
    assert _origins(db_url) == [None, None]  # lost, as said


def db_json(value: Any) -> Any:
    """A JSON column read by raw SQL: text on SQLite, already decoded on Postgres."""
    return json.loads(value) if isinstance(value, str) else value
