"""Is it the precision or the run? The run's own magnitude, and its divergence (seed 003).

A loss that turns NaN in FP16 is a *range* problem only if FP32 keeps it at the run's own
magnitude. The FP32 re-check (`mon.recheck`) evaluates the AMP run's weights at the overflow
step: a finite FP32 loss there says nothing about range if it is 10^27 where the run began at
0.4. What the run's own history answers:

- its healthy magnitude: the median of its first HEALTHY_STEPS finite losses (and gradient
  norms of taken steps);
- *divergence*: a loss, the run's or its FP32 re-check's, DIVERGENCE_LOSS_FACTOR x the healthy
  one, or a taken step's gradient norm DIVERGENCE_NORM_FACTOR x the healthy norm, and the run
  never comes back (a transient spike followed by losses at the healthy magnitude is not
  one: its skips are the storm's, and its advice the scaler's). The learning
  rate (warm-up, clipping) is then the cause whatever the precision, and the skips, the
  collapsed scale and the non-finite losses follow from it (`causes.RULES`).

The FP32 shadow steps (`watch(shadow_every=N)`, wire v6) run applied steps' batches in FP32
from the same weights: a shadow loss DIVERGENCE_LOSS_FACTOR x the healthy one is the weights
diverging (evidence for it, like a re-check's); a shadow loss at the healthy magnitude at or
after the AMP loss went out there says the weights are fine and the AMP computation is not, so
the AMP loss alone no longer makes it a divergence.

    magnitude(run, h) -> Magnitude     the healthy loss and norm, what the re-checks measured
    divergence(run, h) -> [Finding]    error: the training diverges
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from ampscope_server.findings.facts import Finding, RunData
from ampscope_server.findings.thresholds import (
    DIVERGENCE_LOSS_FACTOR,
    DIVERGENCE_NORM_FACTOR,
    EDGE_STEPS,
    HEALTHY_STEPS,
)
from ampscope_server.findings.timeline import ScaleHistory, finite


def _healthy(values: Iterable[float | None]) -> float | None:
    """The median of the first HEALTHY_STEPS finite positive values (None without any)."""
    first: list[float] = []
    for value in values:
        if (v := finite(value)) is not None and v > 0:
            first.append(v)
            if len(first) == HEALTHY_STEPS:
                break
    return statistics.median(first) if first else None


@dataclass(frozen=True)
class Magnitude:
    """The run's own scale of things, from its scalars and its FP32 re-checks."""

    healthy_loss: float | None
    """The median of the run's first HEALTHY_STEPS finite losses; without any finite loss,
    the first FP32 re-check's (the run's magnitude as FP32 sees it)."""
    healthy_norm: float | None
    """The median of the first HEALTHY_STEPS finite gradient norms of taken steps."""
    fp32_losses: dict[int, float]
    """{step: the FP32 re-check's finite loss}."""
    shadow_losses: dict[int, float] = field(default_factory=dict)
    """{step: the FP32 shadow step's finite loss} (applied steps, sampled)."""

    def diverged(self, loss: float | None) -> bool:
        """Whether a finite `loss` is DIVERGENCE_LOSS_FACTOR x the healthy loss or more."""
        v = finite(loss)
        return (v is not None and self.healthy_loss is not None
                and v >= self.healthy_loss * DIVERGENCE_LOSS_FACTOR)

    def times(self, loss: float) -> float:
        """`loss` as a multiple of the healthy loss (NaN when that is unknown)."""
        return loss / self.healthy_loss if self.healthy_loss else math.nan


def magnitude(run: RunData, h: ScaleHistory) -> Magnitude:
    fp32 = {step: v for step, loss in sorted(run.recheck_losses.items())
            if (v := finite(loss)) is not None}
    healthy = _healthy(p.loss for p in h.steps)
    if healthy is None:
        healthy = _healthy(fp32.values())
    norm = _healthy(p.grad_norm for p in h.steps if not p.skipped)
    shadow = {s.step: v for s in run.shadows if (v := finite(s.loss)) is not None}
    return Magnitude(healthy_loss=healthy, healthy_norm=norm, fp32_losses=fp32,
                     shadow_losses=dict(sorted(shadow.items())))


def _lr_said(h: ScaleHistory) -> str:
    lrs = [lr for p in h.steps if (lr := finite(p.lr)) is not None]
    return f" (it is {lrs[-1]:g})" if lrs else ""


