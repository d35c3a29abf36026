"""The tokens API's bodies."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TokenRead(BaseModel):
    """An API token as listed: never its secret."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    project: str | None
    """null: every project."""
    scope: Literal["read", "ingest", "admin"]
    created_at: float
    last_used_at: float | None
    revoked_at: float | None


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str | None = Field(max_length=200)
    """null: every project (an all-projects admin only)."""
    scope: Literal["read", "ingest", "admin"]
    name: str = Field("", max_length=200)


class TokenCreated(TokenRead):
    secret: str
    """Shown in this answer only; the server keeps its hash."""
