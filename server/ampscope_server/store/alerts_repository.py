"""Every SQL statement of alerting: rules, destinations, episodes, the alert history, the outbox.

Functions take a Session and never commit (the caller's unit of work does).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TypeVar

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session

from ampscope_server.store.models import (
    Alert,
    AlertDefaults,
    AlertDelivery,
    AlertDestination,
    AlertEpisode,
    AlertRule,
    Run,
    Step,
)
from ampscope_server.store.sql_support import dialect_insert, run_key

Owned = TypeVar("Owned", AlertRule, AlertDestination)
"""A project's rule or destination: both have project, enabled, created_at and id."""


def _in_projects(column: object, projects: Collection[str] | None) -> object:
    return True if projects is None else column.in_(list(projects))  # type: ignore[attr-defined]


# --- defaults ------------------------------------------------------------------------------------

def claim_defaults(session: Session, project: str, now: float) -> bool:
    """Mark `project` as given its default rules; False when it already was. Looked up first:
    the alert worker asks every second, and a write each time would take SQLite's write lock."""
    if session.get(AlertDefaults, project) is not None:
        return False
    # RETURNING, not rowcount: psycopg's rowcount does not tell a skipped conflict apart.
    made = session.execute(
        dialect_insert(session, AlertDefaults).values(project=project, seeded_at=now)
        .on_conflict_do_nothing(index_elements=[AlertDefaults.project])
        .returning(AlertDefaults.project)).first()
    return made is not None


# --- rules and destinations ----------------------------------------------------------------------

def add(session: Session, row: AlertRule | AlertDestination) -> None:
    session.add(row)
    session.flush()


def _of_projects(session: Session, model: type[Owned], projects: Collection[str] | None,
                 enabled_only: bool) -> Sequence[Owned]:
    query = select(model).where(_in_projects(model.project, projects))  # type: ignore[arg-type]
    if enabled_only:
        query = query.where(model.enabled.is_(True))
    return session.scalars(query.order_by(model.project, model.created_at, model.id)).all()


def rules(session: Session, projects: Collection[str] | None,
          enabled_only: bool = False) -> Sequence[AlertRule]:
    return _of_projects(session, AlertRule, projects, enabled_only)


def get_rule(session: Session, rule_id: str) -> AlertRule | None:
    return session.get(AlertRule, rule_id)


def delete_rule(session: Session, rule_id: str) -> None:
    session.execute(delete(AlertRule).where(AlertRule.id == rule_id))


def destinations(session: Session, projects: Collection[str] | None,
                 enabled_only: bool = False) -> Sequence[AlertDestination]:
    return _of_projects(session, AlertDestination, projects, enabled_only)


def get_destination(session: Session, destination_id: str) -> AlertDestination | None:
    return session.get(AlertDestination, destination_id)


def delete_destination(session: Session, destination_id: str) -> None:
    session.execute(delete(AlertDestination).where(AlertDestination.id == destination_id))


# --- what to evaluate ----------------------------------------------------------------------------

def runs_to_evaluate(session: Session, changed_since: float, active_since: float
                     ) -> Sequence[Run]:
    """Runs that changed since `changed_since`, and runs still open (stored `active`) that
    changed since `active_since`: those can stall or crash without changing."""
    return session.scalars(
        select(Run).where(or_(Run.updated_at >= changed_since,
                              (Run.status == "active") & (Run.updated_at >= active_since)))
        .order_by(Run.updated_at)).all()


StepRow = tuple[int, float, bool, float | None, int, float | None, int]


def recent_steps(session: Session, run_id: str, limit: int) -> Sequence[StepRow]:
    """(step, wall time, skipped, loss, its class, scale after, its class) of the run's
    `limit` newest steps (by step number, then arrival), newest first."""
    return session.execute(
        select(Step.step, Step.wall_time, Step.skipped, Step.loss, Step.loss_class,
               Step.scale_after, Step.scale_after_class)
        .where(Step.run_key == run_key(run_id))
        .order_by(Step.step.desc(), Step.id.desc()).limit(limit)
    ).all()


