"""Could this run train in format X, and which layers must stay in BF16? (wire v7 `formats`)

Every `formats_every` steps the hook quantises each Linear/Conv module's input, weight and
output gradient as each recipe would (FP8 tensor-wise, row-wise, 128-blocks, MXFP8, MXFP4,
NVFP4) and measures what is lost. A layer must stay in BF16 under a recipe when, in the median
of the recent samples:

- its **gradient drowns in the quantisation noise**: ‖g‖ / ‖q(g) - g‖ (= 1 / rel_rmse) below
  RECIPE_GRAD_MIN_SNR (√3: below it the gradient stops being useful, arXiv 2505.19115); or
- one of its operands **loses far more than the run's other layers do** under the same recipe:
  its rel_rmse or its underflow share at least RECIPE_OUTLIER_FACTOR times the median of the
  other layers' and at least RECIPE_ERROR_FLOOR / RECIPE_UNDERFLOW_FLOOR. Each format loses a
  share of any operand by construction (FP4 flushes several percent of a Gaussian block, NVFP4
  clamps the amax of about half its blocks where the E4M3 scale rounds down), so a fixed bar
  would fail every layer of FP4 or none of FP8; what a recipe gets wrong in one layer and not
  the others is what the papers find behind MX's loss spikes (LayerNorm-fed operands, a few
  outlier activations, arXiv 2506.20752) and what NVIDIA's NVFP4 recipe keeps in BF16.

And a recipe under which the median layer's gradient loses RECIPE_UNIFORM_UNDERFLOW of its
values to zero is said to lose them everywhere (`uniform_loss`), which no comparison between
layers can see.

**Normalisation layers' affine weights** (the rows whose parameter is 1-D: `norms`) are no
GEMM operand: torchao and TransformerEngine never quantise them, and they are neither counted
among the measured layers nor compared with them. A fully quantised run would quantise them,
and the multiplicative noise that adds to every channel is what arXiv 2506.20752 finds behind
MX's loss spikes. Each is a per-channel gain, so an affine weight stays in BF16 under a recipe
when quantising it flushes any of its gains to zero (that channel switched off), or when its
error is RECIPE_OUTLIER_FACTOR times the GEMM weights' median (and at least
RECIPE_ERROR_FLOOR): `RecipeVerdict.norms`. Gains near 1, as a norm is initialised and mostly
stays, lose no more than a Gaussian weight does; a gain clamped at the format's maximum (MX's
power-of-two scale clamps the top of a block) costs what rounding does, so counts in the
error.

The evidence of each layer says which operand and statistic, the value and the median's, and
for block recipes the share of blocks whose scale was pinned at its limit. A what-if, not a
diagnosis of the run: these verdicts are served with the formats (`GET
/api/runs/{id}/formats`), never among the run's findings.

    verdicts(samples, layer_names, norms) -> [RecipeVerdict]   one per recipe of the latest sample
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ampscope_server.findings.facts import FormatsSample
from ampscope_server.findings.thresholds import (
    RECIPE_ERROR_FLOOR,
    RECIPE_GRAD_MIN_SNR,
    RECIPE_OUTLIER_FACTOR,
    RECIPE_RECENT_SAMPLES,
    RECIPE_UNDERFLOW_FLOOR,
    RECIPE_UNIFORM_UNDERFLOW,
)
from ampscope_server.store.format_packing import FORMAT_STATS
from ampscope_server.store.format_packing import OPERANDS as FORMAT_OPERANDS

_UNDERFLOW, _SATURATED, _REL_RMSE, _SCALE_MIN, _SCALE_MAX = range(len(FORMAT_STATS))
_GRAD = FORMAT_OPERANDS.index("grad_output")
_WEIGHT = FORMAT_OPERANDS.index("weight")


@dataclass(frozen=True)
class KeepReason:
    """Why one layer stays in BF16 under one recipe: the operand and statistic that decided,
    its value and the other layers' median (NaN for the noise rule), the share of blocks whose scale
    sat at its least value."""

    operand: str
    stat: str
    value: float
    median: float
    scale_min_frac: float


@dataclass(frozen=True)
class RecipeVerdict:
    """One recipe: how many layers were measured, which must stay in BF16 (model order) and
    why, as of `step` (the latest sample), and the median layer's output-gradient underflow
    (NaN: no gradient measured): RECIPE_UNIFORM_UNDERFLOW or more is a loss everywhere. Apart:
    how many norms' affine weights were measured and which a fully quantised run keeps in
    BF16."""

    recipe: str
    step: int
    measured: int
    keep: tuple[tuple[str, KeepReason], ...]
    grad_underflow: float = math.nan
    norms_measured: int = 0
    norms: tuple[tuple[str, KeepReason], ...] = ()

    @property
    def uniform_loss(self) -> bool:
        return self.grad_underflow >= RECIPE_UNIFORM_UNDERFLOW

    @property
    def summary(self) -> str:
        everywhere = (f"the median layer's gradient loses {self.grad_underflow:.0%} of its "
                      "values to zero" if self.uniform_loss else "")
        norms = (f"; quantised too, {len(self.norms)} of {self.norms_measured} norms' affine "
                 f"weights need BF16 ({_names(self.norms)})" if self.norms else "")
        if not self.keep:
            if everywhere:
                return f"{self.recipe}: no layer stands out, but {everywhere}{norms}"
            return f"{self.recipe}: all {self.measured} layers fit{norms}"
        return (f"{self.recipe}: {len(self.keep)} of {self.measured} layers need BF16 "
                f"({_names(self.keep)})" + (f"; and {everywhere}" if everywhere else "")
                + norms)


def _names(kept: Sequence[tuple[str, KeepReason]]) -> str:
    """The first three names, and how many more."""
    more = f" and {len(kept) - 3} more" if len(kept) > 3 else ""
    return ", ".join(name for name, _ in kept[:3]) + more


def verdicts(samples: Sequence[FormatsSample], layer_names: Sequence[str],
             norms: Collection[int] = frozenset()) -> list[RecipeVerdict]:
    """Per recipe of the latest sample, over the last RECIPE_RECENT_SAMPLES samples holding it.
    `layer_names`: the layer table's names (a sample's `layers` index it); `norms`: its rows
    that are a normalisation layer's affine weight."""
    if not samples:
        return []
    latest = samples[-1]
    out = []
    for recipe in latest.recipes:
        recent = [s for s in samples if recipe in s.recipes][-RECIPE_RECENT_SAMPLES:]
        medians = _layer_medians(recent, recipe)
        gemms = {layer: m for layer, m in medians.items() if layer not in norms}
        affine = {layer: m for layer, m in medians.items() if layer in norms}
        grads = [m[_GRAD][_UNDERFLOW] for m in gemms.values()
                 if math.isfinite(m[_GRAD][_UNDERFLOW])]
        out.append(RecipeVerdict(recipe, latest.step, len(gemms), _keep(gemms, layer_names),
                                 statistics.median(grads) if grads else math.nan,
                                 len(affine), _keep_norms(affine, gemms, layer_names)))
    return out


