"""Alembic environment: one history for SQLite and Postgres.

The URL comes from `config.attributes["db_url"]` (`ampscope db upgrade`), else from the ini's
`sqlalchemy.url` (developers' alembic.ini), else from Settings. Batch mode makes ALTERs work on
SQLite; the naming convention on the metadata names every constraint the same on both.
"""

from __future__ import annotations

from alembic import context

from ampscope_server.config import Settings
from ampscope_server.store.db import make_engine
from ampscope_server.store.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("db_url") or config.get_main_option("sqlalchemy.url")
    return str(url) if url else Settings().db_url


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