# --- episodes ------------------------------------------------------------------------------------

def open_episodes(session: Session, rule_id: str, run_id: str) -> Sequence[AlertEpisode]:
    return session.scalars(
        select(AlertEpisode).where(AlertEpisode.rule_id == rule_id,
                                   AlertEpisode.run_id == run_id,
                                   AlertEpisode.closed_at.is_(None))).all()


def next_ordinal(session: Session, rule_id: str, run_id: str, key: str) -> int:
    last = session.scalar(
        select(func.max(AlertEpisode.ordinal)).where(
            AlertEpisode.rule_id == rule_id, AlertEpisode.run_id == run_id,
            AlertEpisode.key == key))
    return 1 if last is None else int(last) + 1


def last_alerted_at(session: Session, rule_id: str, run_id: str, key: str) -> float | None:
    """When the last episode of (rule, run, key) that alerted opened."""
    return session.scalar(
        select(func.max(AlertEpisode.opened_at)).where(
            AlertEpisode.rule_id == rule_id, AlertEpisode.run_id == run_id,
            AlertEpisode.key == key, AlertEpisode.alerted.is_(True)))


# --- alerts and their deliveries -----------------------------------------------------------------

def add_alert(session: Session, alert: Alert, destination_ids: Sequence[str]) -> None:
    """The alert and one pending delivery per destination, in the caller's transaction."""
    session.add(alert)
    session.flush()
    for destination_id in destination_ids:
        session.add(AlertDelivery(alert_id=alert.id, destination_id=destination_id,
                                  status="pending", attempts=0,
                                  next_attempt_at=alert.created_at))
    session.flush()


def due_deliveries(session: Session, now: float, limit: int
                   ) -> Sequence[tuple[AlertDelivery, Alert, AlertDestination, str | None]]:
    """Pending deliveries whose time has come, oldest first, with their alert, destination and
    run name."""
    return session.execute(
        select(AlertDelivery, Alert, AlertDestination, Run.name)
        .join(Alert, Alert.id == AlertDelivery.alert_id)
        .join(AlertDestination, AlertDestination.id == AlertDelivery.destination_id)
        .outerjoin(Run, Run.id == Alert.run_id)
        .where(AlertDelivery.status == "pending", AlertDelivery.next_attempt_at <= now)
        .order_by(AlertDelivery.next_attempt_at, AlertDelivery.id).limit(limit)
    ).all()


def record_attempt(session: Session, delivery_id: int, *, status: str, attempts: int,
                   next_attempt_at: float, error: str | None, delivered_at: float | None
                   ) -> None:
    session.execute(
        update(AlertDelivery).where(AlertDelivery.id == delivery_id).values(
            status=status, attempts=attempts, next_attempt_at=next_attempt_at,
            last_error=error, delivered_at=delivered_at))


def alerts(session: Session, *, projects: Collection[str] | None, run_id: str | None,
           before_id: int | None, limit: int) -> Sequence[Alert]:
    """Newest first; `before_id` pages back."""
    query = select(Alert).where(_in_projects(Alert.project, projects))  # type: ignore[arg-type]
    if run_id is not None:
        query = query.where(Alert.run_id == run_id)
    if before_id is not None:
        query = query.where(Alert.id < before_id)
    return session.scalars(query.order_by(Alert.id.desc()).limit(limit)).all()


def deliveries_of(session: Session, alert_ids: Sequence[int]
                  ) -> Sequence[tuple[AlertDelivery, str]]:
    if not alert_ids:
        return []
    return session.execute(
        select(AlertDelivery, AlertDestination.name)
        .join(AlertDestination, AlertDestination.id == AlertDelivery.destination_id)
        .where(AlertDelivery.alert_id.in_(list(alert_ids)))
        .order_by(AlertDelivery.alert_id, AlertDelivery.id)).all()
