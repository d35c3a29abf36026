"""`analyze`: run every detector over a snapshot, link consequences to their causes, order.

A healthy run (calibration skips, the scaler's occasional probe, no underflow, no misuse)
gets at most `info` findings; everything at `warning` or `error` names something to change.

    detect(run, baseline, holding)  the detectors' raw findings (no order, no grouping)
    analyze(run, baseline)          grouped and ordered (causes.group): a snapshot, stateless
    analyze_live(run, memory)       the same over a live run, through stability.track
"""

from __future__ import annotations

from collections.abc import Mapping

from ampscope_server.findings import baseline as baseline_mod
from ampscope_server.findings import (
    causes,
    divergence,
    gradients,
    misuse,
    nonfinite,
    outliers,
    precision,
    ranks,
    scaling,
)
from ampscope_server.findings.facts import SEVERITY_RANK, Finding, RunData
from ampscope_server.findings.stability import Memory, track
from ampscope_server.findings.timeline import history

_NO_HOLD: Mapping[str, tuple[str, ...]] = {}


def detect(
    run: RunData, baseline: RunData | None = None,
    holding: Mapping[str, tuple[str, ...]] = _NO_HOLD,
) -> list[Finding]:
    """Every detector's findings for `run` (and against `baseline`), unordered. `holding`:
    {kind: layers a previous live analysis flagged} for the detectors' hysteresis."""
    findings: list[Finding] = []
    h = history(run)
    if h is not None:
        storm = scaling.storm_skips(h)
        m = divergence.magnitude(run, h)
        findings += divergence.divergence(run, h, m)
        findings += scaling.calibration_overflow(run, h)
        findings += scaling.overflow_storm(run, h)
        findings += scaling.scale_collapse(run, h)
        findings += nonfinite.forward_overflow(run, h, m)
        findings += nonfinite.nan_not_range(run, h)
        findings += scaling.scaler_tuning(run, h, storm)
    findings += gradients.gradient_underflow(run, holding.get("gradient_underflow", ()))
    findings += gradients.swallowed_updates(run, holding.get("swallowed_updates", ()))
    findings += precision.precision_sensitive(run)
    findings += outliers.activation_outliers(run)
    findings += misuse.amp_misuse(run, h)
    findings += ranks.rank_nonfinite(run)
    if baseline is not None:
        findings += baseline_mod.baseline_divergence(run, baseline)
    return findings


def analyze(run: RunData, baseline: RunData | None = None) -> list[Finding]:
    """Every finding for `run` (and against `baseline` when given): root causes first, each
    followed by the findings that follow from it (`causes.group`). Pure: no I/O; the input is
    not modified."""
    return causes.group(detect(run, baseline))


def last_step(run: RunData) -> int:
    """The newest step the snapshot holds (scalars or layer statistics); -1 when empty."""
    steps = [p.step for p in run.steps] + [s.step for s in run.layer_samples]
    return max(steps, default=-1)


def analyze_live(run: RunData, memory: Memory | None) -> tuple[list[Finding], Memory]:
    """`analyze` for one more look at a live run: hysteresis from `memory`, findings no longer
    raised held for HOLD_STEPS (stability.py). Returns the findings and the next memory."""
    raised = detect(run, holding=memory.holding() if memory is not None else _NO_HOLD)
    memory = track(memory, raised, last_step(run))
    return causes.group(memory.findings()), memory


def most_severe(findings: list[Finding]) -> Finding | None:
    """The first finding of the highest severity."""
    return max(findings, key=lambda f: SEVERITY_RANK[f.severity], default=None)
