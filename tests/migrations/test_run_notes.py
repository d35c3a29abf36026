"""Revision 0021 (`runs.notes`) keeps every run both ways, on both dialects: the runs stored
before it get empty notes, and a downgrade drops the notes written (its docstring says so)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from ampscope_server.store import db
from tests.migrations.support import columns, query
from tests.server.wire import batch, new_id, record
from tests.support.ingest import ingest_into

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow

RUN_ROWS = "SELECT id, name, tags, status FROM runs ORDER BY id"



def _write_notes(url: str, run_id: str, notes: str) -> None:
    engine = db.make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE runs SET notes = :notes WHERE id = :id"),
                               {"notes": notes, "id": run_id})
    finally:
        engine.dispose()


def test_0021_adds_empty_notes_and_takes_them_back(db_url: str) -> None:
    db.upgrade(db_url)
    run_id = new_id()
    ingest_into(db_url, batch([record(0)], run_id=run_id, name="noted"))
    assert query(db_url, "SELECT notes FROM runs") == [("",)]  # the server default
    _write_notes(db_url, run_id, "lr too high <b>")
    rows = query(db_url, RUN_ROWS)

    db.downgrade(db_url, "0020")
    assert "notes" not in columns(db_url, "runs")
    assert query(db_url, RUN_ROWS) == rows

    db.upgrade(db_url)
    assert query(db_url, RUN_ROWS) == rows
    assert query(db_url, "SELECT id, notes FROM runs") == [(run_id, "")]  # lost, as documented
