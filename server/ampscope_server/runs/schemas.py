"""Pydantic models of the API output (docs/contracts.md "Read API"), plus the wire's names.

The wire models live in `wire.py`; the names re-exported here keep `schemas` the one import for
routers and tools. Every output float that may be non-finite is `Tagged`: finite → number,
non-finite → "nan" / "inf" / "-inf", so that a browser's `JSON.parse` always succeeds.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
)

from ampscope_server.findings.schemas import FindingBrief, FormatLimits
from ampscope_server.ingest.wire import MAX_TAGS, Captured, MisuseKind, NonfiniteKind, RecheckStatus
from ampscope_server.ingest.wire import SCHEMA_VERSION as SCHEMA_VERSION
from ampscope_server.ingest.wire import SCHEMA_VERSIONS as SCHEMA_VERSIONS
from ampscope_server.ingest.wire import ClientAccounting as ClientAccounting
from ampscope_server.ingest.wire import IngestBatch as IngestBatch
from ampscope_server.ingest.wire import LayerInfo as LayerInfo
from ampscope_server.ingest.wire import ModuleInfo as ModuleInfo
from ampscope_server.ingest.wire import StepRecord as StepRecord
from ampscope_server.runs import json_floats

Tagged = Annotated[float, PlainSerializer(json_floats.encode, return_type=float | str | None)]
TaggedRows = Annotated[list[list[float | None]], PlainSerializer(
    json_floats.encode_rows, return_type=list[list[int | float | str | None]])]
"""A matrix of `Tagged | None`, encoded a row at a time (`json_floats.encode_rows`) rather than a
Python call per value."""
"""An output float: finite → number, non-finite → "nan" / "inf" / "-inf"."""


# --- API output --------------------------------------------------------------------------------

class RunStatus(str, Enum):
    ACTIVE = "active"
    FINISHED = "finished"
    CRASHED = "crashed"


class ErrorBody(BaseModel):
    detail: str


AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No credentials, or not valid ones"},
    403: {"model": ErrorBody, "description": "The token's scope does not allow this"},
}


class DeletedRead(BaseModel):
    id: str
    project: str
    deleted_at: float
    steps: int
    """How many steps were deleted with the run."""


class TokenRead(BaseModel):
    """An API token as listed: never its secret."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    project: str | None
    """null: every project."""
    scope: Literal["read", "ingest", "admin"]
    created_at: float
    last_used_at: float | None
    revoked_at: float | None


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str | None = Field(max_length=200)
    """null: every project (an all-projects admin only)."""
    scope: Literal["read", "ingest", "admin"]
    name: str = Field("", max_length=200)


class TokenCreated(TokenRead):
    secret: str
    """Shown in this answer only; the server keeps its hash."""


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class IngestResult(BaseModel):
    run_id: str
    attempt: int
    accepted: int
    duplicates: int


class WorstLayer(BaseModel):
    layer: str
    value: Tagged


class RunSummary(BaseModel):
    id: str
    project: str
    name: str
    tags: list[str]
    status: RunStatus
    created_at: float
    """Unix seconds, server clock."""
    updated_at: float
    num_steps: int
    last_step: int | None
    last_id: int | None = None
    """The id of the run's newest stored step: a live socket's `after_id` to start from."""
    last_scale: Tagged | None
    skipped_steps: int
    num_layers: int
    world_size: int = 1
    """The processes of the distributed job the run records (wire v4; 1 before it)."""
    skip_rate: float | None
    """skipped_steps / num_steps; null for a run without steps."""
    worst_underflow: WorstLayer | None
    """The layer losing most to the format, as the findings judge it (`finding_reads.live_view`:
    structural zeros apart, the median over the recent layer-stat steps)."""
    worst_headroom: WorstLayer | None
    """The layer with the smallest `headroom_bits` at the run's last layer-stat step."""
    top_finding: FindingBrief | None = None
    """The run's root-cause finding (the first the run page lists), null when it has none."""
    summary_step: int | None = None
    """The step `top_finding`, `worst_underflow` and `worst_headroom` are as of: the newest
    step their analysis saw (cached beside the counters, `summary_cache`); behind `last_step`
    while the analysis catches up; null: not analysed yet (or no steps)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """The run's hyperparameters as the client sent them (capped at ingest): the runs list
    offers any of their keys as a column."""
    notes: str = ""
    """What people wrote on the run (PATCH /api/runs/{id}); user text."""


class AttemptRead(BaseModel):
    ordinal: int
    id: str
    pid: int
    started_at: float
    client: ClientAccounting | None
    """The sender's latest accounting for this attempt (largest `produced`), or null."""


