"""One migrated database of each dialect per test module: the findings tests use fresh run ids,
so they can share it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.store import db
from tests.support.databases import migrated_database


@dataclass(frozen=True)
class Database:
    url: str
    sessions: sessionmaker[Session]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Database]:
    with migrated_database(request.param, tmp_path_factory.mktemp("findings")) as url:
        engine = db.make_engine(url)
        try:
            yield Database(url, db.make_session_factory(engine))
        finally:
            engine.dispose()
