"""Builders of synthetic run snapshots for the findings tests: a GradScaler simulated step by
step (defaults: init 2^16, growth 2 every `growth_interval` clean steps, backoff 0.5)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence

from ampscope_server.findings import (
    LayerInfo,
    LayerSample,
    MisuseEvent,
    NonfiniteStep,
    RecheckStatus,
    RunData,
    StepPoint,
    SwallowedSample,
)
from ampscope_server.findings.facts import NonfiniteKind

LAYERS = [
    LayerInfo("embed.weight", "float32", (100, 16), 1600, "Embedding"),
    LayerInfo("fc1.weight", "float32", (32, 16), 512, "Linear"),
    LayerInfo("fc1.bias", "float32", (32,), 32, "Linear"),
    LayerInfo("fc2.weight", "float32", (1, 32), 32, "Linear"),
]


def scaler_steps(
    n: int, overflow: Callable[[int, float], bool], *, init: float = 2.0**16,
    growth_interval: int = 2000, loss: Callable[[int], float] | None = None,
    lr: Callable[[int], float] | None = None,
) -> list[StepPoint]:
    """`n` steps of a simulated GradScaler; `overflow(step, scale)` says whether the step's
    scaled gradients overflow."""
    steps = []
    scale, tracker = init, 0
    for step in range(n):
        bad = overflow(step, scale)
        if bad:
            after, tracker = scale * 0.5, 0
        else:
            tracker += 1
            after = scale
            if tracker == growth_interval:
                after, tracker = scale * 2.0, 0
        steps.append(StepPoint(
            step=step, scale_before=scale, scale_after=after, found_inf=bad, skipped=bad,
            loss=(loss(step) if loss else 2.0 * math.exp(-step / 500)),
            grad_norm=math.inf if bad else 0.5, lr=lr(step) if lr else 1e-3,
            growth_tracker=tracker))
        scale = after
    return steps


def fits_below(limit: float) -> Callable[[int, float], bool]:
    """Gradients that overflow whenever the scale exceeds `limit`."""
    return lambda step, scale: scale > limit


def healthy_samples(steps: Collection[int], scale: float = 2.0**10) -> list[LayerSample]:
    """Per-layer stats of a healthy dense model: small lost fractions, ample headroom."""
    out = []
    for step in sorted(steps):
        for layer, info in enumerate(LAYERS):
            out.append(LayerSample(
                step=step, layer=layer, scale=scale, amax=0.05, amin_nz=1e-7,
                zero_frac=0.9 if info.module_type == "Embedding" else 0.0,
                underflow_frac=0.0, l2=0.2 * math.sqrt(info.numel) * 0.01))
    return out


def run_data(
    steps: list[StepPoint], *, layers: Sequence[LayerInfo] = LAYERS,
    layer_samples: Sequence[LayerSample] = (), nonfinite: Sequence[NonfiniteStep] = (),
    misuse: Sequence[MisuseEvent] = (),
    nan_context: Mapping[int, Sequence[LayerSample]] | None = None,
    target_format: str = "fp16", name: str = "",
    swallowed: Sequence[SwallowedSample] = (), rechecks: Mapping[int, RecheckStatus] | None = None,
    recheck_losses: Mapping[int, float] | None = None,
) -> RunData:
    return RunData(
        target_format=target_format, layers=layers, steps=steps, layer_samples=layer_samples,
        nonfinite=nonfinite, misuse=misuse, nan_context=nan_context or {}, name=name,
        swallowed=swallowed, rechecks=rechecks or {}, recheck_losses=recheck_losses or {})


def nonfinite_at(
    steps: Collection[int], *layers: tuple[int, NonfiniteKind]
) -> list[NonfiniteStep]:
    return [NonfiniteStep(step, tuple(layers)) for step in sorted(steps)]
