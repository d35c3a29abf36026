"""API output of the findings (docs/contracts.md, Findings): pydantic models apart from the
engine's dataclasses. Evidence values may be NaN/±inf and are tagged like every API float."""

from __future__ import annotations

from pydantic import BaseModel

from ampscope_server.findings.facts import Finding, Severity
from ampscope_server.findings.formats import FloatFormat
from ampscope_server.findings.lost import LayerLoss
from ampscope_server.runs.json_floats import Tagged


class FindingRead(BaseModel):
    kind: str
    severity: Severity
    title: str
    explanation: str
    recommendation: str
    step_start: int | None
    step_end: int | None
    layers: list[str]
    """Most responsible first."""
    evidence: dict[str, Tagged]
    identity: str
    """Stable across live analyses (kind, or kind:subject): the page updates it in place."""
    cause: str | None
    """The identity of the root cause this one follows from; null for a root cause."""
    held_since: int | None
    """Null when the latest analysis raised it; else the last step at which one did (it stays
    shown for HOLD_STEPS steps, so that a value at its threshold does not make it blink)."""

    @classmethod
    def of(cls, finding: Finding) -> FindingRead:
        return cls(
            kind=finding.kind, severity=finding.severity, title=finding.title,
            explanation=finding.explanation, recommendation=finding.recommendation,
            step_start=finding.step_start, step_end=finding.step_end,
            layers=list(finding.layers), evidence=dict(finding.evidence),
            identity=finding.identity, cause=finding.cause, held_since=finding.held_since,
        )


class LayerLossRead(BaseModel):
    """The layer losing the largest share of its gradient to the format (findings/lost.py):
    median over the last `steps` layer-stat steps, as `gradient_underflow` judges it."""

    layer: str
    lost_frac: Tagged
    structural_zero_frac: Tagged
    """Exact zeros judged structural (dead units, unused rows): shown apart, not lost."""
    steps: int

    @classmethod
    def of(cls, loss: LayerLoss) -> LayerLossRead:
        return cls(layer=loss.layer, lost_frac=loss.lost_frac,
                   structural_zero_frac=loss.structural_zero_frac, steps=loss.steps)


class FindingsRead(BaseModel):
    run: str
    baseline: str | None
    findings: list[FindingRead]
    """Root causes first (most severe group first), each followed by its consequences."""
    step: int | None = None
    """The newest step the analysis saw (without a baseline); the page fetches again when it
    holds newer steps."""
    worst_loss: LayerLossRead | None = None
    """Without a baseline: the layer losing most to the format (null: no layer statistics)."""


class FindingBrief(BaseModel):
    """The most severe finding of a run, for the runs list."""

    kind: str
    severity: Severity
    title: str


class FormatLimits(BaseModel):
    """The target format's limits the "what if x k" view draws (formats.py, from torch.finfo)."""

    name: str
    max: float
    min_normal: float
    min_subnormal: float

    @classmethod
    def of(cls, fmt: FloatFormat) -> FormatLimits:
        return cls(name=fmt.name, max=fmt.max, min_normal=fmt.min_normal,
                   min_subnormal=fmt.min_subnormal)


class HistogramView(BaseModel):
    """One sampled step's exponent histograms (docs/contracts.md, wire v2 `histogram`), for the
    browser to recompute zero/flush/subnormal/overflow shares at any scale ("what if x k")."""

    run: str
    step: int | None
    """The sampled step shown; null when the run has no histogram yet."""
    scale: Tagged | None
    """The scale in effect at that step (`scale_before`); null when unknown (read as 1)."""
    steps: list[int]
    """The run's most recent sampled steps, newest first (HISTOGRAM_STEPS of them)."""
    format: FormatLimits
    min_exp: int | None
    max_exp: int | None
    layers: list[str]
    counts: list[list[int]]
    """Per layer (model order): [0] |g| = 0, [1] non-finite, [2] 0 < |g| < 2^min_exp,
    [3 + k] 2^(min_exp+k) ≤ |g| < 2^(min_exp+k+1), [last] |g| ≥ 2^(max_exp+1); true units."""
