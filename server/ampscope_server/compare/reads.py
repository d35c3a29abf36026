"""Comparison reads (GET /api/compare): fetch each run's rows, call the math, shape the response.

The math is in `maths.py` (pure). The first run given is the reference; every other run is
compared with it over the steps both runs have (`common range`).

The reads stay bounded whatever the runs' length, as the chart queries do (DESIGN.md §8's
budget for a chart query):

- Divergence: `divergence_search` (step by step up to its SCALAR_RAW_STEPS common steps, a
  rollup search beyond: `divergence_exact: false`).
- Layers are matched by canonical name (`layer_names`: wrappers' `module.`, `_orig_mod.`, …
  removed), computed here from the stored names: runs stored before the hook sent canonical
  names carry raw ones, and a wrapped run must still match a plain run of the same model.
- Per-layer differences: at most `LAYER_RAW_ROWS` layer rows per run are read raw (medians
  over steps). Past that the medians are over the rollup buckets of the finest level with at
  most `LAYER_BUCKETS` buckets, each bucket standing for its worst (largest) l2 and lost_frac
  (`layer_bucket_width` > 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from ampscope_server.access.principal import ANONYMOUS, Principal
from ampscope_server.charts import series_math
from ampscope_server.compare import divergence_search, maths
from ampscope_server.compare.divergence_search import (
    METRICS,
    divergences_bucketed,
    divergences_raw,
    level_for,
)
from ampscope_server.compare.schemas import (
    CompareRead,
    ComparisonRead,
    DivergenceRead,
    LayerDiffRead,
)
from ampscope_server.errors import InvalidPayload
from ampscope_server.runs import layer_names
from ampscope_server.runs import reads as runs
from ampscope_server.store import rollups, rollups_repository, runs_repository, steps_repository
from ampscope_server.store.models import Run

MAX_RUNS = 8
LAYER_RAW_ROWS = 20_000
"""Most layer rows per run read raw for the per-layer differences."""
LAYER_BUCKETS = 128
"""Most rollup buckets the per-layer medians are taken over on a longer range."""


LayerMap = dict[str, dict[int, maths.LayerAt]]


def parse_run_ids(text: str) -> list[str]:
    """`a,b[,c]` → ids: 2 to MAX_RUNS distinct, non-empty, in the order given."""
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if len(ids) != len(set(ids)):
        raise InvalidPayload(f"runs: each run may appear once, got {text!r}")
    if not 2 <= len(ids) <= MAX_RUNS:
        raise InvalidPayload(
            f"runs: give 2 to {MAX_RUNS} run ids separated by commas, got {len(ids)}")
    return ids


@dataclass(frozen=True)
class _Side:
    run: Run
    order: list[str]
    """The run's canonical layer names (`layer_names.canonical_names`), in index order."""
    extent: tuple[int, int] | None


def _layers_raw(session: Session, side: _Side, start: int, end: int) -> LayerMap:
    layers: LayerMap = {name: {} for name in side.order}
    for _, step, _, _, index, l2, zero, underflow, nans, infs in steps_repository.heatmap_rows(
        session, side.run.id, "param",
        ["l2", "zero_frac", "underflow_frac", "nan_count", "inf_count"], start, end,
    ):
        if index < len(side.order):
            layers[side.order[index]][int(step)] = maths.LayerAt(
                l2=l2, lost_frac=series_math.lost_frac(zero, underflow),
                nonfinite=bool(nans) or bool(infs))
    return layers


def _layers_bucketed(
    session: Session, side: _Side, level: int, start: int, end: int
) -> dict[int, maths.LayerColumns]:
    """{bucket's first step: (largest l2, largest lost_frac, any NaN/inf) per layer} from one
    rollup level; buckets without layer statistics are left out."""
    out: dict[int, maths.LayerColumns] = {}
    for bucket, l2, lost, nans, infs in rollups_repository.rollup_rows(
        session, side.run.id, level, start >> level, end >> level,
        ["l2", "lost_frac", "nan_count", "inf_count"],
    ):
        if l2 is None or lost is None:
            continue
        bad = [n > 0 or i > 0 for n, i in zip(rollups.unpack_stat("nan_count", nans),
                                              rollups.unpack_stat("inf_count", infs),
                                              strict=True)]
        out[int(bucket) << level] = (rollups.unpack_stat("l2", l2),
                                     rollups.unpack_stat("lost_frac", lost), bad)
    return out