def divergence(run: RunData, h: ScaleHistory, m: Magnitude | None = None) -> list[Finding]:
    """Error: the loss (the run's, or its FP32 re-check's) reached DIVERGENCE_LOSS_FACTOR x
    the healthy loss, or a taken step's gradient norm DIVERGENCE_NORM_FACTOR x the healthy
    norm (among the last EDGE_STEPS taken steps the snapshot holds)."""
    m = m or magnitude(run, h)
    amp = [(p.step, v) for p in h.steps if (v := finite(p.loss)) is not None]
    amp_beyond = [(s, v) for s, v in amp if m.diverged(v)]
    if amp_beyond and (late := [v for s, v in m.shadow_losses.items()
                                if s >= amp_beyond[0][0]]) and not m.diverged(late[-1]):
        # FP32 on the same weights is at the healthy magnitude since: not the weights diverging.
        amp_beyond = []
        amp = [(s, v) for s, v in amp if not m.diverged(v)]
    beyond = sorted(amp_beyond
                    + [(s, v) for s, v in m.fp32_losses.items() if m.diverged(v)]
                    + [(s, v) for s, v in m.shadow_losses.items() if m.diverged(v)])
    taken = [(p.step, v) for p in h.steps
             if not p.skipped and (v := finite(p.grad_norm)) is not None][-EDGE_STEPS:]
    norm_peak = max(taken, key=lambda pair: pair[1], default=None)
    norm_growth = (norm_peak[1] / m.healthy_norm if norm_peak is not None and m.healthy_norm
                   else 0.0)
    # A spike the run comes back from is not a divergence: it ends beyond (no finite loss at the
    # healthy magnitude after the last one out there; the last taken step's norm still out).
    if beyond and any(p.step > beyond[-1][0] and (v := finite(p.loss)) is not None
                      and not m.diverged(v) for p in h.steps):
        beyond = []
    norm_diverged = (norm_growth >= DIVERGENCE_NORM_FACTOR and m.healthy_norm is not None
                     and taken[-1][1] >= m.healthy_norm * DIVERGENCE_NORM_FACTOR)
    if not beyond and not norm_diverged:
        return []
    evidence: dict[str, float] = {}
    sentences: list[str] = []
    if m.healthy_loss is not None:
        evidence["healthy_loss"] = m.healthy_loss
    steps: list[int] = []
    amp_peak = max(amp, key=lambda pair: pair[1], default=None)
    if amp_peak is not None and m.diverged(amp_peak[1]):
        evidence |= {"loss_peak": amp_peak[1], "loss_growth": m.times(amp_peak[1])}
        steps.append(amp_peak[0])
        sentences.append(
            f"The loss rose {m.times(amp_peak[1]):.3g}x, from the run's healthy "
            f"{m.healthy_loss:.3g} to {amp_peak[1]:.3g} at step {amp_peak[0]}.")
    fp32_peak = max(m.fp32_losses.items(), key=lambda pair: pair[1], default=None)
    if fp32_peak is not None and m.diverged(fp32_peak[1]):
        fp32_beyond = sum(1 for v in m.fp32_losses.values() if m.diverged(v))
        evidence |= {"fp32_loss_peak": fp32_peak[1], "fp32_loss_growth": m.times(fp32_peak[1]),
                     "fp32_diverged_steps": fp32_beyond}
        steps.append(fp32_peak[0])
        sentences.append(
            f"In FP32 too: the FP32 re-check (no autocast, no scaling) gave a loss of "
            f"{fp32_peak[1]:.3g} at step {fp32_peak[0]}, {m.times(fp32_peak[1]):.3g}x the "
            f"healthy loss ({fp32_beyond} re-checked step(s) that far out).")
    shadow_peak = max(m.shadow_losses.items(), key=lambda pair: pair[1], default=None)
    if shadow_peak is not None and m.diverged(shadow_peak[1]):
        shadow_beyond = sum(1 for v in m.shadow_losses.values() if m.diverged(v))
        evidence |= {"shadow_loss_peak": shadow_peak[1],
                     "shadow_loss_growth": m.times(shadow_peak[1]),
                     "shadow_diverged_steps": shadow_beyond}
        steps.append(shadow_peak[0])
        sentences.append(
            f"In FP32 too: the FP32 shadow step (the same weights and batch, no autocast, no "
            f"scaling) gave a loss of {shadow_peak[1]:.3g} at step {shadow_peak[0]}, "
            f"{m.times(shadow_peak[1]):.3g}x the healthy loss ({shadow_beyond} shadow step(s) "
            "that far out).")
    if norm_diverged and norm_peak is not None and m.healthy_norm is not None:
        evidence |= {"healthy_grad_norm": m.healthy_norm, "grad_norm_peak": norm_peak[1],
                     "grad_norm_growth": norm_growth}
        steps.append(norm_peak[0])
        sentences.append(
            f"The gradient norm of the steps taken grew {norm_growth:.3g}x, from "
            f"{m.healthy_norm:.3g} to {norm_peak[1]:.3g} at step {norm_peak[0]}.")
    start = beyond[0][0] if beyond else norm_peak[0] if norm_peak is not None else h.first_step
    in_fp32 = "fp32_loss_peak" in evidence or "shadow_loss_peak" in evidence
    lr = _lr_said(h)
    return [Finding(
        kind="divergence", severity="error",
        title=(f"Training diverges: the loss reached {m.times(max(v for _, v in beyond)):.3g}"
               f"x its healthy value{' (in FP32 too)' if in_fp32 else ''}"
               if beyond else f"Training diverges: the gradient norm grew {norm_growth:.3g}x"),
        explanation=(
            " ".join(sentences) + " A loss or norm that grows by orders of magnitude is the "
            "optimisation diverging, whatever the precision: the skipped steps, the falling "
            "loss scale and the non-finite values follow from it, and neither BF16 nor a "
            "different loss scale would stop it."),
        recommendation=(
            f"Lower the learning rate{lr} or add warm-up, and clip the gradients (after "
            "scaler.unscale_(optimizer) when a GradScaler is used); changing the precision or "
            "the loss scale will not help."),
        step_start=start, step_end=max(steps, default=start), evidence=evidence,
    )]
