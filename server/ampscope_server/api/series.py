"""Chart data: downsampled series, scale events, layer-by-step heatmaps."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ampscope_server import charts
from ampscope_server.api.runs import NOT_FOUND
from ampscope_server.deps import RunDep, SessionDep, requires
from ampscope_server.principal import Scope
from ampscope_server.schemas import (
    AUTH_RESPONSES,
    EventsRead,
    HeatmapRead,
    HeatmapSource,
    HeatmapStat,
    SeriesName,
    SeriesRead,
)

router = APIRouter(prefix="/api/runs/{run_id}", tags=["charts"],
                   responses={**NOT_FOUND, **AUTH_RESPONSES}, dependencies=[requires(Scope.READ)])

StepBound = Annotated[int | None, Query(ge=0, le=2**63 - 1)]


@router.get("/series/{name}")
def get_series(
    run: RunDep,
    session: SessionDep,
    name: SeriesName,
    max_points: Annotated[int, Query(ge=1, le=100_000)] = 2000,
    start: StepBound = None,
    end: StepBound = None,
) -> SeriesRead:
    return charts.series_read(session, run, name, max_points, start, end)


@router.get("/events")
def get_events(run: RunDep, session: SessionDep, start: StepBound = None,
               end: StepBound = None) -> EventsRead:
    return charts.events_read(session, run, start, end)


@router.get("/layer-stats")
def get_layer_stats(
    run: RunDep,
    session: SessionDep,
    stat: HeatmapStat,
    start: StepBound = None,
    end: StepBound = None,
    source: HeatmapSource = "param",
    max_points: Annotated[int, Query(ge=1, le=10_000)] = charts.DEFAULT_HEATMAP_POINTS,
) -> HeatmapRead:
    return charts.heatmap_read(session, run, stat, start, end, source, max_points)
