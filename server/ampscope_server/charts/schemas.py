"""The chart reads' output: series, events, skip rates, optimizers, heatmaps. Every float that
may be non-finite is `Tagged`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ampscope_server.ingest.wire import MisuseKind, NonfiniteKind
from ampscope_server.runs.json_floats import Tagged, TaggedRows
from ampscope_server.runs.schemas import RecheckRead, ShadowRead, absent

SeriesName = Literal["scale", "loss", "grad_norm", "lr", "duration"]


class SeriesPointRead(BaseModel):
    step: int
    min: Tagged | None
    max: Tagged | None
    last: Tagged | None


class SeriesRead(BaseModel):
    name: SeriesName
    downsampled: bool
    points: list[SeriesPointRead]


class EventRead(BaseModel):
    step: int
    kind: Literal["backoff", "growth"]
    scale_before: Tagged | None
    scale_after: Tagged | None


class EventLayerRead(BaseModel):
    """A layer that held non-finite gradients in a skipped step."""

    index: int
    name: str
    kind: NonfiniteKind


class SkippedEventRead(BaseModel):
    step: int
    kind: Literal["skipped"]
    scale_before: Tagged | None
    scale_after: Tagged | None
    loss_finite: bool | None
    """False: the loss itself overflowed (forward); True: only gradients did; null: no loss."""
    layers: list[EventLayerRead]
    """In backward order (first bad layer first); [] when not measured."""
    recheck: RecheckRead | None = None
    """The FP32 re-check of this step (wire v3), null when it was not re-checked."""


class MisuseEventRead(BaseModel):
    step: int
    kind: Literal["misuse"]
    scale_before: Tagged | None
    scale_after: Tagged | None
    misuse_kind: MisuseKind
    detail: str


class NonfiniteEventRead(BaseModel):
    """A step whose gradients held NaN or ±inf and that was NOT skipped: a run without a
    GradScaler (BF16, FP32), where the optimizer applies such a step."""

    step: int
    kind: Literal["nonfinite"]
    scale_before: Tagged | None
    scale_after: Tagged | None
    loss_finite: bool | None
    """False: the loss itself was NaN/inf (forward); True: only gradients were; null: no loss."""
    layers: list[EventLayerRead]
    """In backward order (first bad layer first); [] when not measured."""
    shadow: ShadowRead | None = Field(default=None, exclude_if=absent)
    """The FP32 shadow step of this applied step (wire v6); left out when none ran."""


AnyEventRead = SkippedEventRead | NonfiniteEventRead | EventRead | MisuseEventRead


class EventsRead(BaseModel):
    events: list[AnyEventRead]
    next_start: int | None = None
    """More events follow from this step on: pass it as `start` for the next page."""


class SkipRatePoint(BaseModel):
    step: int
    """The first step of the bucket."""
    rate: float
    """The highest rolling skip rate in the bucket."""


class SkipRateRead(BaseModel):
    """The rolling skip rate: the share of skipped steps among the last `window` step numbers,
    bucket maxima (a burst is never averaged away)."""

    window: int
    downsampled: bool
    points: list[SkipRatePoint]
    tail: list[tuple[int, bool]]
    """(step, skipped) of the last window's steps, oldest first: to continue the rate live."""


class OptimizerGroupRead(BaseModel):
    """One parameter group's lr over the steps: min/max/last per bucket (NaN and ±inf kept)."""

    group: int
    downsampled: bool
    points: list[SeriesPointRead]


class OptimizerTrackRead(BaseModel):
    """One watched optimizer (by its watch order) over the steps that carried it."""

    optimizer: int
    steps: int
    """How many steps carried this optimizer."""
    skipped: int
    """How many of them it skipped (its update not applied: GradScaler found inf)."""
    unknown: int
    """How many of them did not say whether it skipped."""
    skipped_steps: list[int]
    """The skipped steps, ascending: every one, or the first `OPTIMIZER_SKIPS_LISTED`."""
    groups: int
    """Its most parameter groups at any step."""
    lr: list[OptimizerGroupRead]
    """The lr of each of its first `OPTIMIZER_GROUPS_CHARTED` groups that ever had one."""


class OptimizersRead(BaseModel):
    """`GET /api/runs/{id}/optimizers`: wire v4's per-optimizer skips and learning rates
    (sent only by runs with several optimizers or parameter groups; empty otherwise)."""

    optimizers: list[OptimizerTrackRead]
    last_step: int | None
    """The last step read (null: none): live steps after it continue the charts."""


HeatmapStat = Literal[
    "amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac", "nan_count", "inf_count",
    "l2", "lost_frac", "headroom_bits", "swallowed_frac",
]


HeatmapSource = Literal["param", "activation"]


class HeatmapRead(BaseModel):
    stat: HeatmapStat
    source: HeatmapSource
    """`layers` names the layer table (param) or the module table (activation)."""
    layers: list[str]
    steps: list[int]
    z: TaggedRows
    downsampled: bool = False
    rows: list[int] | None = None
    """The table indices of `layers` and of z's rows when the read picked some (`layers=`);
    null when every row is there, in table order."""
