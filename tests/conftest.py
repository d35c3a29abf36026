from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.databases import postgres_database, sqlite_url
from tests.support.servers import ServerProcess


@pytest.fixture(autouse=True, scope="session")
def _spool_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Hooks built without `spool_dir` spool here, never into the user's ~/.cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("AMPSCOPE_SPOOL_DIR", str(tmp_path_factory.mktemp("spool")))
    yield
    mp.undo()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each dialect; the schema is the server's (migrations) to create."""
    if request.param == "sqlite":
        yield sqlite_url(tmp_path)
    else:
        with postgres_database() as url:
            yield url


@pytest.fixture
def postgres_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    """A real uvicorn server over `db_url`, on a free 127.0.0.1 port."""
    proc = ServerProcess(db_url, tmp_path).start()
    try:
        yield proc
    finally:
        proc.stop()
