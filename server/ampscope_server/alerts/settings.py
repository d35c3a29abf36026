"""Managing alerts (the API's and `ampscope alerts`' service): rules and destinations per
project, within what the asking principal administers, the default rules, the history.

A principal bound to one project manages that project's rules and destinations only; another
project's are "not found" to it (as runs are), and it cannot make them for another project.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.orm import Session

from ampscope_server.access.principal import Principal
from ampscope_server.access.tokens import PROJECT_PATTERN, check_project_name
from ampscope_server.alerts.rules import DEFAULT_COOLDOWN_S, STALL_FACTOR, STALL_MIN_S
from ampscope_server.alerts.schemas import (
    AlertRead,
    AlertsPage,
    DeliveryRead,
    DestinationCreate,
    DestinationCreated,
    DestinationRead,
    RuleCreate,
    RuleRead,
    RuleUpdate,
)
from ampscope_server.errors import Forbidden, InvalidPayload, NotFound
from ampscope_server.store import access_repository, alerts_repository
from ampscope_server.store.models import Alert, AlertDestination, AlertRule

# The rules a new project starts with, each of which can be turned off (DESIGN.md §7; issue:
# "errors, crashed, stalled"): (builtin, name, kind, params, severity).
DEFAULT_RULES: tuple[tuple[str, str, str, dict[str, Any], str], ...] = (
    ("errors", "Any error finding", "finding", {"finding_kind": None}, "error"),
    ("crashed", "Run crashed", "state", {"state": "crashed"}, "error"),
    ("stalled", "Run stalled", "state",
     {"state": "stalled", "stall_factor": STALL_FACTOR, "stall_min_s": STALL_MIN_S}, "warning"),
)
HISTORY_PAGE_MAX = 200


def seed_defaults(session: Session, project: str, now: float) -> None:
    """Give `project` the default rules, once in its life."""
    if not alerts_repository.claim_defaults(session, project, now):
        return
    for builtin, name, kind, params, severity in DEFAULT_RULES:
        alerts_repository.add(session, AlertRule(
            id=secrets.token_hex(8), project=project, name=name, kind=kind, params=dict(params),
            severity=severity, cooldown_s=DEFAULT_COOLDOWN_S, enabled=True, builtin=builtin,
            created_at=now))


def _scope(viewer: Principal, project: str | None) -> list[str] | None:
    """The projects a listing covers: the one asked for (if the viewer may), else the viewer's."""
    if project is not None:
        if not viewer.sees(project) or not PROJECT_PATTERN.match(project):
            raise NotFound(f"project '{project}' not found")
        return [project]
    return None if viewer.project is None else [viewer.project]


def _own_project(session: Session, viewer: Principal, project: str, now: float) -> str:
    check_project_name(project)
    if not viewer.sees(project):
        raise Forbidden(f"this admin token manages project '{viewer.project}' only")
    access_repository.ensure_project(session, project, now)
    seed_defaults(session, project, now)
    return project


# --- rules ---------------------------------------------------------------------------------------

def rule_read(rule: AlertRule) -> RuleRead:
    return RuleRead.model_validate({
        "id": rule.id, "project": rule.project, "name": rule.name,
        "condition": {"kind": rule.kind, **rule.params}, "severity": rule.severity,
        "cooldown_s": rule.cooldown_s, "enabled": rule.enabled, "builtin": rule.builtin,
        "created_at": rule.created_at})


def list_rules(session: Session, viewer: Principal, project: str | None = None
               ) -> list[RuleRead]:
    projects = _scope(viewer, project)
    now = time.time()
    for name in projects or ():
        if access_repository.project_exists(session, name):
            seed_defaults(session, name, now)
    return [rule_read(r) for r in alerts_repository.rules(session, projects)]


def create_rule(session: Session, viewer: Principal, body: RuleCreate,
                now: float | None = None) -> RuleRead:
    now = time.time() if now is None else now
    project = _own_project(session, viewer, body.project, now)
    params = body.condition.model_dump(exclude={"kind"})
    rule = AlertRule(id=secrets.token_hex(8), project=project, name=body.name,
                     kind=body.condition.kind, params=params, severity=body.severity,
                     cooldown_s=body.cooldown_s, enabled=body.enabled, builtin=None,
                     created_at=now)
    alerts_repository.add(session, rule)
    return rule_read(rule)


def _rule(session: Session, viewer: Principal, rule_id: str) -> AlertRule:
    rule = alerts_repository.get_rule(session, rule_id)
    if rule is None or not viewer.sees(rule.project):
        raise NotFound(f"alert rule '{rule_id}' not found")
    return rule


def update_rule(session: Session, viewer: Principal, rule_id: str, body: RuleUpdate
                ) -> RuleRead:
    rule = _rule(session, viewer, rule_id)
    for field, value in body.model_dump(exclude_none=True).items():
        setattr(rule, field, value)
    session.flush()
    return rule_read(rule)


def delete_rule(session: Session, viewer: Principal, rule_id: str) -> RuleRead:
    """Deletes the rule; its alerts stay in the history (without their rule)."""
    read = rule_read(_rule(session, viewer, rule_id))
    alerts_repository.delete_rule(session, rule_id)
    return read


