"""What each alert rule means: pure functions from a run's facts to the conditions that hold.

Three kinds of rule (`AlertRule.kind`, its `params`):

    finding  {"finding_kind": str | null}      a finding of that kind (null: any) whose severity is
                                               at least the rule's; one condition per root cause,
                                               so a cause and its consequences are one alert
    series   {"metric", "threshold", "window"}  over the run's last `window` steps:
             skip_rate       share of skipped steps above `threshold`
             nonfinite_loss  a NaN/inf loss (threshold unused)
             scale           the loss scale at or below `threshold`
             layer_lost      the worst layer's lost share (findings/lost.py) above `threshold`
    state    {"state", "stall_factor", "stall_min_s"}
             crashed         the run stopped without finishing (the server's crash timeout)
             stalled         no record for `stall_factor` x the run's usual interval between
                             records, and at least `stall_min_s`; "recovered" when records resume
             finished        the run finished

A condition carries a `key` (what it holds for: a finding's identity, a state) and what the
alert says. alerts.evaluation turns the appearance of a key into an episode and an alert.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ampscope_server.findings import Finding, LayerLoss
from ampscope_server.findings.facts import SEVERITY_RANK, Severity

RuleKind = Literal["finding", "series", "state"]
DEFAULT_COOLDOWN_S = 600.0
DEFAULT_WINDOW = 100
STALL_FACTOR = 10.0
STALL_MIN_S = 120.0


@dataclass(frozen=True)
class StepSample:
    """One of the run's most recent steps, as the series and stall rules read them."""

    step: int
    wall_time: float
    skipped: bool
    loss: float | None
    scale_after: float | None


@dataclass(frozen=True)
class RunFacts:
    """What the rules read about one run at `now` (server clock, unix seconds)."""

    run_id: str
    status: str
    """Derived: `active`, `finished` or `crashed` (runs_list.derive_status)."""
    last_ingest_at: float
    now: float
    crash_timeout_s: float
    target_format: str = "fp16"
    findings: Sequence[Finding] = ()
    worst: LayerLoss | None = None
    recent: Sequence[StepSample] = ()
    """In step order, the newest last."""


@dataclass(frozen=True)
class Condition:
    key: str
    severity: Severity
    title: str
    explanation: str
    recommendation: str
    step_start: int | None = None
    step_end: int | None = None
    members: tuple[str, ...] = ()
    """A finding rule's: the identities of the findings grouped under the root `key`."""


@dataclass(frozen=True)
class RuleSpec:
    kind: RuleKind
    params: Mapping[str, Any]
    severity: Severity


def needs_findings(rule: RuleSpec) -> bool:
    return rule.kind == "finding" or (rule.kind == "series"
                                      and rule.params.get("metric") == "layer_lost")


def conditions(rule: RuleSpec, facts: RunFacts) -> list[Condition]:
    """The conditions of `rule` that hold for the run now (at most one per key)."""
    if rule.kind == "finding":
        return _finding_conditions(rule, facts)
    if rule.kind == "series":
        found = _series_condition(rule, facts)
    else:
        found = _state_condition(rule, facts)
    return [] if found is None else [found]


def recovery(rule: RuleSpec, key: str, facts: RunFacts, opened_at: float) -> Condition | None:
    """What to say when an episode of `key` ends, for the rules whose end is news (a stalled
    run whose records resume); None for the others, whose episodes end quietly."""
    if rule.kind != "state" or key != "stalled":
        return None
    last = facts.recent[-1].step if facts.recent else None
    return Condition(
        key=key, severity=rule.severity, title="Run resumed: records arrive again",
        explanation=(f"The run sent no record for {_duration(facts.last_ingest_at - opened_at)}"
                     f" or more, then resumed" + (f" (step {last})." if last is not None else ".")),
        recommendation="Nothing to do if the pause was expected (evaluation, checkpointing).",
        step_start=last, step_end=last)


# --- finding rules -------------------------------------------------------------------------------

def _finding_conditions(rule: RuleSpec, facts: RunFacts) -> list[Condition]:
    wanted = rule.params.get("finding_kind")
    floor = SEVERITY_RANK[rule.severity]
    by_identity = {f.identity: f for f in facts.findings}
    groups: dict[str, list[Finding]] = {}
    for finding in facts.findings:
        if SEVERITY_RANK[finding.severity] < floor or (wanted and finding.kind != wanted):
            continue
        groups.setdefault(finding.cause or finding.identity, []).append(finding)
    out = []
    for root_identity, members in groups.items():
        root = by_identity.get(root_identity, members[0])
        starts = [f.step_start for f in members if f.step_start is not None]
        ends = [f.step_end for f in members if f.step_end is not None]
        severity = max((f.severity for f in members), key=lambda s: SEVERITY_RANK[s])
        out.append(Condition(
            key=root_identity, severity=severity, title=root.title,
            explanation=root.explanation, recommendation=root.recommendation,
            step_start=min(starts) if starts else None, step_end=max(ends) if ends else None,
            members=tuple(f.identity for f in members)))
    return out


# --- series rules --------------------------------------------------------------------------------

def _window(facts: RunFacts, window: int) -> list[StepSample]:
    if not facts.recent:
        return []
    newest = facts.recent[-1].step
    return [s for s in facts.recent if s.step > newest - window]


