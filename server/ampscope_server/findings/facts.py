"""The findings engine's input (a plain snapshot of one run) and output (`Finding`).

Everything here is a frozen dataclass of numbers and names: no ORM objects, no torch, so the
detectors stay pure functions that a test can feed by hand. Units follow DESIGN.md §3: per-layer
statistics are in **true units** (already divided by the scale in effect), and each sample keeps
the scale it was taken at, so scaled values (`amax · scale`) can always be derived.

A snapshot may be *sparse* in steps: the loader keeps every step the detectors look at (skipped,
scale-changing, non-finite loss or grad norm, their neighbours, first and last) rather than every
row of a 1M-step run. Step numbers are the framework's global step (count of `scaler.update()`
calls, skipped steps included), so a window of W step numbers always spans W optimizer attempts
whether or not each one is in `steps`; detectors count in step numbers, never in list positions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ampscope_server.store.format_packing import FORMAT_STATS, OPERAND_STATS
from ampscope_server.store.format_packing import OPERANDS as FORMAT_OPERANDS

Severity = Literal["info", "warning", "error"]
SEVERITY_RANK: Mapping[Severity, int] = {"info": 0, "warning": 1, "error": 2}
NonfiniteKind = Literal["nan", "inf"]


@dataclass(frozen=True)
class StepPoint:
    """One optimizer step's scalars. Floats may be NaN/±inf; None means not recorded."""

    step: int
    scale_before: float | None
    """The scale in effect during the step (before `update()`)."""
    scale_after: float | None
    found_inf: bool
    skipped: bool
    loss: float | None = None
    grad_norm: float | None = None
    """Global L2 norm, true units: NaN if any gradient held NaN, inf if any held inf."""
    lr: float | None = None
    growth_tracker: int | None = None


@dataclass(frozen=True)
class LayerInfo:
    """A row of the layer table (parameters, in model order)."""

    name: str
    dtype: str = "float32"
    """The parameter's storage dtype as torch names it (`float16` = held in FP16)."""
    shape: tuple[int, ...] = ()
    numel: int = 0
    module_type: str = ""


@dataclass(frozen=True)
class LayerSample:
    """One layer's gradient statistics at one step, true units (DESIGN.md §3)."""

    step: int
    layer: int
    """Index into `RunData.layers`."""
    scale: float | None
    """The scale in effect when the statistics were taken (None: unknown, read as 1)."""
    amax: float | None
    amin_nz: float | None
    zero_frac: float
    underflow_frac: float
    subnormal_frac: float = 0.0
    nan_count: int = 0
    inf_count: int = 0
    l2: float | None = None
    param_rms: float | None = None
    """RMS of the parameter's *values* when the hook measures it (not sent today): lets
    `swallowed_updates` use the real weight magnitude instead of the init-scale estimate."""

    @property
    def lost_frac(self) -> float:
        """Share of the gradient lost at this scale: exact zeros plus values that would flush."""
        return min(1.0, self.zero_frac + self.underflow_frac)


@dataclass(frozen=True)
class NonfiniteStep:
    """The layers whose gradient held NaN/±inf at a `found_inf` step, in backward order
    (the first layer the backward pass produced comes first)."""

    step: int
    layers: tuple[tuple[int, NonfiniteKind], ...]


@dataclass(frozen=True)
class MisuseEvent:
    step: int
    kind: str
    """`clip_before_unscale` | `step_bypassed_scaler` | `unscale_twice` (wire v2)."""
    detail: str = ""


@dataclass(frozen=True)
class ShadowSample:
    """The hook's FP32 shadow step at one applied step (wire v6 `shadow`, status ok): the FP32
    loss of the step's batch from the step's weights, and per layer
    `||g_amp - g_fp32|| / ||g_fp32||` (None: no gradient to compare; NaN: FP32's is 0) and
    `||g_fp32||` (None: no gradient), and the two gradients' cosine (None: no gradient; NaN:
    one of them is 0), each as long as `rel_err`."""

    step: int
    loss: float | None
    rel_err: tuple[float | None, ...]
    norm: tuple[float | None, ...]
    cosine: tuple[float | None, ...]


@dataclass(frozen=True)
class SwallowedSample:
    """The hook's measured swallowed-update fraction of one layer at one step (wire v3): among
    the elements with a finite non-zero gradient, the share whose low-precision value the
    optimizer step left unchanged."""

    step: int
    layer: int
    frac: float


RecheckStatus = Literal["persisted", "vanished", "failed"]


@dataclass(frozen=True)
class ForwardOrigin:
    """Where a step's forward overflow began, read by the FP32 re-check's forward hooks: the
    first module in forward order whose output was NaN/inf (`format` "fp32") or beyond the
    training format's range (`format` that format), and whether its inputs were finite."""

    module: str
    input_finite: bool
    format: str


@dataclass(frozen=True)
class RankStep:
    """The earliest step of a distributed run where some rank went non-finite (wire v4): each
    rank's loss (None: not recorded) and count of layers with a NaN/inf gradient (None:
    unknown), rank r at index r; `ranks` where it started (`rank_packing.origin_ranks`: the
    ranks whose loss was non-finite, else those whose gradients were), ascending."""

    world_size: int
    step: int
    ranks: tuple[int, ...]
    loss: tuple[float | None, ...]
    nonfinite: tuple[int | None, ...]


