"""The server's ASGI app in this process, for tests where the process is not what is tested.

`create_app(Settings)` is what `ampscope serve` runs, lifespan included (engine, schema check, hub,
LISTEN/NOTIFY on Postgres, the alerts worker), with the security headers, the gate, the body cap
and the rate limit in front exactly as in production. Only uvicorn is missing: serving limits,
slow sockets, workers and kills are tested against a real `ampscope serve` (`servers.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from starlette.testclient import TestClient

from ampscope_server.app import create_app
from ampscope_server.config import Settings

BASE_URL = "http://127.0.0.1:8765"
"""What a browser on the same machine would call the server: a loopback Host the gate allows."""


@contextmanager
def app_client(db_url: str, headers: dict[str, str] | None = None,
               **settings: Any) -> Iterator[TestClient]:
    """A client of the app over the migrated database `db_url` (started and stopped around the
    block); `settings` are further `Settings` fields (`auth="required"`, `alerts=False`)."""
    app = create_app(Settings(db_url=db_url, **settings))
    # raise_server_exceptions=False: an unhandled error is the 500 a user would get, asserted
    # as such, not an exception raised through the test.
    with TestClient(app, base_url=BASE_URL, headers=headers,
                    raise_server_exceptions=False) as client:
        yield client
