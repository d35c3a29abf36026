"""The chart reads' output: series, events, skip rates, optimizers, heatmaps, scaled-format
what-ifs. Every float that may be non-finite is `Tagged`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ampscope_server.ingest.wire import MisuseKind, NonfiniteKind
from ampscope_server.runs.json_floats import Tagged, TaggedRows, TaggedValues
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


FormatOperand = Literal["input", "weight", "grad_output"]
"""`format_packing.OPERANDS`, as a query parameter's type (an unknown operand is a 422)."""


class FormatStepRead(BaseModel):
    """A sampled step that carried format what-ifs (wire v7 `formats`)."""

    id: int
    """The step's row id (as `/steps`' `id`)."""
    step: int


class FormatLayerRead(BaseModel):
    index: int
    """The layer table's row (the module's weight)."""
    name: str


class FormatTrainedRead(BaseModel):
    """The recipe each layer's module really trains in (null: none), with the amax and scale
    it used per operand (`[layer][operand]`; "nan": not kept)."""

    recipes: list[str | None]
    amax: TaggedRows
    scale: TaggedRows


class FormatMatrixRead(BaseModel):
    """Every measured value of one sampled step, as sent: nested in the wire's order, so
    `values[l][o]` is a recipe x statistic matrix for layer `layers[l]` and operand
    `operand_names[o]`, and a page draws a layer x recipe matrix per operand and statistic."""

    id: int
    step: int
    recipes: list[str]
    layers: list[FormatLayerRead]
    values: list[list[TaggedRows]]
    """[layer][operand][recipe][statistic], statistics in `stat_names`' order. "nan": not
    measured (a module without a gradient this step); ±inf are data."""
    operands: list[TaggedRows]
    """[layer][operand][operand statistic], in `operand_stat_names`' order."""
    trained: FormatTrainedRead | None
    """Null when no module of this step trains in a recipe."""


class KeepRead(BaseModel):
    """One layer a recipe's verdict keeps in BF16, and the number that decided it
    (`findings.recipe_fit`)."""

    layer: str
    operand: str
    stat: str
    """`rel_rmse` or `underflow_frac`."""
    value: Tagged
    median: Tagged
    """The other layers' median of the same statistic ("nan": the gradient-noise rule, which
    compares with no other layer; for a norm's affine weight, the GEMM weights' median)."""
    scale_min_frac: Tagged
    """The share of the operand's blocks whose scale sat at its least value ("nan": unknown)."""


class RecipeVerdictRead(BaseModel):
    """Could the run train in this recipe, and which layers must stay in BF16."""

    recipe: str
    step: int
    """The sampled step the verdict is as of (with the samples just before it)."""
    measured: int
    """Layers the samples measured."""
    summary: str
    keep: list[KeepRead]
    """In layer-table order; empty: no layer stands out from the others."""
    grad_underflow: Tagged
    """The median layer's output-gradient underflow under the recipe ("nan": none measured)."""
    uniform_loss: bool
    """True: that median is 15 % or more, a loss everywhere (`summary` says so)."""
    norms_measured: int
    """Normalisation layers' affine weights the samples measured (not among `measured`)."""
    norms: list[KeepRead]
    """The affine weights a fully quantised run should keep in BF16 under the recipe, in
    layer-table order (`operand` is `weight`)."""


class FormatsRead(BaseModel):
    """`GET /api/runs/{id}/formats`: the run's sampled steps, thinned to at most `limit` (the
    first and the last always among them), and the full matrix of one of them."""

    operand_names: list[str]
    stat_names: list[str]
    operand_stat_names: list[str]
    sampled: int
    """How many sampled steps the run has (`steps` holds them all unless `downsampled`)."""
    downsampled: bool
    """True: `steps` is `limit` of them spread evenly, in step order, not every one."""
    steps: list[FormatStepRead]
    matrix: FormatMatrixRead | None
    """The sampled step at or before `step` (the last one without `step`); null when there is
    none (no sampled step, or none that early)."""
    verdicts: list[RecipeVerdictRead]
    """One per recipe of `matrix`, as of its step (empty without it)."""


class FormatTrendRead(BaseModel):
    """`GET /api/runs/{id}/formats/trend`: one (layer, operand, recipe) over the same sampled
    steps as `/formats` keeps. A layer or recipe the run never recorded (past the table, a
    module the hook did not sample, a recipe another hook version measures) is not an error:
    which layers and recipes a step carries is the hook's choice and may change between steps
    and attempts, so the answer is the steps that carried it, none at all being an empty
    series (a step that lacks it is left out, not a gap)."""

    layer: int
    name: str | None
    """The layer table's name of `layer`; null past the table."""
    operand: FormatOperand
    recipe: str
    sampled: int
    downsampled: bool
    steps: list[int]
    ids: list[int]
    values: dict[str, TaggedValues]
    """Each of the recipe's five statistics (keys in `FORMAT_STATS` order), one per step."""
    operand_values: dict[str, TaggedValues]
    """The operand's own four statistics (keys in `OPERAND_STATS` order), one per step."""
    scales: list[ScaleExponentsRead | None]
    """The recipe's block scale exponents, one per step; null where the step has none (not
    measured, or sent by a client before wire v8)."""


class ScaleExponentsRead(BaseModel):
    """How the scales of a recipe's blocks holding a non-zero value spread over their
    exponents at one sampled step (the scale as its format stores it: MX's E8M0, NVFP4's E4M3
    block scale, the FP8 recipes' FP32 dequantising factor; its exponent ⌊log2⌋)."""

    top: int | None
    """The greatest exponent; null when no block held a non-zero value."""
    counts: list[int]
    """`SCALE_BINS` counts of blocks: `[k]` k binades below `top`, the last that many or more."""
