"""Server-test fixtures: one real `ampscope serve` per dialect per test module, and sessions.

Tests that share a module's server isolate themselves by using fresh run ids (`wire.new_id()`).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server import db
from ampscope_server.live import Hub
from tests.support.databases import migrated_database
from tests.support.servers import ServerProcess


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def module_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A real server over a fresh database of each dialect, shared by one test module."""
    log_dir = tmp_path_factory.mktemp("server")
    with migrated_database(request.param, log_dir) as url:
        proc = ServerProcess(url, log_dir).start()
        try:
            yield proc
        finally:
            proc.stop()


@pytest.fixture
def api(module_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=module_server.url, timeout=30.0) as client:
        yield client


@pytest.fixture
def hub() -> Hub:
    return Hub()


@pytest.fixture
def sessions(migrated_url: str, hub: Hub) -> Iterator[sessionmaker[Session]]:
    """A session factory over a migrated database of each dialect, with a hub installed."""
    engine = db.make_engine(migrated_url)
    factory = db.make_session_factory(engine)
    hub.install(factory)
    try:
        yield factory
    finally:
        engine.dispose()
