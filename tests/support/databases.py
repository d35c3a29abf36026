"""Real databases for tests: a fresh SQLite file or a fresh Postgres database per use, empty or
already at the Alembic head.

Migrating costs more than most tests (20 revisions: ~1 s on SQLite, ~2 s on Postgres), so each
test process migrates one template per dialect, once, and every migrated database is a copy of it:
a file copy for SQLite, `CREATE DATABASE ... TEMPLATE` for Postgres (polar migrates once per
session too). The migration tests themselves still run every revision, on empty databases.

A Postgres copy costs ~220 ms (the catalogs are copied through the WAL, with fsync), more than
most of the tests that use one, so a returned copy is emptied and kept for the next test of the
process instead of dropped: its connections ended, every row deleted, its sequences restarted,
which is the template's state again (3-6 ms). A copy whose schema or settings a test changed is
dropped, as before (`_Templates.recycle`).

Postgres is required, never optional: when it does not answer on 127.0.0.1:5432 the tests that
need it fail with a message saying how to start it (CI's `.ci/run` starts it first).
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import psycopg
from sqlalchemy import ClauseElement
from sqlalchemy.orm import Session

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_ADMIN_DSN = f"host={PG_HOST} port={PG_PORT} user=postgres dbname=postgres connect_timeout=5"
DB_PREFIX = "ampscope_test_"

Dialect = Literal["sqlite", "postgres"]


def sqlite_url(directory: Path) -> str:
    return f"sqlite:///{directory / 'ampscope.db'}"


def postgres_url(name: str) -> str:
    return f"postgresql+psycopg://postgres@{PG_HOST}:{PG_PORT}/{name}"


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(PG_ADMIN_DSN, autocommit=True)
    except psycopg.OperationalError as exc:
        raise RuntimeError(
            f"Postgres is not answering on {PG_HOST}:{PG_PORT} ({exc}). Start it with "
            "`pg_ctlcluster --skip-systemctl-redirect 15 main start`; these tests never skip."
        ) from exc


@contextmanager
def postgres_database() -> Iterator[str]:
    """Create an empty database, yield its SQLAlchemy URL, drop it."""
    name = f"{DB_PREFIX}{uuid.uuid4().hex[:12]}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield postgres_url(name)
    finally:
        with _admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_SHAPE = """
SELECT md5(coalesce(string_agg(item, ',' ORDER BY item), '')) FROM (
  SELECT concat_ws(':', c.relname, c.relkind, a.attname, a.atttypid, a.attnotnull) AS item
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
   WHERE n.nspname = 'public'
  UNION ALL
  SELECT concat_ws(':', conname, pg_get_constraintdef(oid)) FROM pg_constraint
   WHERE connamespace = 'public'::regnamespace
  UNION ALL
  SELECT concat_ws(':', 'db', datallowconn, datconnlimit) FROM pg_database
   WHERE datname = current_database()
  UNION ALL
  SELECT concat_ws(':', 'setting', array_to_string(setconfig, ',')) FROM pg_db_role_setting s
    JOIN pg_database d ON d.oid = s.setdatabase WHERE d.datname = current_database()
) shape
"""
"""One digest of a database's tables, columns, indexes, constraints, sequences and database-level
settings: a copy is recycled only while it equals the template's."""


