"""Errors that become HTTP responses.

    AmpscopeError (500)
    ├── BadRequest (400) ── HostNotAllowed   a Host header outside the allow-list
    ├── Unauthorized (401)      no credentials, or ones that are not valid (any more)
    ├── Forbidden (403)         valid credentials without the scope, project or origin needed
    ├── NotFound (404) ── RunNotFound
    ├── Conflict (409) ── AmbiguousRun, LayerTableConflict, LayerTableMissing,
    │                     ModuleTableConflict, ModuleTableMissing
    ├── RequestTimeout (408)    a request body that stopped arriving
    ├── Gone (410) ── RunDeleted   ingest into a run that an admin deleted
    ├── PayloadTooLarge (413)   a body over the configured cap, refused while reading
    ├── UnsupportedMediaType (415)  an ingest body that is not application/json
    ├── InvalidPayload (422)    semantic checks pydantic cannot make alone, and the limits
    ├── RateLimited (429)       a token over its ingest rate (with Retry-After)
    └── ServiceUnavailable (503) ── SchemaNotCurrent, DatabaseUnavailable (with Retry-After)

Each carries its own status code (and headers); `error_response` renders every one as
`{"detail": message}`, for the API's handlers and for the middleware that answers before
any route.
"""

from __future__ import annotations

import math
from typing import ClassVar

from starlette.responses import JSONResponse


class AmpscopeError(Exception):
    status_code: ClassVar[int] = 500

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class BadRequest(AmpscopeError):
    status_code = 400


class HostNotAllowed(BadRequest):
    def __init__(self, host: str) -> None:
        super().__init__(f"the Host header {host!r} is not one this server answers to; add it "
                         "to AMPSCOPE_ALLOWED_HOSTS (or --allowed-hosts)")


class Unauthorized(AmpscopeError):
    status_code = 401

    def __init__(self, message: str) -> None:
        super().__init__(message, {"WWW-Authenticate": 'Bearer realm="ampscope"'})


class Forbidden(AmpscopeError):
    status_code = 403


class NotFound(AmpscopeError):
    status_code = 404


class RunNotFound(NotFound):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"run '{run_id}' not found")
        self.run_id = run_id


class Conflict(AmpscopeError):
    status_code = 409


class AmbiguousRun(Conflict):
    """A short id or a name (the CLI's) that more than one run matches."""


class LayerTableConflict(Conflict):
    """The batch's layer table differs from the one stored for the run."""


class LayerTableMissing(Conflict):
    """Layer statistics arrived for a run whose layer table the server does not have."""


class ModuleTableConflict(Conflict):
    """The batch's module table (activation source) differs from the one stored for the run."""


class ModuleTableMissing(Conflict):
    """Activation statistics arrived for a run whose module table the server does not have."""


class RequestTimeout(AmpscopeError):
    status_code = 408


class Gone(AmpscopeError):
    status_code = 410


class RunDeleted(Gone):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"run '{run_id}' was deleted by an admin; it takes no more data "
                         "(start a new run)")


class PayloadTooLarge(AmpscopeError):
    status_code = 413


class UnsupportedMediaType(AmpscopeError):
    status_code = 415


class InvalidPayload(AmpscopeError):
    status_code = 422


class RateLimited(AmpscopeError):
    status_code = 429

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, {"Retry-After": str(max(1, math.ceil(retry_after_s)))})


class ServiceUnavailable(AmpscopeError):
    status_code = 503

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message, {"Retry-After": str(retry_after_s)})


class SchemaNotCurrent(ServiceUnavailable):
    pass


class DatabaseMissing(NotFound):
    """A read-only command pointed at a SQLite file that does not exist."""


class DatabaseUnavailable(ServiceUnavailable):
    """The database refused or dropped the connection, or has no space left."""


def error_response(exc: AmpscopeError) -> JSONResponse:
    """The response of an error, also for the middleware that answers before any route."""
    return JSONResponse({"detail": exc.message}, status_code=exc.status_code,
                        headers=exc.headers)
