"""Scaled-format what-ifs (wire v7 `formats`): a run's sampled steps with one step's full
layer x operand x recipe matrix, and one (layer, operand, recipe) over the steps."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ampscope_server.access.principal import Scope
from ampscope_server.api.deps import RunDep, SessionDep, requires
from ampscope_server.api.runs import NOT_FOUND
from ampscope_server.api.schemas import AUTH_RESPONSES, ErrorBody
from ampscope_server.charts import format_reads
from ampscope_server.charts.schemas import FormatOperand, FormatsRead, FormatTrendRead
from ampscope_server.store.format_packing import RECIPE_PATTERN

router = APIRouter(prefix="/api/runs/{run_id}/formats", tags=["charts"],
                   responses={**NOT_FOUND, **AUTH_RESPONSES,
                              422: {"model": ErrorBody, "description": "A bad parameter"}},
                   dependencies=[requires(Scope.READ)])

Limit = Annotated[int, Query(
    ge=2, le=format_reads.MAX_FORMAT_STEPS,
    description="The most sampled steps listed or charted: past it, that many spread evenly, "
                "the first and the last among them")]


@router.get("")
def get_formats(
    run: RunDep,
    session: SessionDep,
    step: Annotated[int | None, Query(
        ge=0, le=2**63 - 1,
        description="Show the sampled step at or before this one (default: the last)")] = None,
    limit: Limit = format_reads.DEFAULT_FORMAT_STEPS,
) -> FormatsRead:
    return format_reads.formats_read(session, run, step, limit)


@router.get("/trend")
def get_format_trend(
    run: RunDep,
    session: SessionDep,
    layer: Annotated[int, Query(ge=0, le=2**31 - 1, description="A layer table index")],
    operand: FormatOperand,
    recipe: Annotated[str, Query(pattern=RECIPE_PATTERN)],
    limit: Limit = format_reads.DEFAULT_FORMAT_STEPS,
) -> FormatTrendRead:
    """One layer's operand under one recipe over the sampled steps; a layer or recipe the run
    never recorded gives an empty series (`FormatTrendRead`)."""
    return format_reads.trend_read(session, run, layer, operand, recipe, limit)
