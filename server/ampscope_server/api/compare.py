"""Run comparison: runs aligned by step, first divergence, per-layer differences."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ampscope_server.access.principal import Scope
from ampscope_server.api.deps import PrincipalDep, SessionDep, SettingsDep, requires
from ampscope_server.api.schemas import AUTH_RESPONSES, ErrorBody
from ampscope_server.compare import reads as comparison_reads
from ampscope_server.compare.schemas import CompareRead

router = APIRouter(prefix="/api", tags=["compare"], dependencies=[requires(Scope.READ)],
                   responses=AUTH_RESPONSES)


@router.get("/compare", responses={
    404: {"model": ErrorBody, "description": "Unknown run"},
    422: {"model": ErrorBody, "description": "Not 2 to 8 distinct run ids, or a bad number"},
})
def get_compare(
    session: SessionDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    runs: Annotated[str, Query(description="Run ids separated by commas; the first is the "
                                           "reference", max_length=2000)],
    tolerance: Annotated[float, Query(ge=0, le=1000)] = 0.05,
    underflow_threshold: Annotated[float, Query(ge=0, le=1)] = 0.01,
) -> CompareRead:
    return comparison_reads.compare_runs(session, comparison_reads.parse_run_ids(runs), tolerance,
                                   underflow_threshold, settings.crash_timeout_s,
                                   principal)
