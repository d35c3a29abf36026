"""Findings: GET /api/runs/{id}/findings[?baseline=RUN] (docs/contracts.md, Findings), and the
exponent histograms behind the "what if x k" view: GET /api/runs/{id}/histogram[?step=N]."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ampscope_server.access.principal import Scope
from ampscope_server.api.deps import PrincipalDep, RunDep, SessionDep, requires
from ampscope_server.api.schemas import AUTH_RESPONSES, ErrorBody
from ampscope_server.findings import reads as finding_reads
from ampscope_server.findings.schemas import FindingsRead, HistogramView
from ampscope_server.runs import reads as runs

router = APIRouter(prefix="/api", tags=["findings"], dependencies=[requires(Scope.READ)],
                   responses=AUTH_RESPONSES)
RESPONSES: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorBody, "description": "Unknown run or baseline"},
    422: {"model": ErrorBody, "description": "The baseline is the run itself"},
}


@router.get("/runs/{run_id}/findings", responses=RESPONSES)
def get_findings(
    run: RunDep,
    session: SessionDep,
    principal: PrincipalDep,
    baseline: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
) -> FindingsRead:
    if baseline is not None and baseline != run.id:
        runs.load_run(session, baseline, principal)  # 404 unless the viewer may see it
    return finding_reads.findings_read(session, run, baseline)


@router.get("/runs/{run_id}/histogram", responses={
    404: {"model": ErrorBody, "description": "Unknown run, or no histogram at that step"}})
def get_histogram(
    run: RunDep,
    session: SessionDep,
    step: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
) -> HistogramView:
    return finding_reads.histogram_read(session, run, step)