def _layer_medians(samples: Sequence[FormatsSample], recipe: str
                   ) -> dict[int, list[list[float]]]:
    """{layer row: [operand][stat] median over the samples, NaN where never measured}."""
    series: dict[int, list[list[list[float]]]] = {}
    for sample in samples:
        r = sample.recipes.index(recipe)
        for k, layer in enumerate(sample.layers):
            cells = series.setdefault(layer, [[[] for _ in FORMAT_STATS]
                                              for _ in FORMAT_OPERANDS])
            for o in range(len(FORMAT_OPERANDS)):
                for s in range(len(FORMAT_STATS)):
                    value = sample.value(k, o, r, s)
                    if math.isfinite(value):
                        cells[o][s].append(value)
    return {layer: [[statistics.median(v) if v else math.nan for v in operand]
                    for operand in cells]
            for layer, cells in sorted(series.items())}


def _keep(medians: dict[int, list[list[float]]], names: Sequence[str]
          ) -> tuple[tuple[str, KeepReason], ...]:
    peers = {(o, s): sorted(v for m in medians.values() if math.isfinite(v := m[o][s]))
             for o in range(len(FORMAT_OPERANDS)) for s in (_UNDERFLOW, _REL_RMSE)}
    keep = []
    for layer, m in medians.items():
        reason = _reason(m, peers)
        if reason is not None:
            keep.append((_name(layer, names), reason))
    return tuple(keep)


def _name(layer: int, names: Sequence[str]) -> str:
    return names[layer] if layer < len(names) else f"layer {layer}"


def _keep_norms(affine: dict[int, list[list[float]]], gemms: dict[int, list[list[float]]],
                names: Sequence[str]) -> tuple[tuple[str, KeepReason], ...]:
    """The norms' affine weights a fully quantised run keeps in BF16 (model order): any gain
    flushed, or an error RECIPE_OUTLIER_FACTOR times the GEMM weights' median."""
    peers = {s: [v for m in gemms.values() if math.isfinite(v := m[_WEIGHT][s])]
             for s in (_UNDERFLOW, _REL_RMSE)}
    median = {s: statistics.median(v) if v else math.nan for s, v in peers.items()}
    keep = []
    for layer, m in affine.items():
        weight = m[_WEIGHT]
        error = weight[_REL_RMSE]  # NaN (not measured) passes neither test
        if weight[_UNDERFLOW] > 0:
            decided = _UNDERFLOW
        elif error >= RECIPE_ERROR_FLOOR and error >= RECIPE_OUTLIER_FACTOR * median[_REL_RMSE]:
            decided = _REL_RMSE
        else:
            continue
        keep.append((_name(layer, names), KeepReason(
            "weight", FORMAT_STATS[decided], weight[decided], median[decided],
            weight[_SCALE_MIN])))
    return tuple(keep)


def _reason(m: list[list[float]], peers: dict[tuple[int, int], list[float]]
            ) -> KeepReason | None:
    grad_error = m[_GRAD][_REL_RMSE]
    if math.isfinite(grad_error) and grad_error * RECIPE_GRAD_MIN_SNR > 1:
        return KeepReason("grad_output", "rel_rmse", grad_error, math.nan, m[_GRAD][_SCALE_MIN])
    for o, operand in enumerate(FORMAT_OPERANDS):
        for s, floor in ((_UNDERFLOW, RECIPE_UNDERFLOW_FLOOR), (_REL_RMSE, RECIPE_ERROR_FLOOR)):
            value = m[o][s]
            if not math.isfinite(value) or value < floor:
                continue
            others = _median_without(peers[o, s], value)
            if others is not None and value >= RECIPE_OUTLIER_FACTOR * others:
                return KeepReason(operand, FORMAT_STATS[s], value, others, m[o][_SCALE_MIN])
    return None


def _median_without(ordered: list[float], value: float) -> float | None:
    """The median of the sorted `ordered` less one occurrence of `value` (None: nothing left)."""
    rest = list(ordered)
    del rest[bisect.bisect_left(rest, value)]
    return statistics.median(rest) if rest else None
