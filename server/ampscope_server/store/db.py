"""Engine and sessions; the schema-at-head check.

SQLite gets WAL, a busy timeout and foreign keys on every connection; Postgres connections run
with JIT off. The per-request session commits once when the handler returns and rolls back when
it raises; services never commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.errors import DatabaseMissing, SchemaNotCurrent

SQLITE_BUSY_TIMEOUT_MS = 30_000
POSTGRES_POOL_SIZE = 16
"""Connections a process keeps open to Postgres (and as many again at a burst). SQLAlchemy's
default, 5, is fewer than the concurrent ingests of a team's jobs: every request past the fifth
opened a connection and closed it after, each time a new backend process with cold catalog
caches (docs/storage.md#postgres-statements-arrays-copy-no-jit)."""


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def safe_url(url: str) -> str:
    """The URL with any password masked, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


def require_existing(url: str) -> None:
    """For commands that only read: a SQLite file that is not there is an error, never created
    (with its folders) as connecting would."""
    parsed = make_url(url)
    if (parsed.get_backend_name() == "sqlite" and parsed.database
            and parsed.database != ":memory:" and not Path(parsed.database).is_file()):
        raise DatabaseMissing(f"no SQLite database at {parsed.database} (`ampscope serve` or "
                              "`ampscope db upgrade` creates one)")


def make_engine(url: str) -> Engine:
    """Create the engine; for a SQLite file, create its folder first."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        # JIT compiles a query when its estimated cost is high, which a join over a long run's
        # layer_stats is (before ANALYZE above all), and compiling took several times the chart
        # query itself (docs/storage.md#postgres-statements-arrays-copy-no-jit). Every query
        # here reads a bounded number of rows: JIT never pays.
        given = parsed.query.get("options")  # the URL's own server options are kept
        options = " ".join([*([given] if isinstance(given, str) else given or ()), "-c jit=off"])
        return create_engine(url, pool_pre_ping=True, pool_size=POSTGRES_POOL_SIZE,
                             max_overflow=POSTGRES_POOL_SIZE, connect_args={"options": options})
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False})
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: responses are serialised after the commit.
    return sessionmaker(engine, expire_on_commit=False)


def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit when the body succeeds, roll back when it raises."""
    with factory() as session:
        try:
            yield session
        except BaseException:
            session.rollback()
            raise
        session.commit()


@contextmanager
def unit_of_work(factory: sessionmaker[Session]) -> Iterator[Session]:
    """`session_scope` as a `with` block, for work outside a request's dependencies."""
    yield from session_scope(factory)


# --- migrations ---------------------------------------------------------------------------------

def alembic_config(url: str) -> Config:
    """An Alembic config for the migrations shipped in the package `ampscope_server._migrations`."""
    config = Config()
    config.set_main_option("script_location", str(files("ampscope_server._migrations")))
    # An attribute, not an ini option: a URL may hold '%', which configparser would interpolate.
    config.attributes["db_url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def verify_schema(engine: Engine) -> None:
    """Fail fast unless the database is at the Alembic head."""
    head = head_revision()
    with engine.connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    if current != head:
        url = safe_url(engine.url.render_as_string(hide_password=False))
        state = "has no ampscope schema" if current is None else f"is at revision {current}"
        raise SchemaNotCurrent(
            f"the database {url} {state}, but this server needs revision {head}; "
            f"run `ampscope db upgrade --db {url}`"
        )
