"""Runs: list, detail, layer table, raw steps, export."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from ampscope_server import runs
from ampscope_server.deps import RunDep, SessionDep, SettingsDep
from ampscope_server.schemas import (
    ErrorBody,
    ExportRead,
    Health,
    LayerInfo,
    RunDetail,
    RunSummary,
    StepsPage,
)

router = APIRouter(prefix="/api", tags=["runs"])
NOT_FOUND: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorBody, "description": "Unknown run"},
}


@router.get("/health")
def get_health() -> Health:
    return Health()


@router.get("/runs")
def list_runs(session: SessionDep, settings: SettingsDep) -> list[RunSummary]:
    return runs.list_summaries(session, settings.crash_timeout_s)


@router.get("/runs/{run_id}", responses=NOT_FOUND)
def get_run(run: RunDep, session: SessionDep, settings: SettingsDep) -> RunDetail:
    return runs.detail(session, run, settings.crash_timeout_s)


@router.get("/runs/{run_id}/layers", responses=NOT_FOUND)
def get_layers(run: RunDep, session: SessionDep) -> list[LayerInfo]:
    return runs.layers(session, run)


@router.get("/runs/{run_id}/steps", responses=NOT_FOUND)
def get_steps(
    run: RunDep,
    session: SessionDep,
    after_id: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> StepsPage:
    return runs.steps_page(session, run, after_id, limit)


@router.get("/runs/{run_id}/export", responses=NOT_FOUND)
def get_export(
    run: RunDep,
    session: SessionDep,
    settings: SettingsDep,
    format: Literal["json"] = "json",
) -> ExportRead:
    return runs.export(session, run, settings.crash_timeout_s)
