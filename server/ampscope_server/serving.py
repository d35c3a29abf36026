"""How `ampscope serve` runs the app under uvicorn: connection limits, timeouts, quiet logs.

- Half-sent requests cannot pile up: uvicorn closes idle keep-alive connections but waits for
  ever on one whose headers never finish (slowloris). `GuardedHttpToolsProtocol` closes a
  connection whose request headers are not complete `header_timeout_s` after it opened or
  after its previous response.
- `--workers N` runs N uvicorn processes on one socket (Postgres only: live updates cross them
  through LISTEN/NOTIFY, `live_pg`).
- `limit_concurrency`: beyond it, uvicorn answers 503 at once instead of queueing.
- No log line shows a secret: access and WebSocket lines lose their query string (a credential
  pasted into a URL is refused by the gate, but uvicorn writes the line anyway), and anything
  shaped like a token secret is masked in every record of every logger.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import re
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # uvicorn[standard]

from ampscope_server.config import Settings
from ampscope_server.tokens import SECRET_PREFIX

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


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """httptools' protocol, closing a connection whose request headers are not complete
    `header_timeout_s` after it opened or after its previous response. Module-level, so
    that uvicorn's worker processes can import it by name."""

    header_timeout_s: float = Settings().header_timeout_s
    _header_timer: asyncio.TimerHandle | None = None

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

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


PROTOCOL = "ampscope_server.serving:GuardedHttpToolsProtocol"
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


def run(settings: Settings, log_level: str, workers: int = 1) -> None:
    """Serve `create_app(settings)`; with several workers each process builds its own app from
    the environment, so `settings` is handed over as AMPSCOPE_* variables first."""
    import uvicorn

    from ampscope_server.app import create_app

    GuardedHttpToolsProtocol.header_timeout_s = settings.header_timeout_s
    options: dict[str, Any] = {
        "host": settings.host, "port": settings.port, "log_level": log_level,
        "access_log": log_level in ("info", "debug"), "log_config": log_config(log_level),
        "http": PROTOCOL, "limit_concurrency": settings.limit_concurrency,
        "timeout_keep_alive": int(settings.timeout_keep_alive_s),
    }
    if workers > 1:  # each worker process reads its Settings (and the protocol's) from here
        for name, value in settings.model_dump().items():
            os.environ[f"AMPSCOPE_{name.upper()}"] = str(value)
        uvicorn.run("ampscope_server.app:create_app", factory=True, workers=workers, **options)
    else:
        uvicorn.run(create_app(settings), **options)
