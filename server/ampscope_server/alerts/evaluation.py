"""Deciding alerts: evaluate the rules of each project over its runs that changed (or may have
stalled), open and close episodes, and write each alert with its deliveries (the outbox) in one
transaction per run. Sending is alerts.delivery's; the loop that calls both is alerts.worker.

Exactly once in effect: an episode's alert has the dedup key (rule, run, key, ordinal, event),
unique in the database, so deciding it twice (two evaluators, a retried transaction) fails
instead of alerting twice. A storm is one alert: an episode lasts while its condition holds,
and a new episode of the same condition (rule, run, key) within the rule's cooldown after one
that alerted is recorded but silent. Two root causes of one run are two conditions: both alert.
One cause, one alert (#30): a live run's diagnosis can find the root later than a consequence
(a storm that alerted as a root turns out to follow from a divergence); the new root's episode
takes over the alerted episode of a finding it now groups (`Condition.members`), silently.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.alerts import rules as alert_rules
from ampscope_server.alerts import settings as alert_settings
from ampscope_server.alerts.rules import Condition, RuleSpec, RunFacts, StepSample
from ampscope_server.findings import Finding
from ampscope_server.findings import reads as finding_reads
from ampscope_server.findings.facts import SEVERITY_RANK
from ampscope_server.runs.listing import crash_cutoff, derive_status
from ampscope_server.store import alerts_repository
from ampscope_server.store.db import unit_of_work
from ampscope_server.store.float_storage import from_storage
from ampscope_server.store.models import Alert, AlertDestination, AlertEpisode, AlertRule, Run

log = logging.getLogger("ampscope_server.alerts")

KEY_MAX = 300  # alert_episodes.key
LOOK_BACK_S = 60.0
"""Each pass looks again at every run changed this recently (and at every open run): a batch's
`updated_at` is taken when its transaction starts, so it may commit seconds after a pass that
would otherwise have moved past it. Looking again is idempotent (an open episode stays open)."""
RECENT_MIN = 50
RECENT_MAX = 10_000


@dataclass(frozen=True)
class Pass:
    runs: int
    alerts: int


def _recent(session: Session, run_id: str, limit: int) -> list[StepSample]:
    rows = alerts_repository.recent_steps(session, run_id, limit)
    return [StepSample(step=step, wall_time=wall_time, skipped=skipped,
                       loss=from_storage(loss, loss_cls),
                       scale_after=from_storage(scale, scale_cls))
            for step, wall_time, skipped, loss, loss_cls, scale, scale_cls in reversed(rows)]


def facts_of(session: Session, run: Run, rules: Sequence[RuleSpec], now: float,
             crash_timeout_s: float) -> RunFacts:
    """What `rules` need to know about `run` (the findings only when a rule reads them)."""
    window = max([int(r.params.get("window", 0)) for r in rules if r.kind == "series"] or [0])
    recent = _recent(session, run.id, min(RECENT_MAX, max(RECENT_MIN, window)))
    findings: Sequence[Finding] = ()
    worst = None
    if any(alert_rules.needs_findings(r) for r in rules):
        view = finding_reads.live_view(session, run)  # shared with the run page: the same findings
        findings, worst = view.findings, view.worst
    return RunFacts(
        run_id=run.id, status=derive_status(run.status, run.updated_at,
                                              crash_cutoff(now, crash_timeout_s)),
        last_ingest_at=run.updated_at, now=now, crash_timeout_s=crash_timeout_s,
        target_format=run.target_format, findings=findings, worst=worst, recent=recent)


def _spec(rule: AlertRule) -> RuleSpec:
    return RuleSpec(kind=rule.kind, params=rule.params,  # type: ignore[arg-type]
                    severity=rule.severity)  # type: ignore[arg-type]


def _alert(session: Session, rule: AlertRule, run: Run, episode: AlertEpisode, event: str,
           said: Condition, destinations: Sequence[AlertDestination], now: float) -> Alert:
    alert = Alert(
        dedup_key=f"{rule.id}:{run.id}:{episode.key}#{episode.ordinal}:{event}",
        rule_id=rule.id, run_id=run.id, project=run.project, event=event,
        severity=said.severity, title=said.title[:500], explanation=said.explanation[:4000],
        recommendation=said.recommendation[:4000], step_start=said.step_start,
        step_end=said.step_end, created_at=now)
    floor = SEVERITY_RANK[said.severity]
    alerts_repository.add_alert(session, alert, [
        d.id for d in destinations if SEVERITY_RANK[d.min_severity] <= floor])  # type: ignore[index]
    return alert


def apply_rule(session: Session, rule: AlertRule, run: Run, facts: RunFacts,
               destinations: Sequence[AlertDestination], now: float) -> list[Alert]:
    """Open an episode for each new condition (alerting unless within the cooldown), close the
    episodes whose condition ended (saying so when that is news)."""
    spec = _spec(rule)
    holds = {c.key[:KEY_MAX]: c for c in alert_rules.conditions(spec, facts)}
    open_episodes = {e.key: e for e in alerts_repository.open_episodes(session, rule.id, run.id)}
    decided = []
    for key, condition in holds.items():
        if key in open_episodes:
            continue
        last = alerts_repository.last_alerted_at(session, rule.id, run.id, key)
        # A finding that alerted as a root and now follows from this one: the same cause.
        taken_over = any(open_episodes[m].alerted for m in condition.members
                         if m != key and m in open_episodes and m not in holds)
        episode = AlertEpisode(
            rule_id=rule.id, run_id=run.id, key=key,
            ordinal=alerts_repository.next_ordinal(session, rule.id, run.id, key),
            opened_at=now, closed_at=None,
            alerted=not taken_over and (last is None or now - last >= rule.cooldown_s))
        session.add(episode)
        session.flush()
        if episode.alerted:
            decided.append(_alert(session, rule, run, episode, "fired", condition,
                                  destinations, now))
    for key, episode in open_episodes.items():
        if key in holds:
            continue
        episode.closed_at = now
        said = alert_rules.recovery(spec, key, facts, episode.opened_at)
        if episode.alerted and said is not None:
            decided.append(_alert(session, rule, run, episode, "recovered", said,
                                  destinations, now))
    session.flush()
    return decided


def evaluate(factory: sessionmaker[Session], *, now: float, crash_timeout_s: float) -> Pass:
    """One evaluation pass: the runs changed in the last LOOK_BACK_S, and the open runs that can
    still stall or crash. One transaction per run: a failing run does not hold back the rest."""
    with unit_of_work(factory) as session:
        runs = list(alerts_repository.runs_to_evaluate(
            session, now - LOOK_BACK_S, now - 2 * crash_timeout_s))
        projects = sorted({r.project for r in runs})
        for project in projects:
            alert_settings.seed_defaults(session, project, now)
        candidates = [(r.id, r.project) for r in runs]
    decided = 0
    for run_id, project in candidates:
        try:
            with unit_of_work(factory) as session:
                rules = alerts_repository.rules(session, [project], enabled_only=True)
                run = session.get(Run, run_id)
                if not rules or run is None:
                    continue
                destinations = alerts_repository.destinations(session, [run.project],
                                                              enabled_only=True)
                facts = facts_of(session, run, [_spec(r) for r in rules], now, crash_timeout_s)
                for rule in rules:
                    decided += len(apply_rule(session, rule, run, facts, destinations, now))
        except Exception:  # one run's failure must not stop the others' alerts
            log.exception("alert evaluation failed for run %s", run_id)
    return Pass(runs=len(candidates), alerts=decided)
