"""alert_rules: what each kind of rule sees in a run's facts (pure, fed by hand)."""

from __future__ import annotations

import math
from typing import Any

from ampscope_server.alerts.rules import (
    Condition,
    RuleSpec,
    RunFacts,
    StepSample,
    conditions,
    recovery,
    stall_after_s,
)
from ampscope_server.findings import Finding, LayerLoss
from ampscope_server.findings.facts import Severity

NOW = 1_000_000.0


def _facts(**kw: Any) -> RunFacts:
    base: dict[str, Any] = {"run_id": "r", "status": "active", "last_ingest_at": NOW,
                            "now": NOW, "crash_timeout_s": 300.0}
    return RunFacts(**{**base, **kw})


def _steps(n: int, *, every_s: float = 1.0, skipped: set[int] | None = None,
           loss: dict[int, float] | None = None, scale: float = 1024.0) -> list[StepSample]:
    return [StepSample(step=i, wall_time=NOW - (n - i) * every_s, skipped=i in (skipped or set()),
                       loss=(loss or {}).get(i, 1.0), scale_after=scale) for i in range(n)]


def _finding(kind: str, severity: Severity, start: int, end: int,
             cause: str | None = None) -> Finding:
    return Finding(kind=kind, severity=severity, title=f"{kind} title",
                   explanation=f"{kind} explained", recommendation=f"{kind} advice",
                   step_start=start, step_end=end, cause=cause)


FINDINGS = [
    _finding("overflow_storm", "error", 200, 250),
    _finding("scale_collapse", "warning", 240, 400, cause="overflow_storm"),
    _finding("forward_overflow", "error", 350, 350),
    _finding("amp_misuse", "warning", 300, 301),
]


def test_a_finding_rule_alerts_once_per_root_cause() -> None:
    rule = RuleSpec("finding", {"finding_kind": None}, "warning")
    got = conditions(rule, _facts(findings=FINDINGS))
    # The collapse follows from the storm: one condition for both, spanning both.
    assert got == [
        Condition("overflow_storm", "error", "overflow_storm title", "overflow_storm explained",
                  "overflow_storm advice", 200, 400,
                  members=("overflow_storm", "scale_collapse")),
        Condition("forward_overflow", "error", "forward_overflow title",
                  "forward_overflow explained", "forward_overflow advice", 350, 350,
                  members=("forward_overflow",)),
        Condition("amp_misuse", "warning", "amp_misuse title", "amp_misuse explained",
                  "amp_misuse advice", 300, 301, members=("amp_misuse",)),
    ]


def test_a_finding_rule_filters_by_severity_and_kind() -> None:
    errors = RuleSpec("finding", {"finding_kind": None}, "error")
    assert [c.key for c in conditions(errors, _facts(findings=FINDINGS))] == [
        "overflow_storm", "forward_overflow"]
    misuse = RuleSpec("finding", {"finding_kind": "amp_misuse"}, "info")
    assert [c.key for c in conditions(misuse, _facts(findings=FINDINGS))] == ["amp_misuse"]
    assert conditions(errors, _facts()) == []


def test_skip_rate_over_the_window() -> None:
    rule = RuleSpec("series", {"metric": "skip_rate", "threshold": 0.1, "window": 50}, "warning")
    storm = _facts(recent=_steps(200, skipped={i for i in range(150, 200) if i % 5 == 0}))
    [got] = conditions(rule, storm)
    assert (got.key, got.title, got.step_start, got.step_end) == (
        "skip_rate", "Skip rate 20% over steps 150-199", 150, 199)
    # The same skips outside the window do not count.
    old = _facts(recent=_steps(200, skipped={i for i in range(100, 150) if i % 5 == 0}))
    assert conditions(rule, old) == []
    # At the threshold is not above it.
    edge = _facts(recent=_steps(50, skipped={0, 10, 20, 30, 40}))
    assert conditions(rule, edge) == []


def test_nonfinite_loss_scale_and_layer_lost() -> None:
    nan = RuleSpec("series", {"metric": "nonfinite_loss", "window": 10}, "error")
    [got] = conditions(nan, _facts(recent=_steps(20, loss={15: math.nan, 17: math.inf})))
    assert (got.title, got.step_start, got.step_end) == ("Non-finite loss (nan) at step 15",
                                                         15, 17)
    assert conditions(nan, _facts(recent=_steps(20, loss={5: math.nan}))) == []
    low = RuleSpec("series", {"metric": "scale", "threshold": 1.0, "window": 10}, "error")
    assert conditions(low, _facts(recent=_steps(5, scale=2.0))) == []
    [got] = conditions(low, _facts(recent=_steps(5, scale=1.0)))
    assert got.title == "Loss scale 1 at step 4 (at or below 1)"
    lost = RuleSpec("series", {"metric": "layer_lost", "threshold": 0.25, "window": 10},
                    "warning")
    worst = LayerLoss(layer="fc2.bias", lost_frac=0.3125, structural_zero_frac=0.0, steps=5)
    [got] = conditions(lost, _facts(worst=worst, recent=_steps(3)))
    assert got.title == "fc2.bias loses 31.2% of its gradient to FP16"
    assert conditions(lost, _facts(worst=None, recent=_steps(3))) == []


def test_stalled_is_judged_against_the_usual_interval() -> None:
    rule = RuleSpec("state", {"state": "stalled", "stall_factor": 10.0, "stall_min_s": 5.0},
                    "warning")
    recent = _steps(30, every_s=2.0)  # a record every 2 s: stalled after 20 s
    assert stall_after_s(rule, recent) == 20.0
    assert stall_after_s(rule, _steps(30, every_s=0.1)) == 5.0  # never below the floor
    assert stall_after_s(rule, []) == 5.0
    last_at = recent[-1].wall_time
    quiet = _facts(recent=recent, last_ingest_at=last_at, now=last_at + 19.9)
    assert conditions(rule, quiet) == []
    stalled = _facts(recent=recent, last_ingest_at=last_at, now=last_at + 25.0)
    [got] = conditions(rule, stalled)
    assert (got.key, got.severity, got.title, got.step_start) == (
        "stalled", "warning", "Run stalled: no record for 25 s", 29)
    assert "usually sends one every 2 s" in got.explanation
    # A finished or crashed run is not "stalled".
    assert conditions(rule, _facts(recent=recent, last_ingest_at=last_at, now=last_at + 25,
                                   status="finished")) == []
    said = recovery(rule, "stalled", _facts(recent=recent, last_ingest_at=last_at + 40),
                    opened_at=last_at + 25)
    assert said is not None
    assert (said.title, said.step_end) == ("Run resumed: records arrive again", 29)


def test_crashed_and_finished() -> None:
    crashed = RuleSpec("state", {"state": "crashed"}, "error")
    [got] = conditions(crashed, _facts(status="crashed", last_ingest_at=NOW - 600,
                                       recent=_steps(3)))
    assert got.title == "Run crashed: no record for 10 min"
    assert conditions(crashed, _facts(status="active")) == []
    finished = RuleSpec("state", {"state": "finished"}, "info")
    [got] = conditions(finished, _facts(status="finished", recent=_steps(3)))
    assert (got.title, got.severity) == ("Run finished at step 2", "info")
    # Only a stall's end is news.
    assert recovery(crashed, "crashed", _facts(), opened_at=NOW) is None
