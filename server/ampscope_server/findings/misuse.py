"""AMP usage errors: the hook's misuse events, and an LR scheduler that steps on skipped steps
(seen in the data as the learning rate changing across a step the scaler skipped)."""

from __future__ import annotations

from collections import defaultdict

from ampscope_server.findings.facts import Finding, MisuseEvent, RunData, Severity
from ampscope_server.findings.thresholds import LR_SKIP_WARN_FRACTION
from ampscope_server.findings.timeline import ScaleHistory, finite

_MISUSE: dict[str, tuple[str, str, str]] = {
    "clip_before_unscale": (
        "Gradients clipped while still scaled",
        "clip_grad_norm_ ran on scaled gradients, so the threshold applied to gradients "
        "multiplied by the loss scale: clipping is far too strong (or, below the threshold, "
        "silently does nothing) and changes whenever the scale does.",
        "Call scaler.unscale_(optimizer) before clipping, then scaler.step(optimizer).",
    ),
    "step_bypassed_scaler": (
        "optimizer.step() called without the scaler",
        "The optimizer stepped on gradients that were never unscaled or checked for inf/NaN: "
        "updates are multiplied by the loss scale and overflowed steps are applied.",
        "Call scaler.step(optimizer) and scaler.update() instead of optimizer.step().",
    ),
    "unscale_twice": (
        "unscale_ called twice in one step",
        "The gradients were divided by the scale twice (PyTorch raises on a second unscale_ of "
        "the same optimizer; a manual division does not), so the update is too small by the "
        "scale factor.",
        "Call scaler.unscale_(optimizer) once per optimizer per step, after all backward "
        "passes of the step.",
    ),
}


def amp_misuse(run: RunData, h: ScaleHistory | None) -> list[Finding]:
    """Warning per misuse kind reported by the hook; LR-on-skipped-steps (info, or warning past
    LR_SKIP_WARN_FRACTION of the run)."""
    by_kind: dict[str, list[MisuseEvent]] = defaultdict(list)
    for event in run.misuse:
        by_kind[event.kind].append(event)
    findings = []
    for kind in sorted(by_kind, key=lambda k: by_kind[k][0].step):
        events = by_kind[kind]
        title, explanation, recommendation = _MISUSE.get(kind, (
            f"AMP misuse: {kind}", "The hook reported an AMP usage error.",
            "See the event details."))
        detail = next((e.detail for e in events if e.detail), "")
        steps, first, last = run.misuse_totals.get(kind, (
            len({e.step for e in events}), min(e.step for e in events),
            max(e.step for e in events)))
        findings.append(Finding(
            kind="amp_misuse", severity="warning",
            title=f"{title} ({steps} step(s))",
            explanation=explanation + (f" Hook detail: {detail}" if detail else ""),
            recommendation=recommendation,
            step_start=first, step_end=last, evidence={"steps": steps}, subject=kind,
        ))
    if h is not None:
        findings.extend(_lr_on_skipped(h))
    return findings


def _lr_on_skipped(h: ScaleHistory) -> list[Finding]:
    lr = {p.step: finite(p.lr) for p in h.steps}
    moved = [
        s for s in h.skips
        if lr.get(s) is not None and lr.get(s + 1) is not None and lr[s] != lr[s + 1]]
    if not moved:
        return []
    fraction = len(moved) / h.span
    severity: Severity = "warning" if fraction >= LR_SKIP_WARN_FRACTION else "info"
    return [Finding(
        kind="amp_misuse", severity=severity,
        title=f"LR scheduler stepped on {len(moved)} skipped step(s)",
        explanation=(
            f"The learning rate changed across {len(moved)} step(s) whose optimizer step the "
            "scaler skipped: the schedule advanced without training, so warmup and decay run "
            f"ahead of the weights ({fraction:.2%} of the run's steps)."),
        recommendation=(
            "Step the scheduler only when the optimizer stepped (compare scaler.get_scale() "
            "before and after scaler.update(): a drop means the step was skipped)."),
        step_start=moved[0], step_end=moved[-1],
        evidence={"skipped_steps_with_lr_change": len(moved), "fraction_of_run": fraction},
        subject="lr_on_skipped_steps",
    )]
