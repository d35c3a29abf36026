"""Service: the first step where two runs part (loss or grad norm), read within a bound.

A common range of at most `SCALAR_RAW_STEPS` steps is compared step by step. A longer one is
searched through the rollups of the finest level with at most `SCALAR_BUCKETS` buckets: only
the buckets where the runs may part (`maths.suspect_buckets`) are read raw, each with the
bucket before it, and the first step found beyond the tolerance there is the answer (not
guaranteed the very first: `exact` False). Used by `GET /api/compare` (`compare.reads`) and by
the findings against a baseline (`findings.reads`), so both judge divergence alike.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from ampscope_server.compare import maths
from ampscope_server.store import rollups, rollups_repository, steps_repository
from ampscope_server.store.float_storage import from_storage

SCALAR_RAW_STEPS = 8192
"""Longest common range whose loss and grad norm are compared step by step."""
SCALAR_BUCKETS = 1024
"""Most rollup buckets searched for a divergence on a longer range."""
MAX_REFINE = 16
"""Most suspect buckets read raw before the search gives up (no divergence reported)."""

METRICS: tuple[maths.Metric, ...] = ("loss", "grad_norm")
_SERIES_INDEX = {name: rollups.SERIES.index(name) for name in METRICS}


def level_for(first: int, last: int, max_buckets: int) -> int:
    """The finest rollup level whose buckets over [first, last] number at most `max_buckets`."""
    return next((lvl for lvl in rollups.LEVELS if (last >> lvl) - (first >> lvl) < max_buckets),
                rollups.LEVELS[-1])


def _scalars(
    session: Session, run_id: str, metric: str, start: int, end: int, taken_only: bool = True
) -> dict[int, float]:
    """{step: value}. A skipped step's grad norm is that of an overflowed gradient the optimizer
    never used, so `GET /api/compare` compares the grad norm over taken steps only
    (`taken_only`): a calibration overflow in one run (the scaler's first steps) is not a
    divergence. The baseline finding counts it (an overflow the baseline had not is news)."""
    rows = steps_repository.series_rows(session, run_id, metric, start, end,
                                  applied_only=taken_only and metric == "grad_norm")
    return maths.by_step(
        (int(step), from_storage(value, value_class)) for step, value, value_class in rows)


def divergences_raw(
    session: Session, a: str, b: str, start: int, end: int, tolerance: float,
    taken_only: bool = True,
) -> tuple[dict[str, maths.Divergence | None], int]:
    """Each metric's first divergence over every step of [start, end], and the common steps."""
    found: dict[str, maths.Divergence | None] = {}
    steps: list[set[int]] = [set(), set()]
    for metric in METRICS:
        ref = _scalars(session, a, metric, start, end, taken_only)
        other = _scalars(session, b, metric, start, end, taken_only)
        found[metric] = maths.first_divergence(metric, ref, other, tolerance)
        steps[0] |= ref.keys()
        steps[1] |= other.keys()
    return found, len(steps[0] & steps[1])


def divergences_bucketed(
    session: Session, a: str, b: str, start: int, end: int, tolerance: float,
    taken_only: bool = True,
) -> tuple[dict[str, maths.Divergence | None], int]:
    """As `divergences_raw`, searched through rollups; the common steps are estimated per
    bucket as the smaller of the two runs' counts."""
    level = level_for(start, end, SCALAR_BUCKETS)
    first, last = start >> level, end >> level
    rows = [rollups_repository.rollup_rows(session, run_id, level, first, last, ["series"])
            for run_id in (a, b)]
    per_metric = {  # metric → per run: {bucket: SeriesAcc}; only the two series unpacked
        metric: [{int(bucket): rollups.unpack_series(blob, index)[0] for bucket, blob in run_rows}
                 for run_rows in rows]
        for metric, index in _SERIES_INDEX.items()
    }
    common = 0
    for bucket in per_metric["loss"][0].keys() & per_metric["loss"][1].keys():
        common += min(max(accs[side][bucket].n for accs in per_metric.values())
                      for side in (0, 1))
    found: dict[str, maths.Divergence | None] = {}
    for metric in _SERIES_INDEX:
        reference, other = per_metric[metric]
        suspects = maths.suspect_buckets(reference, other, tolerance)
        found[metric] = None
        for bucket in suspects[:MAX_REFINE]:
            # With the bucket before: a drift is often first seen one bucket late.
            lo, hi = max(start, (bucket - 1) << level), min(end, ((bucket + 1) << level) - 1)
            found[metric] = maths.first_divergence(
                metric, _scalars(session, a, metric, lo, hi, taken_only),
                _scalars(session, b, metric, lo, hi, taken_only), tolerance)
            if found[metric] is not None:
                break
    return found, common


def search(
    session: Session, reference_id: str, other_id: str, tolerance: float,
    taken_only: bool = True,
) -> maths.Divergence | None:
    """The earliest divergence in loss or grad norm of `other_id` from `reference_id` over the
    steps both runs have, within the bounds above (`taken_only`: see `_scalars`)."""
    ref, other = (rollups_repository.step_extent(session, run_id)
                  for run_id in (reference_id, other_id))
    if ref is None or other is None:
        return None
    start, end = max(ref[0], other[0]), min(ref[1], other[1])
    if start > end:
        return None
    search = divergences_raw if end - start + 1 <= SCALAR_RAW_STEPS else divergences_bucketed
    found, _ = search(session, reference_id, other_id, start, end, tolerance, taken_only)
    return maths.earliest(*(found[metric] for metric in METRICS))
