"""Pure comparison math for two runs aligned by step: first divergence and per-layer differences.

No I/O. A is the reference run, B the one compared with it. Inputs are maps keyed by step
(`by_step` builds them from rows in step-then-ingest order, so a step sent again by a resumed
attempt keeps its last value).

- First divergence: the first step present in both runs where B's value departs from A's by more
  than `tolerance` relative to A: |b - a| > tolerance · |a| (`relative_difference`). NaN equals
  NaN and inf equals inf (both runs overflowed alike); any other non-finite mismatch, or a = 0
  with b ≠ 0, is an infinite relative difference.
- Per-layer differences, for the layers present in both runs (by name): the median over the common
  layer-stat steps of l2_B / l2_A (steps where either norm is unknown or A's is 0 are left out),
  the median `lost_frac` of each, and which run alone underflows (median lost_frac above the
  threshold in one run but not the other). A step where the layer held NaN or inf in either run
  counts in `nonfinite_steps` and in neither the ratio nor the medians: its norm is over the
  finite elements only (0 when none is) and its zeros are born of the NaN, not of the format, so
  a diverged run would otherwise read "0x" and "underflow only in" for every layer.
- Long runs are searched through their rollups (`suspect_buckets`): the buckets where the two
  runs may part are the only ones whose raw steps are read.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ampscope_server.store.rollups import SeriesAcc

Metric = Literal["loss", "grad_norm"]
Side = Literal["reference", "other"]


@dataclass(frozen=True)
class Divergence:
    metric: Metric
    step: int
    reference: float
    """A's value at `step`."""
    value: float
    """B's value at `step`."""
    relative: float
    """|b - a| / |a| (inf when a is 0 or the two are not both finite)."""


@dataclass(frozen=True)
class LayerAt:
    """One layer at one step: its gradient L2 norm (None: no finite element), lost share, and
    whether it held any NaN or inf."""

    l2: float | None
    lost_frac: float
    nonfinite: bool = False


@dataclass(frozen=True)
class LayerDiff:
    name: str
    steps: int
    """Layer-stat steps the two runs have in common."""
    l2_ratio: float | None
    """Median of l2_B / l2_A over the common steps where both are known and l2_A > 0."""
    ratio_steps: int
    """How many steps that median is over."""
    lost_frac_reference: float | None
    lost_frac_other: float | None
    underflow_only_in: Side | None
    nonfinite_steps: int = 0
    """Common steps where either run's layer held NaN or inf (left out of the medians)."""


def by_step(rows: Iterable[tuple[int, float | None]]) -> dict[int, float]:
    """{step: value} from (step, value) rows in step then ingest order; None values are skipped
    and the last value of a repeated step wins."""
    out: dict[int, float] = {}
    for step, value in rows:
        if value is not None:
            out[step] = value
    return out


def relative_difference(reference: float, value: float) -> float:
    """|value - reference| / |reference|, with the non-finite rules of the module docstring."""
    if math.isnan(reference) and math.isnan(value):
        return 0.0
    if reference == value:  # equal infinities, or 0 == 0
        return 0.0
    if not (math.isfinite(reference) and math.isfinite(value)) or reference == 0:
        return math.inf
    return abs(value - reference) / abs(reference)


def first_divergence(
    metric: Metric, reference: Mapping[int, float], other: Mapping[int, float], tolerance: float
) -> Divergence | None:
    """The first common step where `other` departs from `reference` by more than `tolerance`."""
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be a number ≥ 0, got {tolerance}")
    for step in sorted(reference.keys() & other.keys()):
        a, b = reference[step], other[step]
        relative = relative_difference(a, b)
        if relative > tolerance:
            return Divergence(metric, step, a, b, relative)
    return None


def earliest(*found: Divergence | None) -> Divergence | None:
    """The divergence at the lowest step (the first given wins a tie); None when none."""
    present = [d for d in found if d is not None]
    return min(present, key=lambda d: d.step) if present else None


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def layer_diffs(
    reference: Mapping[str, Mapping[int, LayerAt]],
    other: Mapping[str, Mapping[int, LayerAt]],
    order: Sequence[str],
    threshold: float,
) -> list[LayerDiff]:
    """Differences for each layer named in both runs, in `order` (the reference's model order).

    `reference`/`other`: {layer name: {step: LayerAt}}.
    """
    diffs: list[LayerDiff] = []
    for name in order:
        if name not in reference or name not in other:
            continue
        a, b = reference[name], other[name]
        both = sorted(a.keys() & b.keys())
        common = [s for s in both if not (a[s].nonfinite or b[s].nonfinite)]
        ratios = [
            b_l2 / a_l2
            for a_l2, b_l2 in ((a[s].l2, b[s].l2) for s in common)
            if a_l2 is not None and b_l2 is not None and a_l2 > 0
        ]
        lost_a = _median([a[s].lost_frac for s in common])
        lost_b = _median([b[s].lost_frac for s in common])
        only: Side | None = None
        if lost_a is not None and lost_b is not None and (lost_a > threshold) != (
            lost_b > threshold
        ):
            only = "reference" if lost_a > threshold else "other"
        diffs.append(LayerDiff(
            name=name, steps=len(both), l2_ratio=_median(ratios), ratio_steps=len(ratios),
            lost_frac_reference=lost_a, lost_frac_other=lost_b, underflow_only_in=only,
            nonfinite_steps=len(both) - len(common),
        ))
    return diffs


