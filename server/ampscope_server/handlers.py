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

from ampscope_server.errors import AmpscopeError, DatabaseUnavailable

logger = logging.getLogger("ampscope_server")


def ampscope_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AmpscopeError)
    return JSONResponse({"detail": exc.message}, status_code=exc.status_code,
                        headers=exc.headers)


def database_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """The database is down, unreachable or full: 503 with Retry-After, so clients (the hook
    honours it) come back later instead of treating the request as refused."""
    assert isinstance(exc, OperationalError | InterfaceError)
    logger.error("database error on %s %s: %s", request.method, request.url.path,
                 type(exc.orig).__name__)
    return ampscope_error_handler(request, DatabaseUnavailable(
        f"the database is unavailable ({type(exc.orig).__name__}); retry later"))


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