@dataclass(frozen=True)
class FormatsSample:
    """One sampled step of the formats probe (wire v7 `formats`): for each measured layer (a
    row of the layer table), operand (`FORMAT_OPERANDS`) and recipe the `FORMAT_STATS`, and for
    each layer and operand its `OPERAND_STATS`; NaN where not measured."""

    step: int
    recipes: tuple[str, ...]
    layers: tuple[int, ...]
    values: Sequence[float]
    """len(layers) · len(FORMAT_OPERANDS) · len(recipes) · len(FORMAT_STATS), row-major."""
    operands: Sequence[float]
    """len(layers) · len(FORMAT_OPERANDS) · len(OPERAND_STATS), row-major."""

    def value(self, layer: int, operand: int, recipe: int, stat: int) -> float:
        """By position in `layers`, `FORMAT_OPERANDS`, `recipes` and `FORMAT_STATS`."""
        at = ((layer * len(FORMAT_OPERANDS) + operand) * len(self.recipes) + recipe)
        return self.values[at * len(FORMAT_STATS) + stat]

    def operand(self, layer: int, operand: int, stat: int) -> float:
        """By position in `layers`, `FORMAT_OPERANDS` and `OPERAND_STATS`."""
        return self.operands[(layer * len(FORMAT_OPERANDS) + operand) * len(OPERAND_STATS)
                             + stat]


@dataclass(frozen=True)
class RunData:
    """Everything the detectors read about one run.

    `layer_samples` holds the per-layer statistics of a bounded set of layer-stat steps, in
    (step, layer) order: at least the run's most recent ones (what "the current scale" means)
    and, for baseline comparison, steps spread over the run. `nan_context` maps a step that
    held NaN to the per-layer samples of the last layer-stat step before it (the headroom the
    layers had just before), when the loader could find one. `swallowed` (measured, recent
    steps only) and `rechecks` are empty when the hook did not measure them.
    """

    target_format: str
    layers: Sequence[LayerInfo]
    steps: Sequence[StepPoint]
    layer_samples: Sequence[LayerSample] = ()
    nonfinite: Sequence[NonfiniteStep] = ()
    misuse: Sequence[MisuseEvent] = ()
    misuse_totals: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)
    """{misuse kind: (steps, first step, last step)} over the whole run, where the loader counted
    them (`misuse` may hold only the first events); empty: count `misuse`."""
    nan_context: Mapping[int, Sequence[LayerSample]] = field(default_factory=dict)
    swallowed: Sequence[SwallowedSample] = ()
    rechecks: Mapping[int, RecheckStatus] = field(default_factory=dict)
    """{step: outcome of the hook's FP32 re-check of that overflow step} (`mon.recheck`)."""
    recheck_losses: Mapping[int, float] = field(default_factory=dict)
    """{step: the FP32 re-check's loss at that step} (NaN/±inf as such), where it gave one:
    its magnitude against the run's own healthy loss tells a range overflow from a divergence
    (`findings.divergence`)."""
    forward_origins: Mapping[int, ForwardOrigin] = field(default_factory=dict)
    """{step: where its forward overflow began} (`mon.recheck`'s hooks), where one was read."""
    shadows: Sequence[ShadowSample] = ()
    formats: Sequence[FormatsSample] = ()
    """The first and the last OUTLIER_SAMPLES formats samples (`findings.outliers`), in step
    order; all of them on a run with fewer."""
    """The run's recent FP32 shadow steps (`watch(shadow_every=N)`) in step order; empty when
    the hook ran none."""
    name: str = ""
    first_rank: RankStep | None = None
    """A distributed run's first step where a rank went non-finite (None: none, or not a
    distributed run)."""

    def layer_name(self, index: int) -> str:
        return self.layers[index].name if 0 <= index < len(self.layers) else f"#{index}"


@dataclass(frozen=True)
class Finding:
    """One diagnosis: what happened, where (steps, layers), why, and what to change.

    `evidence` holds the numbers the explanation rests on (counts, rates, scales, bits); its
    values may be NaN/±inf (tagged on the way out like every API float).
    """

    kind: str
    severity: Severity
    title: str
    """One line."""
    explanation: str
    """One paragraph: what the data shows and why it matters."""
    recommendation: str
    step_start: int | None = None
    step_end: int | None = None
    layers: list[str] = field(default_factory=list)
    """Layer names, most responsible first."""
    evidence: dict[str, float] = field(default_factory=dict)
    subject: str = ""
    """What tells two findings of one kind apart (the misuse kind of `amp_misuse`); empty for
    kinds that raise at most one finding per run."""
    cause: str | None = None
    """The `identity` of the finding this one follows from (findings/causes.py), None for a root
    cause: its recommendation then defers to the cause's."""
    held_since: int | None = None
    """None when the latest analysis raised this finding; else the last step at which one did
    (findings/stability.py keeps it shown for HOLD_STEPS steps: no blinking)."""

    @property
    def identity(self) -> str:
        """Stable across live analyses: kind plus subject. Its layers, numbers and title update
        in place; the layers inside it have their own hysteresis (`gradients.py`)."""
        return f"{self.kind}:{self.subject}" if self.subject else self.kind


def is_nan(value: float | None) -> bool:
    return value is not None and math.isnan(value)


def is_nonfinite(value: float | None) -> bool:
    return value is not None and not math.isfinite(value)
