"""The server's ASGI app in this process, for tests where the process is not what is tested.

`create_app(Settings)` is what `ampscope serve` runs, lifespan included (engine, schema check, hub,
LISTEN/NOTIFY on Postgres, the alerts worker), with the security headers, the gate, the body cap
and the rate limit in front exactly as in production. Only uvicorn is missing: serving limits,
slow sockets, workers and kills are tested against a real `ampscope serve` (`servers.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from starlette.testclient import TestClient

from ampscope_server.api.app import create_app
from ampscope_server.config import Settings
from tests.support.team import make_tokens

BASE_URL = "http://127.0.0.1:8765"
"""What a browser on the same machine would call the server: a loopback Host the gate allows."""


WS_BASE_URL = BASE_URL.replace("http://", "ws://")
"""The same for a WebSocket: `TestClient.websocket_connect` calls a relative URL `testserver`,
a Host the gate refuses, so sockets are opened at `f"{WS_BASE_URL}{path}"`."""


@contextmanager
def app_client(db_url: str, headers: dict[str, str] | None = None,
               follow_redirects: bool = True, **settings: Any) -> Iterator[TestClient]:
    """A client of the app over the migrated database `db_url` (started and stopped around the
    block); `settings` are further `Settings` fields (`auth="required"`, `alerts=False`).
    `follow_redirects=False` answers a redirect as an httpx client does, with the 3xx itself."""
    app = create_app(Settings(db_url=db_url, **settings))
    # raise_server_exceptions=False: an unhandled error is the 500 a user would get, asserted
    # as such, not an exception raised through the test.
    with TestClient(app, base_url=BASE_URL, headers=headers, follow_redirects=follow_redirects,
                    raise_server_exceptions=False) as client:
        yield client


@dataclass
class TeamApp:
    """The app with `auth="required"` over a database holding `team.TOKENS`."""

    client: TestClient
    db_url: str
    tokens: dict[str, str]
    """The secret of each token of `TOKENS`, by label."""

    def bearer(self, token: str | None) -> dict[str, str]:
        """The Authorization header of token `token` (a label), or none for None."""
        return {} if token is None else {"Authorization": f"Bearer {self.tokens[token]}"}


@contextmanager
def team_app(db_url: str, **settings: Any) -> Iterator[TeamApp]:
    """`app_client` with auth required (redirects not followed) over the migrated database
    `db_url`, after `TOKENS` are made in it: team mode in process (`team.team_server` serves
    it for the tests whose subject is the process)."""
    tokens = make_tokens(db_url)
    with app_client(db_url, follow_redirects=False, auth="required", **settings) as client:
        yield TeamApp(client, db_url, tokens)
