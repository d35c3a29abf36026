"""API output of the findings (docs/contracts.md, Findings): pydantic models apart from the
engine's dataclasses. Evidence values may be NaN/±inf and are tagged like every API float."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, PlainSerializer

from ampscope_server import codec
from ampscope_server.findings.model import Finding, Severity

Tagged = Annotated[float, PlainSerializer(codec.encode, return_type=float | str | None)]


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

    @classmethod
    def of(cls, finding: Finding) -> FindingRead:
        return cls(
            kind=finding.kind, severity=finding.severity, title=finding.title,
            explanation=finding.explanation, recommendation=finding.recommendation,
            step_start=finding.step_start, step_end=finding.step_end,
            layers=list(finding.layers), evidence=dict(finding.evidence),
        )


class FindingsRead(BaseModel):
    run: str
    baseline: str | None
    findings: list[FindingRead]
    """Most severe first, then by first step."""


class FindingBrief(BaseModel):
    """The most severe finding of a run, for the runs list."""

    kind: str
    severity: Severity
    title: str
