"""The live socket's messages."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from ampscope_server.runs.schemas import RunStatus, RunSummary, StepLive


class LiveSteps(BaseModel):
    type: Literal["steps"] = "steps"
    run_id: str
    steps: list[StepLive]
    last_id: int


class LiveStatus(BaseModel):
    type: Literal["status"] = "status"
    status: RunStatus


class LiveRuns(BaseModel):
    """WS /api/runs/live: run summaries, merged by id. `full` = the snapshot: the first page of
    `GET /api/runs` (newest first) with the cursor of the next page, and apart the other runs
    stored as active; else the runs that changed."""

    type: Literal["runs"] = "runs"
    full: bool
    runs: list[RunSummary]
    next_cursor: str | None = None
    """With `full`: the cursor of `GET /api/runs` after the list's first page (null: no more)."""
    total: int | None = None
    """With `full`: how many runs the viewer has."""
    active: list[RunSummary] = []
    """With `full`: the other runs stored as active, beyond the first page (to update)."""
