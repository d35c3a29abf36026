"""A run's read API (docs/contracts.md "Read API"): its summary, detail, steps and export.

Every output float that may be non-finite is `Tagged`: finite → number, non-finite → "nan" /
"inf" / "-inf", so that a browser's `JSON.parse` always succeeds.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from ampscope_server.findings.schemas import FindingBrief, FormatLimits
from ampscope_server.ingest.wire import (
    MAX_TAGS,
    Captured,
    ClientAccounting,
    MisuseKind,
    NonfiniteKind,
    RecheckStatus,
)
from ampscope_server.runs.json_floats import Tagged, TaggedValues


class RunStatus(str, Enum):
    ACTIVE = "active"
    FINISHED = "finished"
    CRASHED = "crashed"


class DeletedRead(BaseModel):
    id: str
    project: str
    deleted_at: float
    steps: int
    """How many steps were deleted with the run."""


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


def absent(value: object) -> bool:
    """`exclude_if` of an optional field left out of the output when it is None."""
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


class TrainedExport(BaseModel):
    """Wire v7 `formats.trained` as the JSON form sends it (flat, tagged)."""

    recipes: list[str | None]
    amax: TaggedValues
    scale: TaggedValues


class FormatsExport(BaseModel):
    """Wire v7 `formats` (v8: with `scales`) as the JSON form sends it: the float64 values in
    flat arrays, row-major as on the wire (NaN and ±inf tagged, -0.0 kept), whether they arrived
    packed or not."""

    recipes: list[str]
    layers: list[int]
    values: TaggedValues
    """len(layers) x 3 x len(recipes) x 5, over (layer, operand, recipe, statistic)."""
    operands: TaggedValues
    """len(layers) x 3 x 4, over (layer, operand, operand statistic)."""
    trained: TrainedExport | None = Field(default=None, exclude_if=absent)
    """As sent: only when some module trains in a recipe."""
    scales: TaggedValues | None = Field(default=None, exclude_if=absent)
    """v8, as sent (absent from earlier clients): len(layers) x 3 x len(recipes) x 17, the
    greatest block scale exponent then the blocks' counts by binades below it."""


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
    shadow: ShadowRead | None = Field(default=None, exclude_if=absent)
    """Wire v6: the FP32 shadow step; left out of a step without one, as the hook sends it."""
    formats: FormatsExport | None = Field(default=None, exclude_if=absent)
    """Wire v7: the scaled-format what-ifs of a sampled step; left out of a step without them,
    as the hook sends it."""


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
