"""The recycled Postgres copies (`tests.support.databases`): each use starts in the template's
state, whatever the last one left, a copy a test changed the shape of is never handed out
again, and no query plan is read on a kept one."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Connection, create_engine, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from ampscope_server.store.models import Run
from tests.server.wire import batch, new_id, record
from tests.support.databases import PG_ADMIN_DSN, TEMPLATES, migrated_database, query_plan
from tests.support.ingest import ingest_into

pytestmark = pytest.mark.postgres


def _state(url: str) -> tuple[int, int, list[tuple[str, object]], str]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return (connection.execute(text("SELECT count(*) FROM runs")).scalar_one(),
                    connection.execute(text("SELECT count(*) FROM alembic_version")).scalar_one(),
                    [(str(name), value) for name, value in connection.execute(text(
                        "SELECT sequencename, last_value FROM pg_sequences ORDER BY 1"))],
                    str(connection.execute(text("SELECT version_num FROM alembic_version"))
                        .scalar_one()))
    finally:
        engine.dispose()


def _fill(url: str) -> Connection:
    """A run with steps and per-layer rows (parents and children), every sequence moved on, and
    a connection left open."""
    ingest_into(url, batch([record(seq) for seq in range(3)], run_id=new_id()))
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text("SELECT setval(sequencename::regclass, 77) FROM pg_sequences"))
    return engine.connect()  # the copy is given back with it open


def test_a_reused_copy_is_the_templates_state_again(tmp_path: Path) -> None:
    with migrated_database("postgres", tmp_path) as url:
        fresh = _state(url)
        assert fresh[0] == 0 and fresh[1] == 1 and all(value is None for _, value in fresh[2])
        left_open = _fill(url)
        assert _state(url)[0] == 1
        first = url
    with migrated_database("postgres", tmp_path) as url:
        assert url == first  # the same database, kept
        assert _state(url) == fresh
    with pytest.raises(OperationalError):  # ended when the copy was given back
        left_open.execute(text("SELECT 1"))
    left_open.invalidate()
    left_open.engine.dispose()


def test_a_copy_whose_shape_changed_is_dropped(tmp_path: Path) -> None:
    with migrated_database("postgres", tmp_path) as url:
        engine = create_engine(url)
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE runs ADD COLUMN extra integer"))
        engine.dispose()
        changed = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s",
                             (changed,)).fetchone() == (0,)
    with migrated_database("postgres", tmp_path) as url:
        assert url.rsplit("/", 1)[1] != changed
        assert _state(url)[0] == 0


def test_a_copy_that_refuses_connections_is_dropped(tmp_path: Path) -> None:
    with migrated_database("postgres", tmp_path) as url:
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s",
                             (name,)).fetchone() == (0,)
    assert TEMPLATES.postgres()  # the template itself is untouched


def test_a_query_plan_is_read_only_on_a_fresh_copy(tmp_path: Path) -> None:
    """`query_plan` refuses a kept copy, whose planner statistics and dead rows are an earlier
    test's, every time: a plan test on one fails at once, not now and then."""
    statement = select(Run.id).where(Run.project == "p")
    with migrated_database("postgres", tmp_path) as url:
        first = url
    with migrated_database("postgres", tmp_path) as url:
        assert url == first  # kept
        engine = create_engine(url)
        try:
            with Session(engine) as session, session.begin(), pytest.raises(
                    AssertionError, match="a kept copy: take migrated_database"):
                query_plan(session, statement)
        finally:
            engine.dispose()
    with migrated_database("postgres", tmp_path, fresh=True) as url:
        assert url != first and not TEMPLATES.kept(url.rsplit("/", 1)[1])
        engine = create_engine(url)
        try:
            with Session(engine) as session, session.begin():
                assert any("runs" in line for line in query_plan(session, statement))
        finally:
            engine.dispose()
