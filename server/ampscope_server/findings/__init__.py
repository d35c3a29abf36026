"""The findings engine: why a mixed-precision run is unstable, and what to change.

Pure functions over a plain snapshot of a run (`RunData`); no database, no torch. The service
that loads a snapshot from the database is `ampscope_server.findings.reads`.

    analyze(run: RunData, baseline: RunData | None = None) -> list[Finding]
    analyze_live(run: RunData, memory: Memory | None) -> tuple[list[Finding], Memory]

Findings come grouped, root cause first (`causes.py`); live, they hold steady (`stability.py`);
"lost" counts only what the format loses (`lost.py`).
"""

from __future__ import annotations

from ampscope_server.findings.causes import primary
from ampscope_server.findings.engine import analyze, analyze_live, most_severe
from ampscope_server.findings.facts import (
    Finding,
    ForwardOrigin,
    LayerInfo,
    LayerSample,
    MisuseEvent,
    NonfiniteStep,
    RankStep,
    RecheckStatus,
    RunData,
    Severity,
    ShadowSample,
    StepPoint,
    SwallowedSample,
)
from ampscope_server.findings.lost import LayerLoss
from ampscope_server.findings.stability import Memory

KINDS = (
    "calibration_overflow", "divergence", "overflow_storm", "scale_collapse", "forward_overflow",
    "nan_not_range", "gradient_underflow", "swallowed_updates", "amp_misuse", "scaler_tuning",
    "baseline_divergence", "rank_nonfinite", "precision_sensitive",
)

__all__ = [
    "KINDS", "Finding", "ForwardOrigin", "LayerInfo", "LayerLoss", "LayerSample", "Memory",
    "MisuseEvent", "NonfiniteStep", "RankStep", "RecheckStatus", "RunData", "Severity",
    "ShadowSample", "StepPoint", "SwallowedSample",
    "analyze", "analyze_live", "most_severe", "primary",
]
