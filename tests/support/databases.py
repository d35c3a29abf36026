"""Real databases for tests: a fresh SQLite file or a fresh Postgres database per use.

Postgres is required, never optional: when it does not answer on 127.0.0.1:5432 the tests that
need it fail with a message saying how to start it (CI's `.ci/run` starts it first).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_ADMIN_DSN = f"host={PG_HOST} port={PG_PORT} user=postgres dbname=postgres connect_timeout=5"


def sqlite_url(directory: Path) -> str:
    return f"sqlite:///{directory / 'ampscope.db'}"


@contextmanager
def postgres_database() -> Iterator[str]:
    """Create an empty database, yield its SQLAlchemy URL, drop it afterwards."""
    name = f"ampscope_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(PG_ADMIN_DSN, autocommit=True)
    except psycopg.OperationalError as exc:
        raise RuntimeError(
            f"Postgres is not answering on {PG_HOST}:{PG_PORT} ({exc}). Start it with "
            "`pg_ctlcluster --skip-systemctl-redirect 15 main start`; these tests never skip."
        ) from exc
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
