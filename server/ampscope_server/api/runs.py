"""Runs: list, detail, layer table, raw steps, ranks, export (JSON, CSV, HTML report), delete
(admin)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from ampscope_server.access.principal import Scope
from ampscope_server.api.deps import (
    PrincipalDep,
    RunDep,
    SessionDep,
    SessionFactoryDep,
    SettingsDep,
    requires,
)
from ampscope_server.api.schemas import AUTH_RESPONSES, ErrorBody
from ampscope_server.export import report as export_report
from ampscope_server.export import streams as export_streams
from ampscope_server.export.schemas import ExportRead
from ampscope_server.ingest.wire import LayerInfo
from ampscope_server.runs import lifecycle, rank_reads
from ampscope_server.runs import listing as runs_list
from ampscope_server.runs import reads as runs
from ampscope_server.runs.listing import RunsQuery
from ampscope_server.runs.schemas import (
    DeletedRead,
    RanksSummaryRead,
    RunDetail,
    RunSummary,
    RunUpdate,
    StepsPage,
)
from ampscope_server.store.run_counters_repository import SortKey

router = APIRouter(prefix="/api", tags=["runs"], dependencies=[requires(Scope.READ)],
                   responses=AUTH_RESPONSES)
NOT_FOUND: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorBody, "description": "Unknown run"},
}
StepId = Annotated[int, Query(ge=0, le=2**63 - 1)]


LIST_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"description": "One page of runs. `Link: <…>; rel=\"next\"` gives the next page "
                         "(absent on the last); `X-Total-Count` the number of runs (unfiltered "
                         "only). See docs/contracts.md, Runs list.",
          "headers": {"Link": {"schema": {"type": "string"}},
                      "X-Total-Count": {"schema": {"type": "integer"}}}},
    422: {"model": ErrorBody, "description": "A bad cursor, sort or filter"},
}


@router.get("/runs", responses=LIST_RESPONSES)
def list_runs(
    request: Request,
    response: Response,
    session: SessionDep,
    factory: SessionFactoryDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=runs_list.MAX_LIMIT)] = runs_list.DEFAULT_LIMIT,
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
    sort: SortKey = "started",
    order: Literal["asc", "desc"] = "desc",
    q: Annotated[str, Query(max_length=runs_list.FILTER_MAX)] = "",
    regex: bool = False,
) -> list[RunSummary]:
    query = RunsQuery(sort=sort, descending=order == "desc", cursor=cursor, limit=limit, q=q,
                      regex=regex)
    page = runs.list_page(session, settings.crash_timeout_s, query, principal, factory)
    if page.next_cursor is not None:
        after = request.url.include_query_params(cursor=page.next_cursor)
        response.headers["Link"] = f'<{after.path}?{after.query}>; rel="next"'
    if page.total is not None:
        response.headers["X-Total-Count"] = str(page.total)
    return page.runs


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
    after_id: StepId = 0,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> StepsPage:
    return runs.steps_page(session, run, after_id, limit)


@router.get("/runs/{run_id}/ranks", responses=NOT_FOUND)
def get_ranks(run: RunDep, session: SessionDep) -> RanksSummaryRead:
    """The run's world size and the earliest step where some rank went non-finite."""
    return rank_reads.ranks_summary(session, run)


ExportFormat = Literal["json", "csv", "csv_wide", "html"]
EXPORT_RESPONSES: dict[int | str, dict[str, object]] = {
    **NOT_FOUND,
    200: {
        "description": "json: everything stored; csv: long format, streamed; csv_wide: one row "
                       "per step, a column per layer and statistic; html: the offline report "
                       "(all as attachments). See docs/contracts.md, Export.",
        "content": {"text/csv": {}, "text/html": {}},
    },
}


@router.get("/runs/{run_id}/export", responses=EXPORT_RESPONSES, response_model=ExportRead)
def get_export(
    run: RunDep,
    session: SessionDep,
    factory: SessionFactoryDep,
    settings: SettingsDep,
    format: ExportFormat = "json",
) -> ExportRead | Response:
    if format == "csv":
        # Streamed after this handler returns, so from a session of its own.
        return StreamingResponse(
            export_streams.csv_chunks(factory, run.id), media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": export_streams.content_disposition(run, "csv")},
        )
    if format == "csv_wide":
        return StreamingResponse(
            export_streams.wide_csv_chunks(factory, run.id), media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": export_streams.content_disposition(run, "wide.csv")},
        )
    if format == "html":
        text, policy = export_report.report_html_of(session, run, settings.crash_timeout_s)
        return HTMLResponse(text, headers={
            "Content-Disposition": export_streams.content_disposition(run, "html"),
            "Content-Security-Policy": f"{policy}; frame-ancestors 'none'",
        })
    # Streamed page by page (bounded memory however long the run), from a session of its own;
    # an attachment, as the CSV and the report: a browser saves it rather than opening it.
    return StreamingResponse(
        export_streams.json_chunks(factory, run.id, settings.crash_timeout_s),
        media_type="application/json",
        headers={"Content-Disposition": export_streams.content_disposition(run, "json")},
    )


@router.patch("/runs/{run_id}", responses={
    **NOT_FOUND, 422: {"model": ErrorBody, "description": "Notes over 4,000 characters, a tag "
                                                          "empty or over 200, over 32 tags"}},
    dependencies=[requires(Scope.ADMIN)])
def patch_run(run: RunDep, session: SessionDep, settings: SettingsDep,
              update: RunUpdate) -> RunDetail:
    """Edit the run's notes and tags (admin: a read token only reads; an ingest token names
    the tags when its run is created and cannot read runs back)."""
    return runs.annotate(session, run, update, settings.crash_timeout_s)


@router.delete("/runs/{run_id}", responses=NOT_FOUND, dependencies=[requires(Scope.ADMIN)])
def delete_run(run: RunDep, session: SessionDep) -> DeletedRead:
    """Delete the run and everything stored for it; its hook's next batch gets 410."""
    return lifecycle.delete_run(session, run)