def _series_condition(rule: RuleSpec, facts: RunFacts) -> Condition | None:
    metric = rule.params["metric"]
    threshold = float(rule.params.get("threshold", 0.0))
    window = int(rule.params.get("window", DEFAULT_WINDOW))
    steps = _window(facts, window)
    if metric == "layer_lost":
        worst = facts.worst
        if worst is None or not worst.lost_frac > threshold:
            return None
        last = facts.recent[-1].step if facts.recent else None
        return Condition(
            key=metric, severity=rule.severity,
            title=f"{worst.layer} loses {worst.lost_frac:.1%} of its gradient to "
                  f"{facts.target_format.upper()}",
            explanation=(f"Median over the last {worst.steps} layer-stat steps, above this "
                         f"rule's {threshold:.1%}: values that flush to zero at the scale in "
                         "effect (structural zeros are not counted)."),
            recommendation="See the run's findings for the cause and the remedy.",
            step_start=last, step_end=last)
    if not steps:
        return None
    first, last = steps[0].step, steps[-1].step
    if metric == "skip_rate":
        skipped = sum(s.skipped for s in steps)
        rate = skipped / len(steps)
        if not rate > threshold:
            return None
        return Condition(
            key=metric, severity=rule.severity,
            title=f"Skip rate {rate:.0%} over steps {first}-{last}",
            explanation=(f"{skipped} of the last {len(steps)} recorded steps were skipped "
                         f"(gradients overflowed), above this rule's {threshold:.0%}."),
            recommendation="See the run's findings: an overflow storm names the layer that "
                           "overflows first.",
            step_start=first, step_end=last)
    if metric == "nonfinite_loss":
        bad = [s for s in steps if s.loss is not None and not math.isfinite(s.loss)]
        if not bad:
            return None
        return Condition(
            key=metric, severity=rule.severity,
            title=f"Non-finite loss ({bad[0].loss}) at step {bad[0].step}",
            explanation=(f"{len(bad)} of the last {len(steps)} recorded steps had a NaN or "
                         "infinite loss."),
            recommendation="See the run's findings: a NaN from the data is told apart from an "
                           "overflow.",
            step_start=bad[0].step, step_end=bad[-1].step)
    if metric == "scale":
        scale = steps[-1].scale_after
        if scale is None or not scale <= threshold:
            return None
        return Condition(
            key=metric, severity=rule.severity,
            title=f"Loss scale {scale:g} at step {last} (at or below {threshold:g})",
            explanation="The loss scale fell to this rule's threshold: overflows keep halving "
                        "it, and gradients that small flush to zero in FP16.",
            recommendation="See the run's findings for what overflows.",
            step_start=last, step_end=last)
    raise ValueError(f"unknown series metric {metric!r}")


# --- state rules ---------------------------------------------------------------------------------

def usual_interval_s(recent: Sequence[StepSample]) -> float | None:
    """The median time between consecutive records (None with fewer than two)."""
    gaps = [b.wall_time - a.wall_time for a, b in itertools.pairwise(recent)
            if b.wall_time >= a.wall_time]
    return statistics.median(gaps) if gaps else None


def stall_after_s(rule: RuleSpec, recent: Sequence[StepSample]) -> float:
    """How long without a record makes the run stalled."""
    floor = float(rule.params.get("stall_min_s", STALL_MIN_S))
    interval = usual_interval_s(recent)
    factor = float(rule.params.get("stall_factor", STALL_FACTOR))
    return floor if interval is None else max(floor, factor * interval)


def _state_condition(rule: RuleSpec, facts: RunFacts) -> Condition | None:
    state = rule.params["state"]
    last = facts.recent[-1].step if facts.recent else None
    quiet = facts.now - facts.last_ingest_at
    if state == "crashed" and facts.status == "crashed":
        return Condition(
            key=state, severity=rule.severity,
            title=f"Run crashed: no record for {_duration(quiet)}",
            explanation=(f"The run never said it finished, and sent nothing for longer than "
                         f"the server's crash timeout ({_duration(facts.crash_timeout_s)})"
                         + (f"; its last step was {last}." if last is not None else ".")),
            recommendation="Look at the training process's log; a restarted process resumes "
                           "the run as a new attempt.",
            step_start=last, step_end=last)
    if state == "stalled" and facts.status == "active":
        after = stall_after_s(rule, facts.recent)
        if quiet < after:
            return None
        interval = usual_interval_s(facts.recent)
        usual = "" if interval is None else f" (it usually sends one every {_duration(interval)})"
        return Condition(
            key=state, severity=rule.severity,
            title=f"Run stalled: no record for {_duration(quiet)}",
            explanation=f"The run is still open but sent nothing for {_duration(quiet)}{usual}"
                        + (f"; its last step was {last}." if last is not None else "."),
            recommendation="Check that the training process is alive and not stuck (a hung "
                           "collective, a full disk, a paused job).",
            step_start=last, step_end=last)
    if state == "finished" and facts.status == "finished":
        return Condition(
            key=state, severity=rule.severity,
            title="Run finished" + (f" at step {last}" if last is not None else ""),
            explanation="The training process closed the run.",
            recommendation="Nothing to do.", step_start=last, step_end=last)
    return None


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds:.2g} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
