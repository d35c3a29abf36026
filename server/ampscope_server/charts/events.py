"""A run's event list from stored rows: scale changes, skipped steps, non-finite gradients that
were applied (no scaler), AMP misuse. Pure: no I/O.

Events are never downsampled. Order: by step, then ingest order; within one step row, the
`scale_events` order (skipped, then backoff or growth), then its misuse events as reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ampscope_server.charts import series_math
from ampscope_server.charts.schemas import (
    AnyEventRead,
    EventLayerRead,
    EventRead,
    MisuseEventRead,
    NonfiniteEventRead,
    SkippedEventRead,
)
from ampscope_server.runs.schemas import RecheckRead, ShadowRead


@dataclass(frozen=True)
class StepRow:
    """A step that was skipped, held a non-finite gradient or changed the scale."""

    step_id: int
    step: int
    skipped: bool
    scale_before: float | None
    scale_after: float | None
    loss: float | None
    found_inf: bool = False


@dataclass(frozen=True)
class MisuseRow:
    step_id: int
    step: int
    scale_before: float | None
    scale_after: float | None
    kind: str
    detail: str


def loss_finite(loss: float | None) -> bool | None:
    """False when the loss itself overflowed (forward), True when finite, None when not given."""
    return None if loss is None else math.isfinite(loss)


def build_events(
    steps: Sequence[StepRow],
    misuse: Sequence[MisuseRow],
    bad_layers: Mapping[int, Sequence[tuple[int, str]]],
    layer_names: Sequence[str],
    rechecks: Mapping[int, RecheckRead] | None = None,
    shadows: Mapping[int, ShadowRead] | None = None,
) -> list[AnyEventRead]:
    """Merge step events and misuse events, both given in (step, step id) order.

    `bad_layers` maps a step id to its (layer index, "nan" | "inf") in backward order; a skipped
    step without an entry lists no layers (not measured, or none). A `found_inf` step that was
    not skipped (no scaler: the optimizer applied it) is a `nonfinite` event with the same
    details. `rechecks` maps a step id to
    its FP32 re-check (wire v3), carried by the step's `skipped` event; `shadows` to its FP32
    shadow step (wire v6: only ever an applied step), carried by its `nonfinite` event.
    """
    rechecks = rechecks or {}
    shadows = shadows or {}
    keyed: list[tuple[tuple[int, int, int], AnyEventRead]] = []
    for row in steps:
        if row.found_inf and not row.skipped:
            keyed.append(((row.step, row.step_id, 0), NonfiniteEventRead(
                step=row.step, kind="nonfinite", scale_before=row.scale_before,
                scale_after=row.scale_after, loss_finite=loss_finite(row.loss),
                layers=_layers(bad_layers.get(row.step_id, ()), layer_names),
                shadow=shadows.get(row.step_id))))
        for event in series_math.scale_events(
            [(row.step, row.skipped, row.scale_before, row.scale_after)]
        ):
            if event.kind == "skipped":
                keyed.append(((row.step, row.step_id, 0), SkippedEventRead(
                    step=row.step, kind="skipped", scale_before=row.scale_before,
                    scale_after=row.scale_after, loss_finite=loss_finite(row.loss),
                    layers=_layers(bad_layers.get(row.step_id, ()), layer_names),
                    recheck=rechecks.get(row.step_id),
                )))
            else:
                keyed.append(((row.step, row.step_id, 0), EventRead.model_validate({
                    "step": row.step, "kind": event.kind, "scale_before": row.scale_before,
                    "scale_after": row.scale_after,
                })))
    for m in misuse:
        keyed.append(((m.step, m.step_id, 1), MisuseEventRead.model_validate({
            "step": m.step, "kind": "misuse", "scale_before": m.scale_before,
            "scale_after": m.scale_after, "misuse_kind": m.kind, "detail": m.detail,
        })))
    keyed.sort(key=lambda pair: pair[0])  # stable: each group keeps its order
    return [event for _, event in keyed]


def _layers(bad: Sequence[tuple[int, str]], layer_names: Sequence[str]) -> list[EventLayerRead]:
    return [EventLayerRead.model_validate({
        "index": index, "kind": kind,
        "name": layer_names[index] if index < len(layer_names) else "",
    }) for index, kind in bad]
