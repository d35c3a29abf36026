"""The comparison's output: aligned runs, the first divergence, the layers that differ."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from ampscope_server.runs.json_floats import Tagged
from ampscope_server.runs.schemas import RunSummary


class DivergenceRead(BaseModel):
    metric: Literal["loss", "grad_norm"]
    step: int
    reference_value: Tagged
    value: Tagged
    relative: Tagged


class LayerDiffRead(BaseModel):
    layer: str
    steps: int
    l2_ratio: Tagged | None
    ratio_steps: int
    lost_frac_reference: float | None
    lost_frac: float | None
    underflow_only_in: str | None
    """The id of the only run whose median lost_frac is above the threshold, else null."""
    nonfinite_steps: int = 0
    """Common steps where the layer held NaN or inf in either run: left out of the ratio and the
    lost medians (its norm is over finite elements only, its zeros born of the NaN)."""


class ComparisonRead(BaseModel):
    run: str
    reference: str
    common_steps: int
    layer_steps: int
    divergence: DivergenceRead | None
    """The earlier of `loss_divergence` and `grad_norm_divergence` (loss on a tie)."""
    loss_divergence: DivergenceRead | None
    grad_norm_divergence: DivergenceRead | None
    layers: list[LayerDiffRead]
    divergence_exact: bool
    """False when a long common range was searched through rollups (comparison_reads)."""
    layer_bucket_width: int
    """1: the per-layer medians are over steps; k > 1: over rollup buckets of k steps, each
    standing for its largest l2 and lost_frac (then `steps`, `ratio_steps` and `layer_steps`
    count buckets)."""


class CompareRead(BaseModel):
    tolerance: float
    underflow_threshold: float
    reference: str
    runs: list[RunSummary]
    comparisons: list[ComparisonRead]
