"""Server-test fixtures: the app in this process per dialect per test module (`api`), one real
`ampscope serve` per dialect per module for the tests whose subject is the process
(`served_api`, over the root conftest's `module_server`), and sessions.

Tests that share a module's app or server isolate themselves by using fresh run ids
(`wire.new_id()`).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from ampscope_server.live.hub import Hub
from ampscope_server.store import db
from tests.support.app import app_client
from tests.support.databases import migrated_database
from tests.support.servers import ServerProcess


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def module_app(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestClient]:
    """The app (lifespan, gate and limits as served) over a fresh database of each dialect,
    shared by one test module. Redirects are not followed, as an httpx client does not."""
    with migrated_database(request.param, tmp_path_factory.mktemp("app")) as url, \
            app_client(url, follow_redirects=False) as client:
        yield client


@pytest.fixture
def api(module_app: TestClient) -> TestClient:
    """A client of the module's app, with no cookie left by an earlier test."""
    module_app.cookies.clear()
    return module_app


@pytest.fixture
def served_api(module_server: ServerProcess) -> Iterator[httpx.Client]:
    """An HTTP client of the module's real server."""
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
