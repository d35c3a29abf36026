from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.databases import migrated_sqlite
from tests.support.servers import ServerProcess


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server over a fresh SQLite file, NOT started: fault tests start, kill and restart it."""
    proc = ServerProcess(migrated_sqlite(tmp_path), tmp_path)
    try:
        yield proc
    finally:
        proc.kill()
