"""The API's own bodies: errors, health, and the error responses every route declares."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class ErrorBody(BaseModel):
    detail: str


AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No credentials, or not valid ones"},
    403: {"model": ErrorBody, "description": "The token's scope does not allow this"},
}


class Health(BaseModel):
    status: Literal["ok"] = "ok"