def suspect_buckets(
    reference: Mapping[int, SeriesAcc], other: Mapping[int, SeriesAcc], tolerance: float
) -> list[int]:
    """The buckets (in order) held by both runs where they may part beyond `tolerance`: the
    last values differ (or were taken at different steps), or the minima or the maxima do.

    Min and max keep a spike or a NaN-free overflow of either run visible, and a drift moves
    the last values; a divergence that changes none of the three inside one bucket (a
    transient one that stays within both runs' ranges) is not suspected.
    """
    out: list[int] = []
    for bucket in sorted(reference.keys() & other.keys()):
        a, b = reference[bucket], other[bucket]
        if a.n == 0 or b.n == 0:
            continue
        if (a.last_step != b.last_step
                or relative_difference(a.last, b.last) > tolerance
                or relative_difference(a.lo, b.lo) > tolerance
                or relative_difference(a.hi, b.hi) > tolerance):
            out.append(bucket)
    return out


LayerColumns = tuple[Sequence[float], Sequence[float], Sequence[bool]]
"""One bucket of one run: (l2 per layer, lost_frac per layer, whether the layer held NaN or inf
in the bucket) in the run's layer order, a layer without a value holding -inf in the first two
(the rollups' `MISSING`)."""


def bucket_layer_diffs(
    reference: Mapping[int, LayerColumns], reference_order: Sequence[str],
    other: Mapping[int, LayerColumns], other_order: Sequence[str], threshold: float,
) -> list[LayerDiff]:
    """`layer_diffs` over buckets given as arrays ({bucket: LayerColumns}): the same medians,
    with a bucket in the place of a step and -inf in the place of "no value"; a layer's
    bucket counts when both runs have its lost_frac. Arrays, not a LayerAt per value: this
    runs on every comparison of long runs (200 layers x 128 buckets x 2 runs)."""
    common = sorted(reference.keys() & other.keys())
    if not common:
        return layer_diffs({n: {} for n in reference_order}, {n: {} for n in other_order},
                           reference_order, threshold)
    # Transposed once, in C: a tuple over the common buckets per layer.
    ref_l2 = list(zip(*(reference[k][0] for k in common), strict=True))
    ref_lost = list(zip(*(reference[k][1] for k in common), strict=True))
    ref_bad = list(zip(*(reference[k][2] for k in common), strict=True))
    other_l2 = list(zip(*(other[k][0] for k in common), strict=True))
    other_lost = list(zip(*(other[k][1] for k in common), strict=True))
    other_bad = list(zip(*(other[k][2] for k in common), strict=True))
    position = {name: j for j, name in enumerate(other_order)}
    missing = -math.inf
    diffs: list[LayerDiff] = []
    for i, name in enumerate(reference_order):
        j = position.get(name)
        if j is None or i >= len(ref_lost) or j >= len(other_lost):
            continue
        held = [(a_l2, b_l2, a_lost, b_lost, a_bad or b_bad)
                for a_l2, b_l2, a_lost, b_lost, a_bad, b_bad in zip(
                    ref_l2[i], other_l2[j], ref_lost[i], other_lost[j], ref_bad[i], other_bad[j],
                    strict=True)
                if a_lost != missing and b_lost != missing]
        both = [row[:4] for row in held if not row[4]]
        ratios = [b_l2 / a_l2 for a_l2, b_l2, _, _ in both if a_l2 > 0 and b_l2 != missing]
        lost_a = _median([row[2] for row in both])
        lost_b = _median([row[3] for row in both])
        only: Side | None = None
        if lost_a is not None and lost_b is not None and (lost_a > threshold) != (
            lost_b > threshold
        ):
            only = "reference" if lost_a > threshold else "other"
        diffs.append(LayerDiff(
            name=name, steps=len(held), l2_ratio=_median(ratios), ratio_steps=len(ratios),
            lost_frac_reference=lost_a, lost_frac_other=lost_b, underflow_only_in=only,
            nonfinite_steps=len(held) - len(both),
        ))
    return diffs
