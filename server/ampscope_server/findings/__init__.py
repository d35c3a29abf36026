"""The findings engine: why a mixed-precision run is unstable, and what to change.

Pure functions over a plain snapshot of a run (`RunData`); no database, no torch. The service
that loads a snapshot from the database is `ampscope_server.diagnosis`.

    analyze(run: RunData, baseline: RunData | None = None) -> list[Finding]
"""

from __future__ import annotations

from ampscope_server.findings.engine import analyze, most_severe
from ampscope_server.findings.model import (
    Finding,
    LayerInfo,
    LayerSample,
    MisuseEvent,
    NonfiniteStep,
    RecheckStatus,
    RunData,
    Severity,
    StepPoint,
    SwallowedSample,
)

KINDS = (
    "calibration_overflow", "overflow_storm", "scale_collapse", "forward_overflow",
    "nan_not_range", "gradient_underflow", "swallowed_updates", "amp_misuse", "scaler_tuning",
    "baseline_divergence",
)

__all__ = [
    "KINDS", "Finding", "LayerInfo", "LayerSample", "MisuseEvent", "NonfiniteStep", "RecheckStatus",
    "RunData", "Severity", "StepPoint", "SwallowedSample", "analyze", "most_severe",
]