def _connect(name: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(f"host={PG_HOST} port={PG_PORT} user=postgres dbname={name} "
                           "connect_timeout=5", autocommit=True)


class _Templates:
    """This process's migrated templates, made on first use, and the emptied Postgres copies
    kept for reuse; all dropped by `drop()`."""

    def __init__(self) -> None:
        self._folder: Path | None = None
        self._sqlite: Path | None = None
        self._postgres: str | None = None
        self._shape: object = None
        self._tables: list[str] = []
        self._spare: list[str] = []
        self._kept: set[str] = set()  # every copy recycled once: not fresh when handed out again

    def sqlite(self) -> Path:
        if self._sqlite is None:
            from ampscope_server.store import db

            self._folder = Path(tempfile.mkdtemp(prefix="ampscope-template-"))
            db.upgrade(sqlite_url(self._folder))
            path = self._folder / "ampscope.db"
            # The engine is gone and with it the WAL (checkpointed on the last close): the file
            # alone is the whole database.
            assert not path.with_name(path.name + "-wal").exists()
            self._sqlite = path
        return self._sqlite

    def postgres(self) -> str:
        if self._postgres is None:
            from ampscope_server.store import db

            name = f"{DB_PREFIX}template_{uuid.uuid4().hex[:12]}"
            with _admin() as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
            # A template must have no connection open while it is copied: `upgrade` disposes of
            # its engine before returning, and the connection below closes before any copy.
            db.upgrade(postgres_url(name))
            with _connect(name) as connection:
                self._shape = connection.execute(_SHAPE).fetchone()
                self._tables = [str(row[0]) for row in connection.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                    "AND tablename <> 'alembic_version' ORDER BY tablename")]
            self._postgres = name
        return self._postgres

    def postgres_copy(self, fresh: bool = False) -> str:
        """The name of a database in the template's state: a kept copy, or (none kept, or
        `fresh`) a new one."""
        if self._spare and not fresh:
            return self._spare.pop()
        name = f"{DB_PREFIX}{uuid.uuid4().hex[:12]}"
        with _admin() as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.postgres()}"')
        return name

    def recycle(self, name: str) -> None:
        """Give a copy back: emptied and kept when its shape is still the template's (every
        row deleted, the sequences restarted: the template has rows only in
        `alembic_version`), else dropped."""
        with _admin() as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
            try:
                with _connect(name) as connection:
                    if connection.execute(_SHAPE).fetchone() == self._shape:
                        with connection.transaction():
                            # Foreign keys unchecked: every table is emptied in this transaction.
                            connection.execute("SET LOCAL session_replication_role = replica")
                            for table in self._tables:
                                connection.execute(f'DELETE FROM "{table}"')
                            connection.execute(
                                "SELECT setval(format('%I.%I', schemaname, sequencename), "
                                "start_value, false) FROM pg_sequences "
                                "WHERE schemaname = 'public'")
                        self._spare.append(name)
                        self._kept.add(name)
                        return
            except psycopg.OperationalError:
                pass  # it refuses connections (a test's doing): dropped below
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def kept(self, name: str) -> bool:
        """Whether the copy `name` was given back and kept before (``postgres_copy``'s
        ``fresh`` never hands out such a one)."""
        return name in self._kept

    def drop(self) -> None:
        if self._postgres is not None:
            with _admin() as admin:
                for name in [*self._spare, self._postgres]:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            self._postgres, self._spare = None, []
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = self._sqlite = None


TEMPLATES = _Templates()


def migrated_sqlite(directory: Path) -> str:
    """A SQLite file at the Alembic head in `directory` (a copy of this process's template)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(TEMPLATES.sqlite(), directory / "ampscope.db")
    return sqlite_url(directory)


@contextmanager
def migrated_database(dialect: Dialect, directory: Path, fresh: bool = False) -> Iterator[str]:
    """A database of `dialect` at the Alembic head, given back (Postgres) after the block.

    `fresh`: a Postgres copy no test has used. A kept copy has no rows, but the planner's
    statistics and the dead rows of its last use are still there: a test of a query's plan
    needs a fresh one."""
    if dialect == "sqlite":
        yield migrated_sqlite(directory)
    else:
        name = TEMPLATES.postgres_copy(fresh)
        try:
            yield postgres_url(name)
        finally:
            TEMPLATES.recycle(name)


def query_plan(session: Session, statement: ClauseElement) -> list[str]:
    """The dialect's query plan of `statement`, a line per step. On Postgres only on a fresh
    copy (`migrated_database(fresh=True)`): a kept one holds the planner statistics and dead
    rows of its earlier tests, which can change the plan (a sort over another index instead of
    the partial one, seen in two files' full runs). Reading one there is refused, always, rather
    than failing now and then."""
    connection = session.connection()
    sql = str(statement.compile(connection, compile_kwargs={"literal_binds": True}))
    if connection.dialect.name == "postgresql":
        name = connection.engine.url.database
        if name is None or TEMPLATES.kept(name):
            raise AssertionError(f"query_plan on {name!r}, a kept copy: take "
                                 "migrated_database(dialect, directory, fresh=True)")
        # A 40-step table is a sequential scan at any cost model: take that off the table to
        # see whether the planner can prove the index's condition from the query's.
        connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
        return [row[0] for row in connection.exec_driver_sql(f"EXPLAIN {sql}")]
    return [row[3] for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")]


@contextmanager
def empty_database(dialect: Dialect, directory: Path) -> Iterator[str]:
    """A database of `dialect` with no schema at all, for the migration tests."""
    if dialect == "sqlite":
        yield sqlite_url(directory)
    else:
        with postgres_database() as url:
            yield url
