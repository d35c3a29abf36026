"""One migrated database of each dialect per test module: the findings tests use fresh run ids,
so they can share it (a migration per test would cost more than the tests themselves)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server import db
from tests.support.databases import postgres_database, sqlite_url


@dataclass(frozen=True)
class Database:
    url: str
    sessions: sessionmaker[Session]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Database]:
    def open_(url: str) -> Iterator[Database]:
        db.upgrade(url)
        engine = db.make_engine(url)
        try:
            yield Database(url, db.make_session_factory(engine))
        finally:
            engine.dispose()

    if request.param == "sqlite":
        yield from open_(sqlite_url(tmp_path_factory.mktemp("findings")))
    else:
        with postgres_database() as url:
            yield from open_(url)