def _divergence(found: maths.Divergence | None) -> DivergenceRead | None:
    if found is None:
        return None
    return DivergenceRead(metric=found.metric, step=found.step, reference_value=found.reference,
                          value=found.value, relative=found.relative)


def _comparison(
    session: Session, ref: _Side, other: _Side, tolerance: float, threshold: float
) -> ComparisonRead:
    found: dict[str, maths.Divergence | None] = dict.fromkeys(METRICS)
    common_steps, exact, width = 0, True, 1
    ref_layers: LayerMap = {name: {} for name in ref.order}
    other_layers: LayerMap = {name: {} for name in other.order}
    diffs: list[maths.LayerDiff] | None = None
    if ref.extent is not None and other.extent is not None:
        start, end = max(ref.extent[0], other.extent[0]), min(ref.extent[1], other.extent[1])
        if start <= end:
            span = end - start + 1
            exact = span <= divergence_search.SCALAR_RAW_STEPS
            search = divergences_raw if exact else divergences_bucketed
            found, common_steps = search(session, ref.run.id, other.run.id, start, end, tolerance)
            if span * max(len(ref.order), len(other.order), 1) <= LAYER_RAW_ROWS:
                ref_layers = _layers_raw(session, ref, start, end)
                other_layers = _layers_raw(session, other, start, end)
            else:
                level = level_for(start, end, LAYER_BUCKETS)
                width = 1 << level
                ref_buckets = _layers_bucketed(session, ref, level, start, end)
                other_buckets = _layers_bucketed(session, other, level, start, end)
                diffs = maths.bucket_layer_diffs(ref_buckets, ref.order, other_buckets,
                                                   other.order, threshold)
                layer_steps = len(ref_buckets.keys() & other_buckets.keys())
    if diffs is None:
        diffs = maths.layer_diffs(ref_layers, other_layers, ref.order, threshold)
        layer_steps = len(set().union(*ref_layers.values()) & set().union(*other_layers.values()))
    side = {"reference": ref.run.id, "other": other.run.id}
    layers = [
        LayerDiffRead(
            layer=d.name, steps=d.steps, l2_ratio=d.l2_ratio, ratio_steps=d.ratio_steps,
            lost_frac_reference=d.lost_frac_reference, lost_frac=d.lost_frac_other,
            underflow_only_in=None if d.underflow_only_in is None else side[d.underflow_only_in],
            nonfinite_steps=d.nonfinite_steps,
        )
        for d in diffs
    ]
    loss, grad_norm = found["loss"], found["grad_norm"]
    return ComparisonRead(
        run=other.run.id, reference=ref.run.id, common_steps=common_steps,
        layer_steps=layer_steps,
        divergence=_divergence(maths.earliest(loss, grad_norm)),
        loss_divergence=_divergence(loss), grad_norm_divergence=_divergence(grad_norm),
        layers=layers, divergence_exact=exact, layer_bucket_width=width,
    )


def compare_runs(
    session: Session, run_ids: list[str], tolerance: float, threshold: float,
    crash_timeout_s: float, viewer: Principal = ANONYMOUS,
) -> CompareRead:
    """Every run after the first compared with the first (404 for an unknown run, or one of a
    project `viewer` cannot see)."""
    loaded = [runs.load_run(session, run_id, viewer) for run_id in run_ids]
    sides = [
        _Side(run, layer_names.canonical_names(runs_repository.layer_names(session, run.id)),
              rollups_repository.step_extent(session, run.id))
        for run in loaded
    ]
    return CompareRead(
        tolerance=tolerance, underflow_threshold=threshold, reference=loaded[0].id,
        runs=runs.summaries(session, loaded, crash_timeout_s),
        comparisons=[_comparison(session, sides[0], side, tolerance, threshold)
                     for side in sides[1:]],
    )
