"""Detectors over the scale history: calibration, storms, collapse, scaler tuning.

GradScaler's algorithm (torch/amp/grad_scaler.py) is the model: on an overflow the step is
skipped and the scale multiplied by backoff_factor; after growth_interval clean steps in a row
it is multiplied by growth_factor. A healthy run therefore shows a short descent from
init_scale at the start (calibration) and then, at most, one skip per growth (the scaler
probing a higher scale and backing off).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from ampscope_server.findings.facts import Finding, RunData, is_nonfinite
from ampscope_server.findings.nonfinite import forward_began
from ampscope_server.findings.thresholds import (
    CALIBRATION_GAP_STEPS,
    COLLAPSE_SCALE,
    COLLAPSE_TREND_HALVINGS,
    COLLAPSE_WARN_SCALE,
    STORM_MIN_SKIPS,
    STORM_WINDOW_STEPS,
    TUNING_INTERVAL_FACTOR,
    TUNING_MIN_SKIPS,
)
from ampscope_server.findings.timeline import ScaleHistory, culprits, finite


def _fmt_scale(scale: float | None) -> str:
    if scale is None:
        return "unknown"
    if scale > 0 and math.log2(scale).is_integer():
        return f"{scale:g} (2^{int(math.log2(scale))})"
    return f"{scale:g}"


def _layer_names(run: RunData, steps: set[int], limit: int = 5) -> list[str]:
    return [run.layer_name(i) for i, _, _ in culprits(run.nonfinite, steps)[:limit]]


def _descent_text(h: ScaleHistory) -> str:
    """Where the calibration skips lie: the back-to-back descent, then any later one."""
    chain = [h.calibration[0]]
    for step in h.calibration[1:]:
        if step - chain[-1] > CALIBRATION_GAP_STEPS:
            break
        chain.append(step)
    text = f"steps {chain[0]}-{chain[-1]}" if len(chain) > 1 else f"step {chain[0]}"
    later = h.calibration[len(chain):]
    for step in later:
        point = h.point(step)
        scale = None if point is None else finite(point.scale_before)
        text += f"; step {step} still overflowed at {_fmt_scale(scale)}"
    return text


def would_skip(h: ScaleHistory, scale: float) -> list[int]:
    """Steps the run's own history shows overflowing at `scale` or below: skipped with a
    scale in effect no higher, probes left out (a scaler started at `scale` probes alike)."""
    probes = set(h.probes)
    return [s for s in h.skips if s not in probes and (p := h.point(s)) is not None
            and (before := finite(p.scale_before)) is not None and before <= scale]


def calibration_overflow(run: RunData, h: ScaleHistory) -> list[Finding]:
    """Info: the skips that are the scaler doing its job (descent from init_scale, probes)."""
    if not h.calibration and not h.probes:
        return []
    parts = []
    evidence: dict[str, float] = {
        "calibration_skips": len(h.calibration), "probe_skips": len(h.probes)}
    explanation = []
    if h.calibration:
        first = h.point(h.calibration[0])
        init = None if first is None else finite(first.scale_before)
        settled = h.settled_scale
        parts.append(f"{len(h.calibration)} calibration skip(s)")
        if init is not None:
            evidence["init_scale"] = init
        if settled is not None:
            evidence["settled_scale"] = settled
        descent = _descent_text(h)
        explanation.append(
            f"{len(h.calibration)} skipped step(s) are the scaler coming down from its "
            f"initial scale {_fmt_scale(init)} to {_fmt_scale(settled)}, halving on each "
            f"overflow until the scaled gradients fit the format ({descent}); the run held "
            f"{_fmt_scale(settled)} from step {h.calibration[-1] + 1} on"
            + (" until it grew" if any(g > h.calibration[-1] for g in h.growths) else "")
            + ".")
    if h.probes:
        parts.append(f"{len(h.probes)} probe skip(s) after growth")
        explanation.append(
            f"{len(h.probes)} isolated skip(s) came right after the scale had grown: the scaler "
            "tries a higher scale after each growth interval and backs off when it overflows.")
    explanation.append("These skips are expected with dynamic loss scaling and cost only the "
                       "skipped steps themselves.")
    steps = sorted(h.calibration + h.probes)
    return [Finding(
        kind="calibration_overflow", severity="info",
        title="Benign overflows: " + ", ".join(parts),
        explanation=" ".join(explanation),
        recommendation="Nothing to fix. See the scaler tuning finding, if any, to avoid them.",
        step_start=steps[0], step_end=steps[-1], evidence=evidence,
    )]


def storm_skips(h: ScaleHistory) -> list[int]:
    """Skips that lie in a window of STORM_WINDOW_STEPS steps holding at least STORM_MIN_SKIPS
    of them, calibration and probe skips left out: those are the scaler's own doing (a probe
    every few steps is a growth_interval set too short, which `scaler_tuning` answers)."""
    benign = set(h.calibration) | set(h.probes)
    skips = [s for s in h.skips if s not in benign]
    marked: set[int] = set()
    lo = 0
    for hi, step in enumerate(skips):
        while step - skips[lo] >= STORM_WINDOW_STEPS:
            lo += 1
        if hi - lo + 1 >= STORM_MIN_SKIPS:
            marked.update(skips[lo:hi + 1])
    return sorted(marked)


def overflow_storm(run: RunData, h: ScaleHistory) -> list[Finding]:
    """Error: windows where the skip rate exceeds STORM_MIN_SKIPS / STORM_WINDOW_STEPS."""
    storm = storm_skips(h)
    if not storm:
        return []
    start, end = storm[0], storm[-1]
    benign = set(h.calibration) | set(h.probes)
    lost = [s for s in h.skips if start <= s <= end and s not in benign]
    span = end - start + 1
    densest = max(
        sum(1 for t in storm if s <= t < s + STORM_WINDOW_STEPS) for s in storm)
    ranked = culprits(run.nonfinite, set(lost))
    layers = [run.layer_name(i) for i, _, _ in ranked[:5]]
    evidence: dict[str, float] = {
        "skipped_steps": len(lost), "span_steps": span, "skip_rate": len(lost) / span,
        "max_skips_per_window": densest, "window_steps": STORM_WINDOW_STEPS,
        "total_skipped_steps": len(h.skips),
    }
    before, after = h.scale_at(start - 1), h.scale_at(end)
    if before is not None:
        evidence["scale_before_storm"] = before
    if after is not None:
        evidence["scale_after_storm"] = after
    # A forward-born overflow (the loss itself non-finite) is named where the forward hooks saw
    # it begin; the backward order of the gradients names only a backward-born one (once the
    # loss is NaN every gradient is, and the first in backward order is the last layer).
    forward, modules = forward_began(
        run, [s for s in lost if (p := h.point(s)) is not None and is_nonfinite(p.loss)])
    origin = ""
    if forward:
        origin = " " + forward
        layers = modules[:5]
    elif ranked:
        index, first, seen = ranked[0]
        origin = (f" The overflow started in {run.layer_name(index)} on {first} of these steps "
                  f"(non-finite there on {seen}).")
    return [Finding(
        kind="overflow_storm", severity="error",
        title=f"Overflow storm: {len(lost)} optimizer steps skipped between steps {start} and "
              f"{end}",
        explanation=(
            f"Up to {densest} of {STORM_WINDOW_STEPS} consecutive steps overflowed and were "
            f"skipped ({len(lost)} lost in steps {start}-{end}, {len(lost) / span:.1%} of them). "
            "At equilibrium GradScaler skips about one step per growth interval; this many "
            "means the gradients themselves keep exceeding the format's range, and every "
            f"skipped step is a lost update.{origin}"),
        recommendation=(
            "Find why the gradients blow up: lower the learning rate or add warmup, clip the "
            "gradients after scaler.unscale_(), and check the layers named here (keep them in "
            "FP32 with autocast(enabled=False), or train in BF16)."),
        step_start=start, step_end=end, layers=layers, evidence=evidence,
    )]


def _min_scale(h: ScaleHistory) -> tuple[float, int] | None:
    best: tuple[float, int] | None = None
    for p in h.steps:
        scale = finite(p.scale_after)
        if scale is not None and (best is None or scale < best[0]):
            best = (scale, p.step)
    return best


def scale_collapse(run: RunData, h: ScaleHistory) -> list[Finding]:
    """Error when backoffs drove the scale to ≤ COLLAPSE_SCALE; warning when it is below
    COLLAPSE_WARN_SCALE and fell by a net COLLAPSE_TREND_HALVINGS over the run's latter half."""
    lowest = _min_scale(h)
    if lowest is None:
        return []
    low, low_step = lowest
    backed_off = [
        p.step for p in h.steps
        if p.skipped and (s := finite(p.scale_after)) is not None and s <= COLLAPSE_SCALE]
    last = h.scale_at(h.last_step)
    mid = h.scale_at(h.first_step + h.span // 2)
    skips = set(h.skips)
    if backed_off:
        start = backed_off[0]
        layers = _layer_names(run, skips)
        return [Finding(
            kind="scale_collapse", severity="error",
            title=f"Loss scale collapsed to {low:g} (step {low_step})",
            explanation=(
                f"Overflows drove the loss scale down to {low:g} by step {low_step}. At a scale "
                "of 1 or less loss scaling lifts nothing: the gradients overflow the format "
                "unscaled, which happens when a model's values outgrow FP16's range (max "
                "65504) — typically a model trained in BF16 or FP32 run in FP16, or a "
                "diverging run."),
            recommendation=(
                "Train in BF16 (same range as FP32) if the hardware supports it; otherwise keep "
                "the overflowing layers in FP32 (autocast(enabled=False) around them) and lower "
                "the learning rate."),
            step_start=start, step_end=h.last_step, layers=layers,
            evidence={"min_scale": low, "min_scale_step": low_step,
                      "final_scale": last if last is not None else math.nan,
                      "skipped_steps": len(h.skips)},
        )]
    if last is None or mid is None or last >= COLLAPSE_WARN_SCALE or last <= 0:
        return []
    fall = math.log2(mid / last)
    if fall < COLLAPSE_TREND_HALVINGS:
        return []
    start = h.first_step + h.span // 2
    return [Finding(
        kind="scale_collapse", severity="warning",
        title=f"Loss scale falling: {mid:g} → {last:g} over the second half of the run",
        explanation=(
            f"The scale halved a net {fall:.0f} times between step {start} and step "
            f"{h.last_step} and is now {last:g}, heading for 1, where loss scaling stops "
            "helping. More backoffs than the scaler can grow back means the gradients' range "
            "keeps rising."),
        recommendation=(
            "Act before it reaches 1: lower the learning rate, clip gradients after unscale_(), "
            "keep the layers named here in FP32, or switch to BF16."),
        step_start=start, step_end=h.last_step,
        layers=_layer_names(run, {s for s in skips if s >= start}),
        evidence={"scale_mid": mid, "final_scale": last, "net_halvings": fall},
    )]


def _nice(value: float) -> int:
    """Round up to 1, 2 or 5 x a power of ten (2000 x 2.5 → 5000)."""
    if value <= 1:
        return 1
    exponent = 10 ** math.floor(math.log10(value))
    for mult in (1, 2, 5, 10):
        if value <= mult * exponent:
            return int(mult * exponent)
    return int(10 * exponent)


def _growth_gaps(h: ScaleHistory) -> list[int]:
    """Clean steps before each growth: from the previous scale event to the growth."""
    gaps = []
    previous: int | None = None
    for p in h.steps:
        if p.skipped or (finite(p.scale_before) != finite(p.scale_after)):
            if p.step in h.growths and previous is not None:
                gaps.append(p.step - previous)
            previous = p.step
    return gaps


def scaler_tuning(run: RunData, h: ScaleHistory, storm: Sequence[int]) -> list[Finding]:
    """Info: init_scale from the calibration descent, growth_interval from the probe skips."""
    advice: list[str] = []
    reasons: list[str] = []
    evidence: dict[str, float] = {}
    steps: list[int] = []
    settled = h.settled_scale
    if len(h.calibration) >= TUNING_MIN_SKIPS and settled is not None:
        still = would_skip(h, settled)
        avoidable = [s for s in h.calibration if s not in still]
        advice.append(f"init_scale={settled:g}")
        reasons.append(
            f"the run came down to {settled:g} in {len(h.calibration)} skipped steps and "
            + ("no step of its history overflowed at that scale or below: starting there "
               f"would have avoided all {len(avoidable)} of them" if not still else
               f"{len(still)} step(s) of its history overflowed at that scale or below "
               f"(step {', '.join(map(str, still[:5]))}): starting there would have avoided "
               f"{len(avoidable)} of them"))
        evidence.update(recommended_init_scale=settled,
                        avoidable_calibration_skips=len(avoidable),
                        remaining_skips_at_init_scale=len(still))
        steps.extend(h.calibration)
    probes = [s for s in h.probes if s not in set(storm)]
    gaps = _growth_gaps(h)
    if len(probes) >= TUNING_MIN_SKIPS and gaps:
        interval = statistics.median(gaps)
        after_growth = [
            s - max(g for g in h.growths if g < s) for s in probes
            if any(g < s for g in h.growths)]
        lag = statistics.median(after_growth) if after_growth else math.nan
        proposed = _nice(interval * TUNING_INTERVAL_FACTOR)
        # Checked against the run's own span: after calibration each probe costs a clean
        # growth_interval, the steps until the grown scale overflows, and the skip itself.
        start = h.calibration[-1] + 1 if h.calibration else h.first_step
        cycle = proposed + (0 if math.isnan(lag) else int(lag)) + 1
        remaining = min(len(probes), (h.last_step - start + 1) // cycle)
        avoided = len(probes) - remaining
        advice.append(f"growth_interval={proposed}")
        reasons.append(
            f"it backs off every ~{interval:.0f} steps, {lag:.0f} step(s) after growing "
            f"({len(probes)} times): over the run's {h.last_step - start + 1} steps since "
            f"calibration a growth_interval of {proposed} would have grown at most {remaining} "
            f"time(s), avoiding {avoided} of those skipped steps")
        evidence.update(observed_growth_interval=interval, probe_skips=len(probes),
                        steps_after_growth=lag, recommended_growth_interval=proposed,
                        avoidable_probe_skips=avoided)
        steps.extend(probes)
    if not advice:
        return []
    steps.sort()
    return [Finding(
        kind="scaler_tuning", severity="info",
        title="Scaler tuning: " + ", ".join(advice),
        explanation="From the growth and backoff history: " + "; ".join(reasons) + ".",
        recommendation=f"GradScaler({', '.join(advice)}).",
        step_start=steps[0], step_end=steps[-1], evidence=evidence,
    )]
