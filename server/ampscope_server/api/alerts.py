"""Alerts: rules and destinations (admin), the alert history (read), a test alert (admin).

    GET/POST       /api/alerts/rules            ?project=P
    PATCH/DELETE   /api/alerts/rules/{id}
    GET/POST       /api/alerts/destinations     ?project=P   (URLs and secrets never returned)
    DELETE         /api/alerts/destinations/{id}
    POST           /api/alerts/destinations/{id}/test        queue a test alert
    GET            /api/alerts                  ?project=P&before=ID&limit=N   newest first
    GET            /api/runs/{id}/alerts        ?before=ID&limit=N

A project-bound token sees and manages its own project's only (another's is 404).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ampscope_server.access.principal import Scope
from ampscope_server.alerts import settings as alert_settings
from ampscope_server.alerts.schemas import (
    AlertRead,
    AlertsPage,
    DestinationCreate,
    DestinationCreated,
    DestinationRead,
    RuleCreate,
    RuleRead,
    RuleUpdate,
)
from ampscope_server.alerts.settings import HISTORY_PAGE_MAX, HistoryQuery
from ampscope_server.api.deps import HexId, PrincipalDep, RunDep, SessionDep, requires
from ampscope_server.api.schemas import AUTH_RESPONSES, ErrorBody

router = APIRouter(prefix="/api", tags=["alerts"], responses=AUTH_RESPONSES)
ADMIN = [requires(Scope.ADMIN)]
READ = [requires(Scope.READ)]
ProjectQuery = Annotated[str | None, Query(min_length=1, max_length=200)]
Before = Annotated[int | None, Query(ge=1, le=2**63 - 1)]
Limit = Annotated[int, Query(ge=1, le=HISTORY_PAGE_MAX)]
Responses = dict[int | str, dict[str, object]]
NOT_FOUND: Responses = {404: {"model": ErrorBody, "description": "Unknown, or another project's"}}
INVALID: Responses = {422: {"model": ErrorBody, "description": "A body that is not valid"}}


@router.get("/alerts/rules", dependencies=ADMIN, responses=NOT_FOUND)
def list_rules(session: SessionDep, principal: PrincipalDep, project: ProjectQuery = None
               ) -> list[RuleRead]:
    return alert_settings.list_rules(session, principal, project)


@router.post("/alerts/rules", status_code=201, dependencies=ADMIN, responses=INVALID)
def create_rule(body: RuleCreate, session: SessionDep, principal: PrincipalDep) -> RuleRead:
    return alert_settings.create_rule(session, principal, body)


@router.patch("/alerts/rules/{rule_id}", dependencies=ADMIN, responses=NOT_FOUND | INVALID)
def update_rule(rule_id: HexId, body: RuleUpdate, session: SessionDep, principal: PrincipalDep
                ) -> RuleRead:
    return alert_settings.update_rule(session, principal, rule_id, body)


@router.delete("/alerts/rules/{rule_id}", dependencies=ADMIN, responses=NOT_FOUND)
def delete_rule(rule_id: HexId, session: SessionDep, principal: PrincipalDep) -> RuleRead:
    return alert_settings.delete_rule(session, principal, rule_id)


@router.get("/alerts/destinations", dependencies=ADMIN, responses=NOT_FOUND)
def list_destinations(session: SessionDep, principal: PrincipalDep,
                      project: ProjectQuery = None) -> list[DestinationRead]:
    return alert_settings.list_destinations(session, principal, project)


@router.post("/alerts/destinations", status_code=201, dependencies=ADMIN, responses=INVALID)
def create_destination(body: DestinationCreate, session: SessionDep, principal: PrincipalDep
                       ) -> DestinationCreated:
    return alert_settings.create_destination(session, principal, body)


@router.delete("/alerts/destinations/{destination_id}", dependencies=ADMIN,
               responses=NOT_FOUND)
def delete_destination(destination_id: HexId, session: SessionDep, principal: PrincipalDep
                       ) -> DestinationRead:
    return alert_settings.delete_destination(session, principal, destination_id)


@router.post("/alerts/destinations/{destination_id}/test", status_code=202,
             dependencies=ADMIN, responses=NOT_FOUND)
def test_destination(destination_id: HexId, session: SessionDep, principal: PrincipalDep
                     ) -> AlertRead:
    return alert_settings.send_test(session, principal, destination_id)


@router.get("/alerts", dependencies=READ, responses=NOT_FOUND)
def list_alerts(session: SessionDep, principal: PrincipalDep, project: ProjectQuery = None,
                before: Before = None, limit: Limit = 50) -> AlertsPage:
    return alert_settings.alert_history(session, principal, HistoryQuery(
        project=project, before=before, limit=limit))


@router.get("/runs/{run_id}/alerts", dependencies=READ, responses=NOT_FOUND)
def run_alerts(run: RunDep, session: SessionDep, principal: PrincipalDep, before: Before = None,
               limit: Limit = 50) -> AlertsPage:
    # The run is the viewer's to see (RunDep): its project needs no second check, which would
    # refuse the runs of a project whose name the alert settings cannot take (`a b`).
    return alert_settings.alert_history(session, principal, HistoryQuery(
        run_id=run.id, before=before, limit=limit))
