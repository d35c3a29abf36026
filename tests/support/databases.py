"""Real databases for tests: a fresh SQLite file or a fresh Postgres database per use, empty or
already at the Alembic head.

Migrating costs more than most tests (20 revisions: ~1 s on SQLite, ~2 s on Postgres), so each
test process migrates one template per dialect, once, and every migrated database is a copy of it:
a file copy for SQLite, `CREATE DATABASE ... TEMPLATE` for Postgres (polar migrates once per
session too). The migration tests themselves still run every revision, on empty databases.

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
def postgres_database(template: str | None = None) -> Iterator[str]:
    """Create a database (empty, or a copy of `template`), yield its SQLAlchemy URL, drop it."""
    name = f"{DB_PREFIX}{uuid.uuid4().hex[:12]}"
    with _admin() as admin:
        copy = "" if template is None else f' TEMPLATE "{template}"'
        admin.execute(f'CREATE DATABASE "{name}"{copy}')
    try:
        yield postgres_url(name)
    finally:
        with _admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class _Templates:
    """This process's migrated templates, made on first use and dropped by `drop()`."""

    def __init__(self) -> None:
        self._folder: Path | None = None
        self._sqlite: Path | None = None
        self._postgres: str | None = None

    def sqlite(self) -> Path:
        if self._sqlite is None:
            from ampscope_server import db

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
            from ampscope_server import db

            name = f"{DB_PREFIX}template_{uuid.uuid4().hex[:12]}"
            with _admin() as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
            # A template must have no connection open while it is copied: `upgrade` disposes of
            # its engine before returning.
            db.upgrade(postgres_url(name))
            self._postgres = name
        return self._postgres

    def drop(self) -> None:
        if self._postgres is not None:
            with _admin() as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{self._postgres}" WITH (FORCE)')
            self._postgres = None
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
def migrated_database(dialect: Dialect, directory: Path) -> Iterator[str]:
    """A database of `dialect` at the Alembic head, dropped (Postgres) after the block."""
    if dialect == "sqlite":
        yield migrated_sqlite(directory)
    else:
        with postgres_database(template=TEMPLATES.postgres()) as url:
            yield url


@contextmanager
def empty_database(dialect: Dialect, directory: Path) -> Iterator[str]:
    """A database of `dialect` with no schema at all, for the migration tests."""
    if dialect == "sqlite":
        yield sqlite_url(directory)
    else:
        with postgres_database() as url:
            yield url
