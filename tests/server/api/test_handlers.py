"""The error handlers' answers to conditions made for real: a SQLite database that is full."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import ConnectionPoolEntry
from starlette.requests import Request

from ampscope_server.api.handlers import database_error_handler, is_disk_full


def _full(path: Path) -> OperationalError:
    """The error SQLite raises when its file cannot grow (SQLITE_FULL), capped at 8 pages."""
    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _cap(dbapi: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        dbapi.execute("PRAGMA max_page_count = 8")

    with engine.begin() as connection, pytest.raises(OperationalError) as raised:
        connection.execute(text("CREATE TABLE t (b BLOB)"))
        connection.execute(text("INSERT INTO t VALUES (zeroblob(1000000))"))
    engine.dispose()
    return raised.value


def test_a_full_disk_is_named_in_the_answer(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    error = _full(tmp_path / "full.db")
    assert is_disk_full(error)
    request = Request({"type": "http", "method": "POST", "path": "/api/ingest", "headers": [],
                       "query_string": b""})
    response = database_error_handler(request, error)
    assert (response.status_code, response.headers["retry-after"]) == (503, "5")
    assert json.loads(bytes(response.body)) == {"detail": (
        "the database is unavailable (disk full); free space on the server's database disk")}
    assert [r.getMessage() for r in caplog.records] == [
        "database error on POST /api/ingest: disk full"]


def test_another_database_error_keeps_its_class(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'missing' / 'x.db'}")
    with pytest.raises(OperationalError) as raised:
        engine.connect()
    assert not is_disk_full(raised.value)
    request = Request({"type": "http", "method": "GET", "path": "/api/runs", "headers": [],
                       "query_string": b""})
    assert json.loads(bytes(database_error_handler(request, raised.value).body)) == {
        "detail": "the database is unavailable (OperationalError); retry later"}
