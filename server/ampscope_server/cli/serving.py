"""How `ampscope serve` runs the app under uvicorn: connection limits, timeouts, quiet logs.

- Half-sent requests cannot pile up: uvicorn closes idle keep-alive connections but waits for
  ever on one whose headers never finish (slowloris). `GuardedHttpToolsProtocol` closes a
  connection whose request headers are not complete `header_timeout_s` after it opened or
  after its previous response.
- `--workers N` runs N uvicorn processes on one socket (Postgres only: live updates cross them
  through LISTEN/NOTIFY, `live.postgres`).
- Idle sockets never hold a place a request needs (uvicorn's `limit_concurrency` counts idle
  keep-alive sockets, so 600 idle ones made every request 503): past `max_connections`, or
  `max_connections_per_client` from one address, a new connection closes the longest-idle
  one (between requests, or headers unfinished) and is answered 503 only when none is idle.
- No log line shows a secret: access and WebSocket lines lose their query string (a credential
  pasted into a URL is refused by the gate, but uvicorn writes the line anyway), and anything
  shaped like a token secret is masked in every record of every logger.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import re
import time
from collections.abc import Iterable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # uvicorn[standard]

from ampscope_server.access.tokens import SECRET_PREFIX
from ampscope_server.config import Settings

SECRET = re.compile(re.escape(SECRET_PREFIX) + r"[A-Za-z0-9_-]+")
WEBSOCKET_LINE = '"WebSocket %s"'
"""uvicorn's WebSocket lines (`uvicorn.error`): (client, path?query, [status])."""


class Redact(logging.Filter):
    """Secrets out of log records. Access records carry (client, method, path?query, version,
    status) and WebSocket records (client, path?query, …): their query is dropped. Any other
    record whose text holds a token-shaped secret is rewritten with it masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        at = 1 if isinstance(record.msg, str) and WEBSOCKET_LINE in record.msg else 2
        path = args[at] if isinstance(args, tuple) and len(args) > at else None
        if (record.name == "uvicorn.access" or at == 1) and isinstance(args, tuple) \
                and isinstance(path, str):
            record.args = (*args[:at], path.split("?", 1)[0], *args[at + 1:])
        text = record.getMessage()
        if SECRET_PREFIX in text:
            record.msg, record.args = SECRET.sub(f"{SECRET_PREFIX}…", text), ()
        return True


def busy_answer(detail: str) -> bytes:
    """A whole 503 response written straight to a connection the server will not serve."""
    body = json.dumps({"detail": detail}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body))


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """httptools' protocol, closing a connection whose request headers are not complete
    `header_timeout_s` after it opened or after its previous response, and admitting a new
    connection past the caps by closing the longest-idle one (see the module's docstring).
    Module-level, so that uvicorn's worker processes can import it by name."""

    header_timeout_s: float = Settings().header_timeout_s
    max_connections: int = Settings().max_connections
    max_per_client: int = Settings().max_connections_per_client
    _header_timer: asyncio.TimerHandle | None = None
    _idle_since: float = 0.0

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def serving(self) -> bool:
        """A request of this connection is in progress (its headers are complete)."""
        return self._header_timer is None and self.cycle is not None \
            and not self.cycle.response_complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._idle_since = time.monotonic()
        self._arm()
        self._admit()

    def _admit(self) -> None:
        """Room for this connection under both caps, made by closing idle ones, or a 503."""
        alive = [c for c in self.connections if c is not self and not c.transport.is_closing()]
        address = self.client[0] if self.client else None
        mine = [c for c in alive if _address(c) == address]
        if len(mine) >= self.max_per_client and not _close_idlest(mine):
            self._refuse(f"too many connections from {address} (AMPSCOPE_MAX_CONNECTIONS_PER_"
                         "CLIENT); close idle ones and retry")
        elif len(alive) >= self.max_connections and not _close_idlest(alive):
            self._refuse("the server is at its connection limit (AMPSCOPE_MAX_CONNECTIONS); "
                         "retry shortly")

    def _refuse(self, detail: str) -> None:
        self._disarm()
        self.transport.write(busy_answer(detail))
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        self._idle_since = time.monotonic()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def _address(connection: object) -> str | None:
    client = getattr(connection, "client", None)
    return client[0] if client else None


def _close_idlest(connections: Iterable[object]) -> bool:
    """Close the connection idle longest (HTTP only: a WebSocket is never idle); False if none
    is idle."""
    idle = [c for c in connections
            if isinstance(c, GuardedHttpToolsProtocol) and not c.serving()]
    if not idle:
        return False
    idlest = min(idle, key=lambda c: c._idle_since)
    idlest._disarm()
    idlest.transport.close()
    return True


PROTOCOL = "ampscope_server.cli.serving:GuardedHttpToolsProtocol"
"""By import path: uvicorn's worker processes import it themselves."""


def log_config(level: str = "info") -> dict[str, Any]:
    """uvicorn's logging config with `Redact` on both its handlers (access lines; WebSocket
    lines and errors), and the server's own loggers (`ampscope_server.*`: alerts, live listener,
    errors) on its stderr handler."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact"] = {"()": Redact}
    for handler in config["handlers"].values():
        handler["filters"] = ["redact"]
    config["loggers"]["ampscope_server"] = {"handlers": ["default"], "level": level.upper(),
                                            "propagate": False}
    return config


WORKER_HEALTHCHECK_S = 60
"""How long uvicorn's supervisor waits for a worker to answer its ping before it kills and
replaces it (uvicorn's default: 5). A worker answers from a thread that needs the GIL, so a
worker decoding a large body, or one still booting on a loaded host, stays silent for seconds
while healthy: at uvicorn's default a loaded host killed its booting workers in a loop and the
server never came up (docs/storage.md#the-workers-healthcheck)."""


def run(settings: Settings, log_level: str, workers: int = 1) -> None:
    """Serve `create_app(settings)`; with several workers each process builds its own app from
    the environment, so `settings` is handed over as AMPSCOPE_* variables first."""
    import uvicorn

    from ampscope_server.api.app import create_app

    GuardedHttpToolsProtocol.header_timeout_s = settings.header_timeout_s
    GuardedHttpToolsProtocol.max_connections = settings.max_connections
    GuardedHttpToolsProtocol.max_per_client = settings.max_connections_per_client
    options: dict[str, Any] = {
        "host": settings.host, "port": settings.port, "log_level": log_level,
        "access_log": log_level in ("info", "debug"), "log_config": log_config(log_level),
        "http": PROTOCOL,
        "timeout_keep_alive": int(settings.timeout_keep_alive_s),
    }
    if workers > 1:  # each worker process reads its Settings (and the protocol's) from here
        settings = settings.model_copy(update={"workers": workers})
        for name, value in settings.model_dump().items():
            os.environ[f"AMPSCOPE_{name.upper()}"] = str(value)
        uvicorn.run("ampscope_server.api.app:create_app", factory=True, workers=workers,
                    timeout_worker_healthcheck=WORKER_HEALTHCHECK_S, **options)
    else:
        uvicorn.run(create_app(settings), **options)