class RunDetail(RunSummary):
    host: str
    rank: int
    target_format: str
    target_format_reason: str | None
    """Why the run is judged against `target_format` (given, or inferred from the model),
    null when the client did not say."""
    target_format_limits: FormatLimits
    """`target_format`'s limits, for what the pages compute from live steps (the heatmap's
    headroom divides by `max`): the web holds no copy of them."""
    attempts: list[AttemptRead]


MAX_NOTES = 4000
"""Characters of a run's notes (a paragraph or two, not a document)."""


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("must not contain NUL characters")
    return text


Tag = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=200),
                AfterValidator(_no_nul)]
"""A tag as people edit it: as the wire's (200 characters, no NUL), and not empty."""


class RunUpdate(BaseModel):
    """PATCH /api/runs/{id}: the notes and tags people edit; a field left out is unchanged."""

    model_config = ConfigDict(extra="forbid")

    notes: Annotated[str, StringConstraints(strict=True, max_length=MAX_NOTES),
                     AfterValidator(_no_nul)] | None = None
    tags: Annotated[list[Tag], Field(max_length=MAX_TAGS)] | None = None


class StepScalars(BaseModel):
    id: int
    attempt: int
    seq: int
    step: int
    wall_time: float
    loss: Tagged | None
    scale_before: Tagged | None
    scale_after: Tagged | None
    growth_tracker: int | None
    found_inf: bool
    skipped: bool
    grad_norm: Tagged | None
    lr: Tagged | None
    duration: Tagged | None


class LayerStatsRead(BaseModel):
    amax: list[float | None]
    amin_nz: list[float | None]
    zero_frac: list[float]
    subnormal_frac: list[float]
    underflow_frac: list[float]
    nan_count: list[int]
    inf_count: list[int]
    l2: list[float | None]


class RanksRead(BaseModel):
    """A step's per-rank values (wire v4 `ranks`), rank r at index r."""

    loss: list[Tagged | None]
    nonfinite: list[int | None]


class OptimizerRead(BaseModel):
    """One watched optimizer at one step (wire v4 `optimizers`)."""

    skipped: bool | None
    lr: list[Tagged | None]


class StepRead(StepScalars):
    """A step of `GET /api/runs/{id}/steps`: its scalars and wire v4's per-rank and
    per-optimizer values (null when not sent)."""

    ranks: RanksRead | None
    optimizers: list[OptimizerRead] | None


class StepFull(StepScalars):
    layers: LayerStatsRead | None


class StepLive(StepFull):
    """A step of the live socket: its scalars, per-layer statistics and wire v4's per-rank and
    per-optimizer values, the last two as `GET /api/runs/{id}/steps` gives them."""

    ranks: RanksRead | None
    optimizers: list[OptimizerRead] | None


class ActivationStatsRead(BaseModel):
    amax: list[Tagged | None]
    amin_nz: list[Tagged | None]
    zero_frac: list[float]
    subnormal_frac: list[float]
    underflow_frac: list[float]
    nan_count: list[int]
    inf_count: list[int]
    l2: list[Tagged | None]


class NonfiniteLayerRead(BaseModel):
    layer: int
    kind: NonfiniteKind


class MisuseRead(BaseModel):
    kind: MisuseKind
    detail: str


class HistogramRead(BaseModel):
    min_exp: int
    max_exp: int
    counts: list[list[int]]


class ForwardOriginRead(BaseModel):
    """Where a forward overflow began (wire `recheck.origin`)."""

    module: str
    input_finite: bool
    format: Literal["fp16", "bf16", "fp32"]


