"""Wire batches of simulated runs with known findings, for the DB, API and CLI tests."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ampscope_server.findings import StepPoint
from tests.server.findings.synthetic import fits_below, scaler_steps
from tests.server.wire import batch_v2, layer_stats, record_v2

STEPS = 400
STORM = frozenset(range(200, 260, 10))  # 6 overflows in 60 steps
MISUSE = (300, 301)
NAN_LOSS = 350


def _tag(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def records(points: list[StepPoint], *, layer_every: int = 10,
            extra: Callable[[StepPoint], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    out = []
    for p in points:
        rec = record_v2(
            p.step, with_layers=p.step % layer_every == 0, scale_before=p.scale_before,
            scale_after=p.scale_after, found_inf=p.found_inf, skipped=p.skipped,
            loss=_tag(p.loss), grad_norm=_tag(p.grad_norm), lr=p.lr,
            growth_tracker=p.growth_tracker)
        if rec["layers"] is not None:
            rec["layers"] = layer_stats(1.0)
            rec["layers"]["nan_count"] = [0, 0]
            rec["layers"]["inf_count"] = [0, 0]
        if extra is not None:
            rec.update(extra(p))
        out.append(rec)
    return out


def healthy_points() -> list[StepPoint]:
    return scaler_steps(STEPS, fits_below(2**10), loss=lambda s: 2.0 - s / 1000)


def troubled_points() -> list[StepPoint]:
    """Calibration (steps 0-5), a storm (200-250), NaN loss at 350."""
    return scaler_steps(
        STEPS, lambda s, scale: scale > 2**10 or s in STORM or s == NAN_LOSS,
        loss=lambda s: math.nan if s == NAN_LOSS else 2.0 - s / 1000)


def _troubled_extra(p: StepPoint) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if p.found_inf:
        # fc1.bias overflows first (backward order), then fc1.weight.
        extra["nonfinite"] = [{"layer": 1, "kind": "inf"}, {"layer": 0, "kind": "inf"}]
    else:
        extra["nonfinite"] = []
    extra["misuse"] = (
        [{"kind": "clip_before_unscale", "detail": "clip_grad_norm_ on scaled gradients"}]
        if p.step in MISUSE else [])
    return extra


def healthy_batch(run_id: str, name: str = "healthy") -> dict[str, Any]:
    return batch_v2(records(healthy_points()), run_id=run_id, name=name, final=True)


def troubled_batch(run_id: str, name: str = "troubled") -> dict[str, Any]:
    return batch_v2(records(troubled_points(), extra=_troubled_extra), run_id=run_id, name=name,
                    final=True)
