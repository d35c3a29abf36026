"""Chart data: downsampled series, scale events (paged), skip rate, layer-by-step heatmaps,
per-optimizer skips and learning rates."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ampscope_server.access.principal import Scope
from ampscope_server.api.deps import RunDep, SessionDep, requires
from ampscope_server.api.runs import NOT_FOUND
from ampscope_server.api.schemas import AUTH_RESPONSES
from ampscope_server.charts import event_reads, optimizer_reads
from ampscope_server.charts import reads as chart_reads
from ampscope_server.charts.schemas import (
    EventsRead,
    HeatmapRead,
    HeatmapSource,
    HeatmapStat,
    OptimizersRead,
    SeriesName,
    SeriesRead,
    SkipRateRead,
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
    return chart_reads.series_read(session, run, name, max_points, start, end)


@router.get("/events")
def get_events(
    run: RunDep,
    session: SessionDep,
    start: StepBound = None,
    end: StepBound = None,
    limit: Annotated[int, Query(ge=1, le=event_reads.MAX_EVENT_STEPS)] = (
        event_reads.DEFAULT_EVENT_STEPS),
) -> EventsRead:
    """Events of at most `limit` event steps from `start`; `next_start` when more follow."""
    return event_reads.events_page(session, run, start, end, limit)


@router.get("/skip-rate")
def get_skip_rate(
    run: RunDep,
    session: SessionDep,
    max_points: Annotated[int, Query(ge=1, le=100_000)] = 2000,
    window: Annotated[int, Query(ge=1, le=1_000_000)] = 100,
    start: StepBound = None,
    end: StepBound = None,
) -> SkipRateRead:
    return event_reads.skip_rate_read(session, run, max_points, window, start, end)


@router.get("/layer-stats")
def get_layer_stats(
    run: RunDep,
    session: SessionDep,
    stat: HeatmapStat,
    start: StepBound = None,
    end: StepBound = None,
    source: HeatmapSource = "param",
    max_points: Annotated[int, Query(ge=1, le=10_000)] = chart_reads.DEFAULT_HEATMAP_POINTS,
    layers: Annotated[str | None, Query(
        description="Only these rows: table indices separated by commas (at most "
                    f"{chart_reads.MAX_ROWS}), in the order given", max_length=1000)] = None,
) -> HeatmapRead:
    rows = None if layers is None else chart_reads.parse_rows(layers)
    return chart_reads.heatmap_read(session, run, stat, start, end, source, max_points, rows)


@router.get("/optimizers")
def get_optimizers(
    run: RunDep,
    session: SessionDep,
    max_points: Annotated[int, Query(ge=1, le=10_000)] = 2000,
    start: StepBound = None,
    end: StepBound = None,
) -> OptimizersRead:
    """Each watched optimizer's skipped steps and its parameter groups' lr over the steps (wire
    v4 `optimizers`; empty for a run that sent none)."""
    return optimizer_reads.optimizers_read(session, run, max_points, start, end)