class RecheckRead(BaseModel):
    """The FP32 re-check of an overflow step (wire v3 `recheck`)."""

    status: RecheckStatus
    """persisted: NaN/inf also in FP32 (data or model); vanished: a range problem; failed."""
    loss: Tagged | None
    layers: list[NonfiniteLayerRead]
    """Layers whose FP32 gradient was non-finite, in backward order."""
    detail: str | None
    origin: ForwardOriginRead | None = None
    """The first module in forward order whose output overflowed in the re-run."""


def _absent(value: object) -> bool:
    return value is None


class ShadowRead(BaseModel):
    """The sampled FP32 shadow step of an applied step (wire v6 `shadow`)."""

    status: Literal["ok", "failed"]
    loss: Tagged | None
    """The FP32 loss of the step's batch from the step's weights."""
    rel_err: list[Tagged | None] | None
    """Per layer: ||g_amp - g_fp32|| / ||g_fp32|| (null: no gradient to compare)."""
    cosine: list[Tagged | None] | None
    """Per layer: the cosine similarity of the two gradients (null: no gradient)."""
    norm: list[Tagged | None] | None
    """Per layer: ||g_fp32||, the FP32 gradient's norm in true units (null: no gradient)."""
    detail: str | None


class StepExport(StepFull):
    """A step with everything stored for it (wire v2 … v4 fields null when not measured)."""

    captured: Captured | None
    nonfinite: list[NonfiniteLayerRead] | None
    misuse: list[MisuseRead] | None
    activations: ActivationStatsRead | None
    histogram: HistogramRead | None
    recheck: RecheckRead | None
    swallowed: list[float | None] | None
    """Per layer: the share of elements with a non-zero gradient that the optimizer step left
    unchanged (parameters held in FP16/BF16); null entries: not measured for that layer."""
    ranks: RanksRead | None
    optimizers: list[OptimizerRead] | None
    shadow: ShadowRead | None = Field(default=None, exclude_if=_absent)
    """Wire v6: the FP32 shadow step; left out of a step without one, as the hook sends it."""


class StepsPage(BaseModel):
    steps: list[StepRead]
    last_id: int


class FirstNonfiniteRead(BaseModel):
    """The earliest step where some rank went non-finite."""

    step: int
    ranks: list[int]
    """Where the step went bad: the ranks whose own loss was NaN/±inf when any (the gradients
    are after the all-reduce, so one rank's NaN reaches them all), else those whose gradients
    held one (count > 0); ascending."""
    loss: list[Tagged | None]
    """Every rank's loss at that step."""
    nonfinite: list[int | None]
    """Every rank's count of layers with a non-finite gradient at that step."""


class RanksSummaryRead(BaseModel):
    """`GET /api/runs/{id}/ranks`: which rank of a distributed run went non-finite first."""

    world_size: int
    first_nonfinite: FirstNonfiniteRead | None
    """null: no rank's loss or gradient was ever non-finite (or no step carried ranks)."""


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
    shadow: ShadowRead | None = Field(default=None, exclude_if=_absent)
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


class ExportRead(BaseModel):
    run: RunDetail
    layers: list[LayerInfo]
    modules: list[ModuleInfo]
    steps: list[StepExport]


class LiveSteps(BaseModel):
    type: Literal["steps"] = "steps"
    run_id: str
    steps: list[StepLive]
    last_id: int


class LiveStatus(BaseModel):
    type: Literal["status"] = "status"
    status: RunStatus


class LiveRuns(BaseModel):
    """WS /api/runs/live: run summaries, merged by id. `full` = the snapshot: the first page of
    `GET /api/runs` (newest first) with the cursor of the next page, and apart the other runs
    stored as active; else the runs that changed."""

    type: Literal["runs"] = "runs"
    full: bool
    runs: list[RunSummary]
    next_cursor: str | None = None
    """With `full`: the cursor of `GET /api/runs` after the list's first page (null: no more)."""
    total: int | None = None
    """With `full`: how many runs the viewer has."""
    active: list[RunSummary] = []
    """With `full`: the other runs stored as active, beyond the first page (to update)."""


# --- comparison (GET /api/compare; comparison_math has the definitions) --------------------

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