# --- destinations --------------------------------------------------------------------------------

def masked_target(url: str) -> str:
    """The URL without what may be secret (path, query, credentials)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/…"


def check_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        raise InvalidPayload(f"url: not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidPayload("url: must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise InvalidPayload("url: credentials in the URL are not accepted")
    if any(ord(c) < 33 for c in url):
        raise InvalidPayload("url: must not contain spaces or control characters")
    return url


def destination_read(dest: AlertDestination) -> DestinationRead:
    return DestinationRead(
        id=dest.id, project=dest.project, name=dest.name, kind=dest.kind,  # type: ignore[arg-type]
        target=masked_target(dest.url), min_severity=dest.min_severity,  # type: ignore[arg-type]
        signed=dest.signing_secret is not None, enabled=dest.enabled, created_at=dest.created_at)


def list_destinations(session: Session, viewer: Principal, project: str | None = None
                      ) -> list[DestinationRead]:
    return [destination_read(d)
            for d in alerts_repository.destinations(session, _scope(viewer, project))]


def create_destination(session: Session, viewer: Principal, body: DestinationCreate,
                       now: float | None = None) -> DestinationCreated:
    now = time.time() if now is None else now
    project = _own_project(session, viewer, body.project, now)
    if body.kind != "webhook" and body.signing_secret is not None:
        raise InvalidPayload("signing_secret: only a generic webhook signs its requests")
    secret = body.signing_secret
    if body.kind == "webhook" and secret is None:
        secret = secrets.token_urlsafe(32)
    dest = AlertDestination(
        id=secrets.token_hex(8), project=project, name=body.name, kind=body.kind,
        url=check_url(body.url), signing_secret=secret, min_severity=body.min_severity,
        enabled=body.enabled, created_at=now)
    alerts_repository.add(session, dest)
    return DestinationCreated(**destination_read(dest).model_dump(), signing_secret=secret)


def _destination(session: Session, viewer: Principal, destination_id: str) -> AlertDestination:
    dest = alerts_repository.get_destination(session, destination_id)
    if dest is None or not viewer.sees(dest.project):
        raise NotFound(f"alert destination '{destination_id}' not found")
    return dest


def delete_destination(session: Session, viewer: Principal, destination_id: str
                       ) -> DestinationRead:
    """Deletes the destination and its pending deliveries (the alerts stay in the history)."""
    read = destination_read(_destination(session, viewer, destination_id))
    alerts_repository.delete_destination(session, destination_id)
    return read


def send_test(session: Session, viewer: Principal, destination_id: str,
              now: float | None = None) -> AlertRead:
    """Queue a test alert to one destination (the deliverer sends it, as any other)."""
    now = time.time() if now is None else now
    dest = _destination(session, viewer, destination_id)
    alert = Alert(
        dedup_key=f"test:{dest.id}:{secrets.token_hex(8)}", rule_id=None, run_id=None,
        project=dest.project, event="test", severity="info",
        title=f"Test alert from ampscope to “{dest.name}”",
        explanation="If you read this, alerts of project "
                    f"{dest.project} reach this destination.",
        recommendation="Nothing to do.", step_start=None, step_end=None, created_at=now)
    alerts_repository.add_alert(session, alert, [dest.id])
    return history_of(session, [alert])[0]


# --- history -------------------------------------------------------------------------------------

def history_of(session: Session, alerts: Sequence[Alert]) -> list[AlertRead]:
    deliveries: dict[int, list[DeliveryRead]] = {}
    for delivery, name in alerts_repository.deliveries_of(session, [a.id for a in alerts]):
        deliveries.setdefault(delivery.alert_id, []).append(DeliveryRead(
            destination_id=delivery.destination_id, destination=name,
            status=delivery.status,  # type: ignore[arg-type]
            attempts=delivery.attempts, next_attempt_at=delivery.next_attempt_at,
            last_error=delivery.last_error, delivered_at=delivery.delivered_at))
    return [AlertRead(
        id=a.id, event=a.event, severity=a.severity,  # type: ignore[arg-type]
        project=a.project, run_id=a.run_id, rule_id=a.rule_id, title=a.title,
        explanation=a.explanation, recommendation=a.recommendation, step_start=a.step_start,
        step_end=a.step_end, created_at=a.created_at, deliveries=deliveries.get(a.id, []))
        for a in alerts]


@dataclass(frozen=True)
class HistoryQuery:
    project: str | None = None
    run_id: str | None = None
    before: int | None = None
    limit: int = 50


def alert_history(session: Session, viewer: Principal, query: HistoryQuery) -> AlertsPage:
    """Alerts newest first, of the viewer's projects (or one project, or one run)."""
    if not 1 <= query.limit <= HISTORY_PAGE_MAX:
        raise InvalidPayload(f"limit: 1 to {HISTORY_PAGE_MAX}")
    found = alerts_repository.alerts(
        session, projects=_scope(viewer, query.project), run_id=query.run_id,
        before_id=query.before, limit=query.limit + 1)
    page = list(found[: query.limit])
    return AlertsPage(alerts=history_of(session, page),
                      next_before=page[-1].id if len(found) > query.limit else None)
