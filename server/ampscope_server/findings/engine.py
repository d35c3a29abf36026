"""`analyze`: run every detector over a snapshot and order the findings.

A healthy run (calibration skips, the scaler's occasional probe, no underflow, no misuse)
gets at most `info` findings; everything at `warning` or `error` names something to change.
"""

from __future__ import annotations

from ampscope_server.findings import baseline as baseline_mod
from ampscope_server.findings import gradients, misuse, nonfinite, scaling
from ampscope_server.findings.model import SEVERITY_RANK, Finding, RunData
from ampscope_server.findings.timeline import history


def analyze(run: RunData, baseline: RunData | None = None) -> list[Finding]:
    """Every finding for `run` (and against `baseline` when given), most severe first, then by
    first step. Pure: no I/O; the input is not modified."""
    findings: list[Finding] = []
    h = history(run)
    if h is not None:
        storm = scaling.storm_skips(h)
        findings += scaling.calibration_overflow(run, h)
        findings += scaling.overflow_storm(run, h)
        findings += scaling.scale_collapse(run, h)
        findings += nonfinite.forward_overflow(run, h)
        findings += nonfinite.nan_not_range(run, h)
        findings += scaling.scaler_tuning(run, h, storm)
    findings += gradients.gradient_underflow(run)
    findings += gradients.swallowed_updates(run)
    findings += misuse.amp_misuse(run, h)
    if baseline is not None:
        findings += baseline_mod.baseline_divergence(run, baseline)
    return sorted(findings, key=lambda f: (
        -SEVERITY_RANK[f.severity], f.step_start if f.step_start is not None else -1))


def most_severe(findings: list[Finding]) -> Finding | None:
    """The first finding of the highest severity (`analyze`'s order already puts it first)."""
    return max(findings, key=lambda f: SEVERITY_RANK[f.severity], default=None)
