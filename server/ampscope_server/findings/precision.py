"""Layers whose gradient the low-precision format gets wrong, measured (wire v6 `shadow`).

The hook's FP32 shadow step (`watch(shadow_every=N)`) re-runs an applied step's batch in FP32
from the same weights and compares each layer's gradient with the AMP one:
`rel_err = ||g_amp - g_fp32|| / ||g_fp32||`. FP16's 11-bit significand alone leaves a few 1e-4
to 1e-3 of it; a layer at SHADOW_REL_ERR_WARN (10 %) or more in the median of the recent
shadow steps computes something the format cannot hold (an overflowing or cancelling op, a
reduction that underflows): that layer, not the whole model, belongs in FP32 (or BF16).

Only finite rel_err values count: NaN says FP32's own gradient was 0 (or non-finite), which
is not a precision measurement. Nor does a layer whose FP32 gradient is negligible at that
shadow step: its norm below SHADOW_NEGLIGIBLE_NORM_FRAC of the largest layer's, unless its AMP
and FP32 gradients keep one direction there (median cosine ≥ SHADOW_COHERENT_COSINE: a small but
real gradient, as from inputs subnormal in FP16). A bias followed by BatchNorm has a true
gradient of 0; FP32 leaves rounding noise there (~1e-8 of the largest layer's, in no particular
direction), and any AMP difference is then thousands of times "its" gradient. A layer's median
is over the shadow steps where it was judged.

    precision_sensitive(run) -> [Finding]    warning: these layers need FP32/BF16
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from ampscope_server.findings.facts import Finding, RunData, ShadowSample
from ampscope_server.findings.thresholds import (
    SHADOW_COHERENT_COSINE,
    SHADOW_NEGLIGIBLE_NORM_FRAC,
    SHADOW_REL_ERR_WARN,
)


def judged(shadow: ShadowSample) -> tuple[dict[int, float], dict[int, tuple[float, float]]]:
    """At this shadow step, ({layer: rel_err} of the layers with a finite rel_err and an FP32
    norm above 0 and at least SHADOW_NEGLIGIBLE_NORM_FRAC of the step's largest finite one},
    {layer: (rel_err, cosine)} of those with a finite rel_err and a norm above 0 below it)."""
    largest = max((n for n in shadow.norm if n is not None and math.isfinite(n)), default=0.0)
    floor = SHADOW_NEGLIGIBLE_NORM_FRAC * largest
    judged_now: dict[int, float] = {}
    faint: dict[int, tuple[float, float]] = {}
    for layer, (err, norm, cosine) in enumerate(zip(shadow.rel_err, shadow.norm, shadow.cosine,
                                                    strict=True)):
        if err is None or not math.isfinite(err) or norm is None or not math.isfinite(norm) \
                or norm <= 0:
            continue
        if norm >= floor:
            judged_now[layer] = err
        else:
            faint[layer] = (err, math.nan if cosine is None else cosine)
    return judged_now, faint


def layer_medians(shadows: Sequence[ShadowSample]) -> tuple[dict[int, float], int]:
    """({layer: its median rel_err over the shadow steps where it was judged}, how many layers
    had a finite rel_err but were never judged). Below the norm floor a layer is judged when
    the median of its cosines there is SHADOW_COHERENT_COSINE or more (a small but real
    gradient), else its rel_err there measures rounding noise and is left out."""
    values: dict[int, list[float]] = {}
    faint: dict[int, list[tuple[float, float]]] = {}
    measured: set[int] = set()
    for shadow in shadows:
        measured.update(layer for layer, err in enumerate(shadow.rel_err)
                        if err is not None and math.isfinite(err))
        judged_now, faint_now = judged(shadow)
        for layer, err in judged_now.items():
            values.setdefault(layer, []).append(err)
        for layer, pair in faint_now.items():
            faint.setdefault(layer, []).append(pair)
    for layer, pairs in faint.items():
        cosines = [cosine for _, cosine in pairs if math.isfinite(cosine)]
        if cosines and statistics.median(cosines) >= SHADOW_COHERENT_COSINE:
            values.setdefault(layer, []).extend(err for err, _ in pairs)
    medians = {layer: statistics.median(errs) for layer, errs in values.items()}
    return medians, len(measured - medians.keys())


def precision_sensitive(run: RunData) -> list[Finding]:
    """Warning: the layers whose median shadow rel_err, where their FP32 gradient is not
    negligible, is SHADOW_REL_ERR_WARN or more, worst first."""
    if not run.shadows:
        return []
    medians, negligible = layer_medians(run.shadows)
    flagged = sorted((layer for layer, err in medians.items() if err >= SHADOW_REL_ERR_WARN),
                     key=lambda layer: (-medians[layer], layer))
    if not flagged:
        return []
    names = [run.layer_name(layer) for layer in flagged]
    worst = medians[flagged[0]]
    steps = [s.step for s in run.shadows]
    listed = ", ".join(f"{run.layer_name(layer)} ({medians[layer]:.3g})" for layer in flagged)
    keep = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    left_out = (
        f" {negligible} layer(s) whose FP32 gradient was below {SHADOW_NEGLIGIBLE_NORM_FRAC:g} "
        "of the largest layer's at every shadow step, in no steady direction (a true gradient "
        "of ~0, rounding noise in FP32 too), were not judged." if negligible else "")
    return [Finding(
        kind="precision_sensitive", severity="warning",
        title=(f"{len(flagged)} layer(s) compute a gradient {worst:.0%} off FP32's: keep "
               f"{keep} in FP32/BF16"),
        explanation=(
            f"The FP32 shadow steps ({len(steps)} from step {steps[0]} to {steps[-1]}: the same "
            f"weights and batch without autocast or scaling) put the {run.target_format} "
            f"gradient's relative error (||g_amp - g_fp32|| / ||g_fp32||, median over those "
            f"steps) at {listed}, where the format's rounding alone gives about 1e-3. These "
            "layers' forward or backward loses what the format cannot hold; the rest of the "
            f"model does not.{left_out}"),
        recommendation=(
            f"Keep {keep} in FP32/BF16: run it under torch.autocast(enabled=False) with FP32 "
            "inputs (or autocast to bfloat16 there), and leave the rest of the model in "
            f"{run.target_format}."),
        step_start=steps[0], step_end=steps[-1], layers=names,
        evidence={"shadow_steps": len(steps), "max_median_rel_err": worst,
                  "sensitive_layers": len(flagged), "negligible_layers": negligible,
                  "threshold": SHADOW_REL_ERR_WARN,
                  "negligible_norm_frac": SHADOW_NEGLIGIBLE_NORM_FRAC},
    )]
