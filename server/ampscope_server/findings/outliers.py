"""Activation outliers growing: a layer's input whose largest values grow while a few of them
pull away from the rest (wire v7 `formats`' operand statistics).

In low-precision training a handful of activation channels can grow outliers late in the run
(SwiGLU's in FP8, arXiv 2409.12517; MX's loss spikes, arXiv 2506.20752), and the kurtosis of
the activations rises before the loss diverges (arXiv 2505.20524). A per-tensor or per-block
scale then serves the outliers and flushes everything else. The hook's formats probe measures
each Linear/Conv module's input (amax, kurtosis) every `formats_every` steps; this detector
compares the median of the run's first OUTLIER_SAMPLES samples with the median of its last
ones. A layer is flagged when its input's amax grew OUTLIER_AMAX_GROWTH-fold or more AND its
recent kurtosis is at least OUTLIER_KURTOSIS and OUTLIER_KURTOSIS_GROWTH times the early one.
Both are needed: activations that grow evenly (weights growing, as early training does) keep
their kurtosis, and a heavy tail that was there from the start is the data's, not a trend.

    activation_outliers(run) -> [Finding]    warning: these layers' inputs grow outliers
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from ampscope_server.findings.facts import Finding, FormatsSample, RunData
from ampscope_server.findings.thresholds import (
    OUTLIER_AMAX_GROWTH,
    OUTLIER_KURTOSIS,
    OUTLIER_KURTOSIS_GROWTH,
    OUTLIER_SAMPLES,
)
from ampscope_server.store.format_packing import OPERAND_STATS, OPERANDS

_INPUT = OPERANDS.index("input")
_AMAX, _KURTOSIS = OPERAND_STATS.index("amax"), OPERAND_STATS.index("kurtosis")


def activation_outliers(run: RunData) -> list[Finding]:
    """Warning: the layers whose input activations grow outliers, largest growth first."""
    samples = run.formats
    if len(samples) < 2 * OUTLIER_SAMPLES:
        return []
    early, late = samples[:OUTLIER_SAMPLES], samples[-OUTLIER_SAMPLES:]
    grown: list[tuple[float, int, float, float, float, float]] = []
    for layer in sorted({layer for s in late for layer in s.layers}):
        a0, a1 = _median(early, layer, _AMAX), _median(late, layer, _AMAX)
        k0, k1 = _median(early, layer, _KURTOSIS), _median(late, layer, _KURTOSIS)
        if not (a0 > 0 and math.isfinite(a1) and math.isfinite(k0) and math.isfinite(k1)):
            continue
        if (a1 >= OUTLIER_AMAX_GROWTH * a0 and k1 >= OUTLIER_KURTOSIS
                and k1 >= OUTLIER_KURTOSIS_GROWTH * k0):
            grown.append((a1 / a0, layer, a0, a1, k0, k1))
    if not grown:
        return []
    grown.sort(key=lambda g: (-g[0], g[1]))
    names = [run.layer_name(layer) for _, layer, *_ in grown]
    start, end = early[0].step, late[-1].step
    listed = "; ".join(
        f"{run.layer_name(layer)}: amax {a0:.3g} → {a1:.3g} (x{growth:.3g}), kurtosis "
        f"{k0:.3g} → {k1:.3g}" for growth, layer, a0, a1, k0, k1 in grown)
    growth, _, _, _, _, k1 = grown[0]
    return [Finding(
        kind="activation_outliers", severity="warning",
        title=(f"The inputs of {len(grown)} layer(s) grow outliers (amax x{growth:.3g}, "
               f"kurtosis {k1:.3g}): {', '.join(names[:3])}"
               + (f" and {len(names) - 3} more" if len(names) > 3 else "")),
        explanation=(
            f"Between the first and the last {OUTLIER_SAMPLES} formats samples (steps {start} "
            f"to {end}), the input activations of these layers grew their largest values while "
            f"a few of them pulled away from the rest: {listed} (a Gaussian's kurtosis is 3). "
            "Outliers like these come before loss spikes in low-precision training: a "
            "tensor-wise or block scale set by the outliers flushes the other values."),
        recommendation=(
            f"Keep {', '.join(names[:3])} in BF16 under FP8/MX recipes (the Formats view shows "
            "what each recipe loses there), and look at what feeds them: a normalisation "
            "missing or its affine weight growing, a learning rate or weight decay that lets a "
            "channel grow, a SwiGLU whose gate and value align (Smooth-SwiGLU damps it)."),
        step_start=start, step_end=end, layers=names,
        evidence={"layers": len(grown), "max_amax_growth": growth, "kurtosis": k1,
                  "amax_growth_threshold": OUTLIER_AMAX_GROWTH,
                  "kurtosis_threshold": OUTLIER_KURTOSIS},
    )]


def _median(samples: Sequence[FormatsSample], layer: int, stat: int) -> float:
    """The median of the layer's input statistic over the samples that measured it."""
    values = [v for s in samples if layer in s.layers
              if math.isfinite(v := s.operand(s.layers.index(layer), _INPUT, stat))]
    return statistics.median(values) if values else math.nan
