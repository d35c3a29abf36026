"""The error handlers: every error body is `{"detail": "<message>"}`.

Request validation errors are flattened into one message naming each failing field
(`records[3].layers.amax[0]: …`); the offending input is never echoed, since it may hold the
very NaN a JSON response cannot carry.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.requests import ClientDisconnect

from ampscope_server.errors import AmpscopeError, DatabaseUnavailable, error_response

logger = logging.getLogger("ampscope_server")


def ampscope_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AmpscopeError)
    return error_response(exc)


DISK_FULL_SQLSTATE = "53100"
"""Postgres' disk_full; SQLite says "database or disk is full" (SQLITE_FULL)."""


def is_disk_full(exc: OperationalError | InterfaceError) -> bool:
    return (getattr(exc.orig, "sqlstate", None) == DISK_FULL_SQLSTATE
            or "disk is full" in str(exc.orig))


def database_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """The database is down, unreachable or full: 503 with Retry-After, so clients (the hook
    honours it) come back later instead of treating the request as refused. A full disk is
    named as such, in the answer and the log: it needs an operator, not a retry."""
    assert isinstance(exc, OperationalError | InterfaceError)
    reason = "disk full" if is_disk_full(exc) else type(exc.orig).__name__
    logger.error("database error on %s %s: %s", request.method, request.url.path, reason)
    advice = ("free space on the server's database disk" if reason == "disk full"
              else "retry later")
    return ampscope_error_handler(request, DatabaseUnavailable(
        f"the database is unavailable ({reason}); {advice}"))


def client_gone_handler(request: Request, exc: Exception) -> JSONResponse:
    """The client left before its body arrived (a killed trainer, a dropped link): one line,
    not a traceback; nothing was stored, and nobody reads the answer."""
    assert isinstance(exc, ClientDisconnect)
    logger.info("client left during its request body: %s %s", request.method,
                request.url.path)
    return JSONResponse({"detail": "the client disconnected"}, status_code=400)


def internal_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Anything unforeseen: a JSON 500 like every other error (the traceback goes to the log)."""
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"detail": "internal server error"}, status_code=500)


def validation_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": format_errors(exc.errors())}, status_code=422)


def format_location(loc: Sequence[int | str]) -> str:
    """("body", "records", 3, "seq") → "records[3].seq"; ("query", "limit") → "query.limit".

    The body itself maps to "": a model-level error whose message names its own fields.
    """
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[1:]
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def format_errors(errors: Sequence[Any]) -> str:
    messages = []
    for error in errors:
        location = format_location(error.get("loc", ()))
        message = str(error.get("msg", "invalid"))
        if error.get("type") == "missing":
            message = "field required"
        elif error.get("type") == "extra_forbidden":
            message = "unknown field"
        messages.append(f"{location}: {message}" if location else message)
    return "; ".join(messages)
