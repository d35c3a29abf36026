"""Errors that become HTTP responses.

    AmpscopeError (500)
    ├── NotFound (404) ── RunNotFound
    ├── Conflict (409) ── LayerTableConflict, LayerTableMissing,
    │                     ModuleTableConflict, ModuleTableMissing
    ├── InvalidPayload (422)    semantic checks pydantic cannot make alone
    └── SchemaNotCurrent (503)  the database is not at the Alembic head

Each carries its own status code; `app.py` installs one handler that renders
`{"detail": message}`.
"""

from __future__ import annotations

from typing import ClassVar


class AmpscopeError(Exception):
    status_code: ClassVar[int] = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(AmpscopeError):
    status_code = 404


class RunNotFound(NotFound):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"run '{run_id}' not found")
        self.run_id = run_id


class Conflict(AmpscopeError):
    status_code = 409


class LayerTableConflict(Conflict):
    """The batch's layer table differs from the one stored for the run."""


class LayerTableMissing(Conflict):
    """Layer statistics arrived for a run whose layer table the server does not have."""


class ModuleTableConflict(Conflict):
    """The batch's module table (activation source) differs from the one stored for the run."""


class ModuleTableMissing(Conflict):
    """Activation statistics arrived for a run whose module table the server does not have."""


class InvalidPayload(AmpscopeError):
    status_code = 422


class SchemaNotCurrent(AmpscopeError):
    status_code = 503

