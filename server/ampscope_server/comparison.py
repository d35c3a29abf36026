"""Comparison reads (GET /api/compare): fetch each run's rows, call the math, shape the response.

The math is in `compare.py` (pure). The first run given is the reference; every other run is
compared with it. Reading per-layer norms touches every layer-stat row of the compared runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from ampscope_server import codec, compare, repository, runs, series
from ampscope_server.errors import InvalidPayload
from ampscope_server.models import Run
from ampscope_server.schemas import (
    CompareRead,
    ComparisonRead,
    DivergenceRead,
    LayerDiffRead,
)

MAX_RUNS = 8


def parse_run_ids(text: str) -> list[str]:
    """`a,b[,c]` → ids: 2 to MAX_RUNS distinct, non-empty, in the order given."""
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if len(ids) != len(set(ids)):
        raise InvalidPayload(f"runs: each run may appear once, got {text!r}")
    if not 2 <= len(ids) <= MAX_RUNS:
        raise InvalidPayload(
            f"runs: give 2 to {MAX_RUNS} run ids separated by commas, got {len(ids)}")
    return ids


@dataclass
class _RunData:
    loss: dict[int, float]
    grad_norm: dict[int, float]
    layers: dict[str, dict[int, compare.LayerAt]]
    order: list[str]
    layer_steps: set[int]

    @classmethod
    def load(cls, session: Session, run: Run) -> _RunData:
        def scalars(column: str) -> dict[int, float]:
            return compare.by_step(
                (int(step), codec.from_storage(value, value_class))
                for step, value, value_class
                in repository.series_rows(session, run.id, column, None, None)
            )

        order = [layer.name for layer in repository.get_layers(session, run.id)]
        layers: dict[str, dict[int, compare.LayerAt]] = {name: {} for name in order}
        steps: set[int] = set()
        for _, step, _, _, index, l2, zero, underflow in repository.heatmap_rows(
            session, run.id, "param", ["l2", "zero_frac", "underflow_frac"], None, None
        ):
            if index < len(order):
                layers[order[index]][int(step)] = compare.LayerAt(
                    l2=l2, lost_frac=series.lost_frac(zero, underflow))
                steps.add(int(step))
        return cls(scalars("loss"), scalars("grad_norm"), layers, order, steps)


def _divergence(found: compare.Divergence | None) -> DivergenceRead | None:
    if found is None:
        return None
    return DivergenceRead(metric=found.metric, step=found.step, reference_value=found.reference,
                          value=found.value, relative=found.relative)


def _comparison(
    reference: Run, ref: _RunData, run: Run, other: _RunData, tolerance: float, threshold: float
) -> ComparisonRead:
    loss = compare.first_divergence("loss", ref.loss, other.loss, tolerance)
    grad_norm = compare.first_divergence("grad_norm", ref.grad_norm, other.grad_norm, tolerance)
    side = {"reference": reference.id, "other": run.id}
    layers = [
        LayerDiffRead(
            layer=d.name, steps=d.steps, l2_ratio=d.l2_ratio, ratio_steps=d.ratio_steps,
            lost_frac_reference=d.lost_frac_reference, lost_frac=d.lost_frac_other,
            underflow_only_in=None if d.underflow_only_in is None else side[d.underflow_only_in],
        )
        for d in compare.layer_diffs(ref.layers, other.layers, ref.order, threshold)
    ]
    ref_steps = ref.loss.keys() | ref.grad_norm.keys()
    other_steps = other.loss.keys() | other.grad_norm.keys()
    return ComparisonRead(
        run=run.id, reference=reference.id, common_steps=len(ref_steps & other_steps),
        layer_steps=len(ref.layer_steps & other.layer_steps),
        divergence=_divergence(compare.earliest(loss, grad_norm)),
        loss_divergence=_divergence(loss), grad_norm_divergence=_divergence(grad_norm),
        layers=layers,
    )


def compare_runs(
    session: Session, run_ids: list[str], tolerance: float, threshold: float,
    crash_timeout_s: float,
) -> CompareRead:
    """Every run after the first compared with the first (404 for an unknown run)."""
    loaded = [runs.load_run(session, run_id) for run_id in run_ids]
    data = [_RunData.load(session, run) for run in loaded]
    reference, ref = loaded[0], data[0]
    return CompareRead(
        tolerance=tolerance, underflow_threshold=threshold, reference=reference.id,
        runs=runs.summaries(session, loaded, crash_timeout_s),
        comparisons=[
            _comparison(reference, ref, run, other, tolerance, threshold)
            for run, other in zip(loaded[1:], data[1:], strict=True)
        ],
    )
