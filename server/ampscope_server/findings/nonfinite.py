"""Detectors of non-finite values that loss scaling cannot explain: forward overflow (the loss
itself is NaN/inf) and NaN that is not a range problem.

Why NaN matters apart from inf: a scaled gradient that exceeds the format becomes inf; NaN
comes from inf - inf, 0 · inf, or NaN already in the data or the computation. A NaN that is
the *first* bad value of the backward pass (backward order, DESIGN.md §3), at a moderate scale
with ample headroom just before, or that keeps coming back after the scaler has backed off
several times, is not cured by a smaller scale.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from ampscope_server.findings.divergence import Magnitude, magnitude
from ampscope_server.findings.facts import (
    Finding,
    LayerSample,
    RunData,
    Severity,
    is_nan,
    is_nonfinite,
)
from ampscope_server.findings.formats import FORMATS
from ampscope_server.findings.thresholds import (
    AMPLE_HEADROOM_BITS,
    MODERATE_SCALE,
    NAN_PERSIST_HALVINGS,
)
from ampscope_server.findings.timeline import ScaleHistory, culprits, finite


def forward_began(run: RunData, steps: Sequence[int]) -> tuple[str, list[str]]:
    """Where the forward overflow of `steps` (steps whose loss was non-finite) began, as read
    by the re-check's forward hooks: a sentence naming the module of the first such step with
    an origin ("" when none was read) and the modules, most often first."""
    known = [(step, run.forward_origins[step]) for step in steps if step in run.forward_origins]
    if not known:
        return "", []
    step, first = known[0]
    counts = Counter(origin.module for _, origin in known)
    modules = sorted(counts, key=lambda name: -counts[name])
    where = ("non-finite in FP32 too" if first.format == "fp32"
             else f"beyond {first.format}'s range")
    inputs = ("its input was finite" if first.input_finite
              else "its input was already non-finite (the data or an earlier op)")
    share = ""
    if len(known) > 1:
        share = f" ({counts[first.module]} of the {len(known)} re-checked step(s) began there"
        if modules[0] != first.module:
            share += f", {counts[modules[0]]} in {modules[0]}"
        share += ")"
    return (f"The overflow began in {first.module} (forward) at step {step}: the first module "
            f"in forward order whose output went {where}; {inputs}{share}."), modules


def forward_overflow(run: RunData, h: ScaleHistory, m: Magnitude | None = None) -> list[Finding]:
    """Error: steps whose loss is NaN or ±inf.

    The kind keeps its name whatever the cause: what it asserts is that the loss was non-finite
    before any scaling, so no loss scale can fix it. When the hook re-ran those steps in FP32
    (`mon.recheck`), the outcome names the cause: persisting in FP32 → the data or the model,
    not the format's range; vanishing at the run's own magnitude → a genuine FP16 range
    overflow in the forward pass; vanishing to a loss orders of magnitude above the run's
    healthy one (`divergence.Magnitude.diverged`) → the run diverges, whatever the format.
    Without a re-check, the FP32 shadow steps (`watch(shadow_every=N)`) in the overflow's span
    and the last one before it are the FP32 evidence: one 100x the healthy loss → divergence;
    all at the healthy magnitude → the weights are fine, so an infinite loss is the format's
    range, and no sentence says the update may have diverged."""
    bad = [p for p in h.steps if is_nonfinite(p.loss)]
    if not bad:
        return []
    m = m or magnitude(run, h)
    nans = sum(1 for p in bad if is_nan(p.loss))
    infs = len(bad) - nans
    start, end = bad[0].step, bad[-1].step
    checked = [p.step for p in bad if run.rechecks.get(p.step) in ("persisted", "vanished")]
    persisted = sum(1 for step in checked if run.rechecks[step] == "persisted")
    diverged = [step for step in checked if run.rechecks[step] == "vanished"
                and m.diverged(run.recheck_losses.get(step))]
    vanished = len(checked) - persisted - len(diverged)
    evidence: dict[str, float] = {"nonfinite_loss_steps": len(bad), "nan_loss_steps": nans,
                "inf_loss_steps": infs}
    if checked:
        evidence |= {"recheck_persisted_steps": persisted, "recheck_vanished_steps": vanished}
    title = f"Forward overflow: the loss itself is non-finite on {len(bad)} step(s)"
    recommendation = (
        "Check the inputs of the first bad step for NaN/inf; keep the overflowing ops "
        "(softmax, large matmuls, exp, norms) in FP32 with autocast(enabled=False) or by "
        "computing the loss in FP32; or train in BF16.")
    if diverged:
        peak = max(run.recheck_losses[step] for step in diverged)
        evidence |= {"recheck_diverged_steps": len(diverged)}
        title = _fp32_diverged(len(bad), peak, m, evidence)
        cause = (f"The FP32 re-check (no autocast, no scaling) of {len(diverged)} of these "
                 f"steps gave a loss up to {peak:.3g} where the run began at "
                 f"{m.healthy_loss:.3g}: the weights themselves have diverged, so FP32 is "
                 "no better off than FP16 there"
                 + (f" ({vanished} other re-checked step(s) stayed at the run's magnitude)."
                    if vanished else "."))
        recommendation = (
            "Lower the learning rate (or add warm-up, clip the gradients after "
            "scaler.unscale_()): the training diverges in FP32 too, so neither BF16 nor a "
            "loss scale fixes it.")
    elif persisted and not vanished:
        title = (f"Non-finite loss on {len(bad)} step(s), also in FP32: not a range overflow")
        cause = ("The FP32 re-check (no autocast, no scaling) of these steps gave a non-finite "
                 "loss too, so the format's range is not the cause: the inputs or the "
                 "computation (a division by zero, log of 0, an exploded weight) produce it.")
        recommendation = (
            "Check the inputs of the first bad step for NaN/inf and the ops that can produce "
            "them (division, log, sqrt of a negative); changing the precision will not help.")
    elif vanished and not persisted:
        title = (f"Forward overflow on {len(bad)} step(s): the loss is finite in FP32, "
                 f"non-finite in {run.target_format}")
        cause = ("The FP32 re-check of these steps gave a finite loss at the run's own "
                 "magnitude: a forward activation or the loss exceeds FP16's range (max 65504) "
                 "under autocast.")
        recommendation = (
            "Bring the forward pass into the format's range: normalise the inputs (or scale "
            "the activations down), keep the overflowing ops (the first layers, softmax, exp, "
            "norms) in FP32 with autocast(enabled=False), or train in BF16. The FP32 re-check "
            "already ran: no need to run it again.")
    elif infs and not nans:
        cause = ("An infinite loss means a forward activation or the loss exceeded the format's "
                 "range (FP16 max 65504) before any scaling happened.")
    elif nans and not infs:
        cause = ("A NaN loss comes from the forward pass itself: NaN or inf in the inputs, a "
                 "division by zero, log of 0, or an activation overflow turned into NaN.")
    else:
        cause = ("Both NaN and infinite losses: forward activations overflow the format and/or "
                 "the data or computation produces NaN.")
    near = [(s, v) for s, v in m.shadow_losses.items() if start <= s <= end]
    near = [(s, v) for s, v in m.shadow_losses.items() if s < start][-1:] + near
    shadow_diverged = [(s, v) for s, v in near if m.diverged(v)]
    shadow_healthy = [(s, v) for s, v in near if not m.diverged(v)]
    if not checked and shadow_diverged:
        step, peak = max(shadow_diverged, key=lambda pair: pair[1])
        evidence |= {"shadow_diverged_steps": len(shadow_diverged)}
        title = _fp32_diverged(len(bad), peak, m, evidence)
        cause = (f"The FP32 shadow step at step {step} (the same weights and batch, no "
                 f"autocast, no scaling) gave a loss of {peak:.3g} where the run began at "
                 f"{m.healthy_loss:.3g}: the weights themselves have diverged, so FP32 is no "
                 "better off than the low-precision format there.")
        recommendation = (
            "Lower the learning rate (or add warm-up, clip the gradients after "
            "scaler.unscale_()): the training diverges in FP32 too, so neither BF16 nor a "
            "loss scale fixes it.")
    elif not checked and shadow_healthy:
        steps_said = ", ".join(str(s) for s, _ in shadow_healthy[:5])
        losses = [v for _, v in shadow_healthy]
        evidence |= {"shadow_healthy_steps": len(shadow_healthy),
                     "shadow_loss_max": max(losses)}
        if m.healthy_loss is not None:
            evidence["healthy_loss"] = m.healthy_loss
        said = (f"The FP32 shadow step(s) at step(s) {steps_said} (the same weights and batch, "
                f"no autocast, no scaling) gave losses up to {max(losses):.3g}, at the run's "
                "healthy magnitude: the weights have not diverged.")
        if infs and not nans:
            title = (f"Forward overflow on {len(bad)} step(s): the loss is finite in FP32, "
                     f"non-finite in {run.target_format}")
            cause = (f"{said} An infinite loss with the weights at their healthy magnitude is "
                     "a forward activation or the loss exceeding the format's range (FP16 max "
                     "65504) under autocast.")
        else:
            cause += " " + said
    if not checked and not near and any(not p.skipped and p.step < start for p in h.steps):

        # No FP32 evidence: a loss finite and at its healthy magnitude until a step that was
        # applied may as well be that step diverging as the format's range.
        cause += (" The loss was finite before step " f"{start}, so the update just before "
                  "may have diverged (too high a learning rate) as well as overflowed the "
                  "format: register the FP32 re-check (mon.recheck) to tell them apart.")
    if all(p.scale_before is None for p in bad):
        # No GradScaler (BF16 or FP32): nothing skips these steps, and no scale is involved.
        consequence = ("This run has no loss scale (no GradScaler): nothing skipped these "
                       "steps, so the optimizer applied them and the NaN/inf reached the "
                       "weights.")
        if run.target_format == "bf16":  # "or train in BF16" would be no advice here
            recommendation = recommendation.replace("; or train in BF16.", ".")
    else:
        consequence = ("The loss scale only multiplies the backward pass, so no scale can fix "
                       "this: the scaler will skip these steps and back off for nothing.")
    began, modules = forward_began(run, [p.step for p in bad])
    if began:
        cause += " " + began
        evidence["forward_origin_steps"] = sum(1 for p in bad if p.step in run.forward_origins)
    return [Finding(
        kind="forward_overflow", severity="error",
        title=title,
        explanation=f"{cause} {consequence}",
        recommendation=recommendation,
        step_start=start, step_end=end, layers=modules[:5],
        evidence=evidence,
    )]


def _fp32_diverged(bad: int, peak: float, m: Magnitude, evidence: dict[str, float]) -> str:
    """The title of a forward overflow whose FP32 run (re-check or shadow step) reached `peak`,
    orders of magnitude above the healthy loss; the peak and that loss go into `evidence`."""
    evidence["fp32_loss_peak"] = peak
    if m.healthy_loss is not None:
        evidence["healthy_loss"] = m.healthy_loss
    return (f"Non-finite loss on {bad} step(s): FP32 reaches {peak:.3g} there, "
            f"{m.times(peak):.3g}x the run's healthy loss (a divergence, not the range)")


def _nan_origin_steps(run: RunData, h: ScaleHistory) -> list[int]:
    """found_inf steps whose first non-finite layer (backward order) held NaN; without the
    per-layer list (wire v1), steps whose global grad norm is NaN with a finite loss.

    Calibration and probe skips are left out: there the scale is known to be too high, and an
    overflowing fp16 backward turns inf into NaN within a few ops (inf - inf, 0 x inf), so a
    NaN first proves nothing."""
    listed = {entry.step: entry for entry in run.nonfinite if entry.layers}
    benign = set(h.calibration) | set(h.probes)
    steps = []
    for p in h.steps:
        if not p.found_inf or is_nonfinite(p.loss):
            continue  # a non-finite loss is forward_overflow's
        if p.step in benign:
            continue  # the scaler descending or probing: a range overflow by construction
        entry = listed.get(p.step)
        if entry is not None:
            if entry.layers[0][1] == "nan":
                steps.append(p.step)
        elif is_nan(p.grad_norm):
            steps.append(p.step)
    return steps


def min_headroom(samples: Sequence[LayerSample], target_format: str) -> float | None:
    """Smallest log2(fmt.max / (amax · scale)) over the samples (None without a known amax)."""
    fmt = FORMATS.get(target_format)
    if fmt is None:
        return None
    best: float | None = None
    for s in samples:
        if s.amax is None:
            continue
        scaled = s.amax * (s.scale if s.scale is not None else 1.0)
        bits = math.inf if scaled <= 0 else math.log2(fmt.max / scaled)
        best = bits if best is None else min(best, bits)
    return best


def nan_not_range(run: RunData, h: ScaleHistory) -> list[Finding]:
    """Error: NaN-origin steps at a moderate scale with ample headroom just before, NaN
    persisting after NAN_PERSIST_HALVINGS backoffs since the first one, or an FP32 re-check
    (`mon.recheck`) in which the non-finite values persisted. A step whose re-check vanished
    is a range problem and is not cited."""
    vanished = {step for step, status in run.rechecks.items() if status == "vanished"}
    # A re-checked step whose loss was already non-finite is `forward_overflow`'s (it says the
    # same thing about the same step): citing it here too would make two findings of one cause.
    loss_bad = {p.step for p in h.steps if is_nonfinite(p.loss)}
    persisted = sorted(step for step, status in run.rechecks.items()
                       if status == "persisted" and step not in loss_bad)
    origins = [step for step in _nan_origin_steps(run, h) if step not in vanished]
    if not origins and not persisted:
        return []
    reasons: list[str] = []
    evidence: dict[str, float] = {"nan_steps": len(origins)}
    if persisted:
        evidence["recheck_persisted_steps"] = len(persisted)
        reasons.append(
            f"the FP32 re-check (no autocast, no scaling) of step {persisted[0]} still gave "
            f"non-finite values ({len(persisted)} re-checked step(s) persisted)")
    ample: list[int] = []
    for step in origins:
        point = h.point(step)
        scale = None if point is None else finite(point.scale_before)
        headroom = min_headroom(run.nan_context.get(step, ()), run.target_format)
        if (scale is not None and scale <= MODERATE_SCALE and headroom is not None
                and headroom >= AMPLE_HEADROOM_BITS):
            ample.append(step)
            evidence.setdefault("headroom_bits_before", headroom)
            evidence.setdefault("scale_at_nan", scale)
    first = h.point(origins[0]) if origins else None
    first_scale = None if first is None else finite(first.scale_before)
    persisting: list[int] = []
    if first_scale is not None and first_scale > 0:
        for step in origins:
            point = h.point(step)
            scale = None if point is None else finite(point.scale_before)
            if scale is not None and scale > 0 and \
                    math.log2(first_scale / scale) >= NAN_PERSIST_HALVINGS:
                persisting.append(step)
    if ample:
        reasons.append(
            f"at step {ample[0]} the gradients turned NaN at scale "
            f"{evidence['scale_at_nan']:g} while every layer was still "
            f"{evidence['headroom_bits_before']:.1f} doublings below the format's maximum "
            "just before")
    if persisting:
        evidence["persisting_nan_steps"] = len(persisting)
        evidence["halvings_since_first_nan"] = NAN_PERSIST_HALVINGS
        reasons.append(
            f"NaN kept appearing ({len(persisting)} more step(s), up to step {persisting[-1]}) "
            f"after the scaler had backed off {NAN_PERSIST_HALVINGS}+ times, which a small "
            "range overflow would not survive (a gradient explosion far beyond the format "
            "would, so alone this is a warning)")
    if not reasons:
        return []
    cited = sorted(set(ample + persisting + persisted))
    ranked = culprits(run.nonfinite, set(cited))
    # Ample headroom or a persisted FP32 re-check rule the range out; persistence alone cannot
    # tell a NaN from the data from an explosion far beyond what halving the scale absorbs.
    severity: Severity = "error" if ample or persisted else "warning"
    return [Finding(
        kind="nan_not_range", severity=severity,
        title=f"NaN that is not a range problem (first at step {cited[0]})",
        explanation=(
            ("The first non-finite gradient values were NaN, not inf, and " if origins
             else "Non-finite gradients are not a range problem: ") + "; ".join(reasons)
            + ". An overflow of the format gives inf and is cured by a smaller scale; this "
            "points at the data (NaN/inf inputs) or the computation (0/0, log(0), sqrt of a "
            "negative, an unstable custom op)."),
        recommendation=_nan_advice(run, persisted),
        step_start=cited[0], step_end=cited[-1],
        layers=[run.layer_name(i) for i, _, _ in ranked[:5]], evidence=evidence,
    )]


def _nan_advice(run: RunData, persisted: Sequence[int]) -> str:
    """What to do about a NaN that is not a range problem; never "run the re-check" when the
    hook already ran it (`run.rechecks` holds its outcomes)."""
    if persisted:
        return ("The FP32 re-check already ran and the NaN persisted: inspect the inputs of "
                f"step {persisted[0]} and the first layer named here (division, log, sqrt of "
                "a negative, an unstable custom op); changing the precision will not help.")
    if run.rechecks:
        return ("Inspect the inputs of the first NaN step and the first layer named here; the "
                "FP32 re-check ran on other steps only, so register it around this batch too "
                "to tell the data from the format.")
    return ("Re-run the failing batch in FP32 without autocast or scaling (mon.recheck): if "
            "the NaN persists, inspect that batch's inputs and the first layer named here; if "
            "it vanishes, keep that layer in FP32.")
