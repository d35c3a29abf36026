"""Detectors over per-layer gradient statistics: underflow at the current scale and updates
swallowed by FP16 parameters.

Both judge "now": the last UNDERFLOW_RECENT_SAMPLES layer-stat steps of the snapshot, taking
each layer's median there so one odd batch does not decide. Both take the layers a previous
live analysis flagged (`holding`): while the finding is shown, every layer is judged against the
exit threshold (hysteresis, findings/stability.py), so neither a median hovering at the entry
threshold nor the cited layer recovering while another stays between the two thresholds can
flip the finding. The hysteresis is the finding's, not the cited layers': judged per cited layer,
a finding citing only `a` went away when `a` recovered and came back when `b`, never cited,
crossed the entry threshold again (the live demo's underflow, gone at step 750, back at 990).
The share "lost" is `lost.lost_to_format`: structural zeros (dead ReLU units) do not count.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence

from ampscope_server.findings.facts import Finding, LayerInfo, LayerSample, RunData
from ampscope_server.findings.formats import FORMATS, FloatFormat
from ampscope_server.findings.lost import LayerLoss, lost_to_format, structural_zeros
from ampscope_server.findings.nonfinite import min_headroom
from ampscope_server.findings.thresholds import (
    HEADROOM_MARGIN_BITS,
    LOW_PRECISION_PARAM_DTYPES,
    PRIMARY_MARGIN,
    SPARSE_MODULE_TYPES,
    SWALLOWED_EXIT_FRAC,
    SWALLOWED_FRAC_WARN,
    UNDERFLOW_EXIT_FRAC,
    UNDERFLOW_LOST_FRAC,
    UNDERFLOW_RECENT_SAMPLES,
)
from ampscope_server.findings.timeline import finite


def recent_samples(run: RunData) -> tuple[list[int], dict[int, list[LayerSample]]]:
    """(the last UNDERFLOW_RECENT_SAMPLES layer-stat steps, {layer: its samples at them})."""
    steps = sorted({s.step for s in run.layer_samples})[-UNDERFLOW_RECENT_SAMPLES:]
    keep = set(steps)
    by_layer: dict[int, list[LayerSample]] = defaultdict(list)
    for s in run.layer_samples:
        if s.step in keep:
            by_layer[s.layer].append(s)
    return steps, by_layer


def _rms(sample: LayerSample, layer: LayerInfo) -> float | None:
    if sample.l2 is None or layer.numel <= 0:
        return None
    return sample.l2 / math.sqrt(layer.numel)


def doublings_to_rescue(rms: float | None, scale: float, fmt: FloatFormat) -> int | None:
    """Doublings of the scale that lift a gradient of typical magnitude `rms` (true units) into
    the format's normal range; at least 1 (the layer is losing values now). None when the
    gradient is entirely zero: nothing says how far below the format its values lie."""
    if rms is None or rms <= 0:
        return None
    return max(1, math.ceil(math.log2(fmt.min_normal / (rms * scale))))


def _median_losses(run: RunData) -> list[tuple[float, float, int]]:
    """(median lost-to-format share, median structural-zero share, layer) over the recent
    samples, for every dense layer with samples, in model order."""
    _, by_layer = recent_samples(run)
    out = []
    for index in sorted(by_layer):
        if index >= len(run.layers) or run.layers[index].module_type in SPARSE_MODULE_TYPES:
            continue
        layer, samples = run.layers[index], by_layer[index]
        out.append((statistics.median(lost_to_format(s, layer) for s in samples),
                    statistics.median(structural_zeros(s, layer) for s in samples), index))
    return out


def worst_loss(run: RunData) -> LayerLoss | None:
    """The layer losing the largest median share to the format over the recent samples (ties:
    model order), as `gradient_underflow` measures it; None without layer samples."""
    steps, _ = recent_samples(run)
    losses = _median_losses(run)
    if not losses:
        return None
    lost, structural, index = max(losses, key=lambda row: (row[0], -row[2]))
    return LayerLoss(run.layer_name(index), lost, structural, len(steps))


def _ordered(flagged: list[tuple[float, int]], run: RunData,
             holding: Sequence[str]) -> list[tuple[float, int]]:
    """Most lost first (ties: model order); but the layer the previous analysis named first
    stays first while it is within PRIMARY_MARGIN of the most lost, so the title does not swap
    layer names between analyses for a point or two."""
    flagged = sorted(flagged, key=lambda pair: (-pair[0], pair[1]))
    if not flagged or not holding:
        return flagged
    previous = next((pair for pair in flagged if run.layer_name(pair[1]) == holding[0]), None)
    if previous is None or previous is flagged[0] or previous[0] < flagged[0][0] - PRIMARY_MARGIN:
        return flagged
    return [previous] + [pair for pair in flagged if pair is not previous]


def gradient_underflow(
    run: RunData, holding: Sequence[str] = ()
) -> list[Finding]:
    """Warning: layers whose median lost share over the recent samples is ≥ UNDERFLOW_LOST_FRAC,
    or ≥ UNDERFLOW_EXIT_FRAC while the finding is shown (`holding`: the layers it cites, most
    responsible first)."""
    fmt = FORMATS.get(run.target_format)
    steps, _ = recent_samples(run)
    if fmt is None or not steps:
        return []
    enter = UNDERFLOW_EXIT_FRAC if holding else UNDERFLOW_LOST_FRAC
    flagged = [(lost, index) for lost, _, index in _median_losses(run) if lost >= enter]
    if not flagged:
        return []
    flagged = _ordered(flagged, run, holding)
    last = [s for s in run.layer_samples if s.step == steps[-1]]
    # No GradScaler (an FP16 run without one, or BF16/FP32): no scale to raise, one to add.
    unscaled = all(s.scale is None for s in last)
    scale = next((s.scale for s in last if s.scale is not None), None) or 1.0
    headroom = min_headroom(last, run.target_format)
    worst = min(
        (s for s in last if s.amax is not None and s.amax > 0),
        key=lambda s: -(s.amax or 0.0), default=None)
    needs = {
        index: doublings_to_rescue(
            next((_rms(s, run.layers[index]) for s in last if s.layer == index), None),
            scale, fmt)
        for _, index in flagged
    }
    known = [n for n in needs.values() if n is not None]
    need = max(known) if known else None
    available = (None if headroom is None or math.isinf(headroom)
                 else math.floor(headroom) - HEADROOM_MARGIN_BITS)
    names = [run.layer_name(index) for _, index in flagged]
    evidence: dict[str, float] = {
        "layers_flagged": len(flagged), "worst_lost_frac": max(lost for lost, _ in flagged),
        "first_layer_lost_frac": flagged[0][0], "scale": scale,
        "threshold": UNDERFLOW_LOST_FRAC,
    }
    if headroom is not None:
        evidence["min_headroom_bits"] = headroom
    if need is not None:
        evidence["doublings_needed"] = need
    worst_name = "" if worst is None else run.layer_name(worst.layer)
    if need is not None and (available is None or need <= available):
        target = scale * 2.0**need
        evidence["recommended_scale"] = target
        headroom_text = (f": the layer closest to overflow, {worst_name}, has {headroom:.1f} "
                         "doublings of headroom, enough for that." if headroom is not None
                         else ".")
        advice = (
            f"This run has no loss scale: add one, torch.amp.GradScaler(init_scale={target:g}) "
            f"({2**need}x), which also skips the steps that would overflow" + headroom_text
            if unscaled else
            f"Raise the loss scale {2**need}x to {target:g} (GradScaler(init_scale={target:g}); "
            "if the scaler is not growing on its own, check growth_interval and that nothing "
            "else keeps it backing off)" + headroom_text)
    elif need is not None:
        advice = (
            f"The format cannot serve both: {names[0]} needs about {need} more doublings of "
            f"the scale, but {worst_name} overflows after {headroom:.1f}. Train in BF16, or "
            f"keep {names[0]} in FP32 (autocast(enabled=False) around it).")
    else:
        advice = (
            f"{names[0]}'s gradient is entirely zero at scale {scale:g}, so how far below the "
            "format it lies is unknown: try a scale 2^8 higher"
            + (" (this run has none: torch.amp.GradScaler(init_scale=256))" if unscaled else "")
            + " and watch its zero fraction, or train in BF16. If the layer receives no "
            "gradient by design, ignore this.")
    return [Finding(
        kind="gradient_underflow", severity="warning",
        title=f"Gradient underflow: {names[0]} loses {flagged[0][0]:.0%} of its gradient"
              + (f" (+{len(names) - 1} more layers)" if len(names) > 1 else ""),
        explanation=(
            ("Without a loss scale" if unscaled else f"At the current scale {scale:g}")
            + f", {names[0]} loses {flagged[0][0]:.0%} of its "
            f"gradient values to {fmt.name} ({len(names)} layer(s) flagged, median over the "
            f"last {len(steps)} layer-stat steps): values that flush to zero at this scale, "
            "and exact zeros where the layer's values press on the format's floor; "
            "structural zeros (dead ReLU units, unused rows) are not counted. A layer is "
            f"flagged from {UNDERFLOW_LOST_FRAC:.0%} and stays flagged until below "
            f"{UNDERFLOW_EXIT_FRAC:.0%}, so that a value near the threshold does not make "
            "this finding come and go. Those parameters get no or partial updates, "
            "silently."),
        recommendation=advice, step_start=steps[0], step_end=steps[-1], layers=names,
        evidence=evidence,
    )]


def _weight_magnitude(layer: LayerInfo, sample: LayerSample) -> float | None:
    """|w|: measured when the hook sends it, else PyTorch's default init scale. Linear/Conv
    weights start as U(±1/√fan_in) (kaiming_uniform with a=√5), RMS 1/√(3·fan_in); norm
    weights start at 1, embeddings as N(0, 1). Other 1-D parameters (biases) have no estimate."""
    if sample.param_rms is not None and sample.param_rms > 0:
        return sample.param_rms
    if layer.module_type in SPARSE_MODULE_TYPES:
        return 1.0  # nn.Embedding starts as N(0, 1)
    if len(layer.shape) >= 2:
        fan_in = math.prod(layer.shape[1:])
        return 1.0 / math.sqrt(3 * fan_in) if fan_in > 0 else None
    if "Norm" in layer.module_type:
        return 1.0
    return None


def half_spacing(magnitude: float, mantissa_bits: int) -> float:
    """Half the spacing of floats with `mantissa_bits` at `magnitude`: smaller updates round
    away."""
    return 2.0 ** (math.floor(math.log2(magnitude)) - mantissa_bits - 1)


def _measured_swallowed(run: RunData) -> dict[int, float]:
    """{layer: median measured swallowed fraction over the last UNDERFLOW_RECENT_SAMPLES steps
    that carry the measurement}."""
    steps = set(sorted({s.step for s in run.swallowed})[-UNDERFLOW_RECENT_SAMPLES:])
    by_layer: dict[int, list[float]] = defaultdict(list)
    for sample in run.swallowed:
        if sample.step in steps:
            by_layer[sample.layer].append(sample.frac)
    return {layer: statistics.median(values) for layer, values in by_layer.items()}


def _estimated_swallowed(run: RunData, skip: set[int]) -> list[tuple[float, int, float, float]]:
    """(update / half spacing, layer, update, half spacing) of FP16-held layers (not in `skip`)
    whose estimated update is below half the spacing: median over the recent samples."""
    lr = next((p.lr for p in reversed(list(run.steps)) if finite(p.lr) is not None), None)
    if lr is None or lr <= 0:
        return []
    _, by_layer = recent_samples(run)
    rows: list[tuple[float, int, float, float]] = []
    for index, layer in enumerate(run.layers):
        mantissa = LOW_PRECISION_PARAM_DTYPES.get(layer.dtype.removeprefix("torch."))
        if mantissa is None or index in skip:
            continue
        ratios: list[tuple[float, float, float]] = []
        for sample in by_layer.get(index, []):
            rms, w = _rms(sample, layer), _weight_magnitude(layer, sample)
            if rms is None or w is None or rms <= 0:
                continue
            spacing = half_spacing(w, mantissa)
            ratios.append((lr * rms / spacing, lr * rms, spacing))
        if ratios:
            ratio, update, spacing = sorted(ratios)[len(ratios) // 2]
            if ratio < 1.0:
                rows.append((ratio, index, update, spacing))
    return sorted(rows)


def swallowed_updates(
    run: RunData, holding: Sequence[str] = ()
) -> list[Finding]:
    """Warning: parameters whose updates round away.

    Measured when the hook sends the swallowed fraction (wire v3): a layer whose median
    fraction is at least SWALLOWED_FRAC_WARN. Otherwise estimated for parameters *held* in
    FP16 (their dtype; autocast keeps FP32 masters, so this means `model.half()` without master
    weights): the SGD-like update lr·rms(grad) below half the FP16 spacing at the weight's
    magnitude. While the finding is shown (`holding`), layers stay flagged down to
    SWALLOWED_EXIT_FRAC."""
    measured = _measured_swallowed(run)
    enter = SWALLOWED_EXIT_FRAC if holding else SWALLOWED_FRAC_WARN
    flagged_measured = sorted(
        ((frac, index) for index, frac in measured.items() if frac >= enter),
        key=lambda pair: (-pair[0], pair[1]))
    estimated = _estimated_swallowed(run, set(measured))
    if not flagged_measured and not estimated:
        return []
    names = [run.layer_name(i) for _, i in flagged_measured] + [
        run.layer_name(i) for _, i, _, _ in estimated]
    evidence: dict[str, float] = {"layers_flagged": len(names)}
    sentences = []
    if flagged_measured:
        frac, index = flagged_measured[0]
        evidence["swallowed_frac"] = frac
        sentences.append(
            f"Measured: {frac:.0%} of {run.layer_name(index)}'s elements that had a gradient "
            "did not change in the optimizer step (median of the recent steps); "
            f"{len(flagged_measured)} layer(s) are at {SWALLOWED_FRAC_WARN:.0%} or more.")
    if estimated:
        ratio, index, update, spacing = estimated[0]
        evidence.update(update=update, half_spacing=spacing, update_to_spacing=ratio)
        sentences.append(
            f"{run.layer_name(index)} is stored in FP16 and its estimated update (lr x typical "
            f"gradient = {update:.3g}) is below half the FP16 spacing at its weights' "
            f"magnitude ({spacing:.3g}); estimated as an SGD step, Adam-type updates are "
            "about lr itself.")
    steps = sorted({s.step for s in run.swallowed} | {s.step for s in run.layer_samples})
    return [Finding(
        kind="swallowed_updates", severity="warning",
        title=f"Updates swallowed by low-precision parameters: {names[0]}"
              + (f" (+{len(names) - 1} more)" if len(names) > 1 else ""),
        explanation=(
            " ".join(sentences) + " When a weight is held in low precision without an FP32 "
            "master copy, an update smaller than half its spacing rounds back to the old value "
            "and training silently stalls."),
        recommendation=(
            "Keep FP32 parameters and use torch.autocast + GradScaler instead of model.half(), "
            "or keep FP32 master weights in the optimizer."),
        step_start=steps[-UNDERFLOW_RECENT_SAMPLES] if len(steps) >= UNDERFLOW_RECENT_SAMPLES
        else (steps[0] if steps else None),
        step_end=steps[-1] if steps else None, layers=names, evidence=evidence,
    )]
