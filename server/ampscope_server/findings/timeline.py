"""The scale history of a run, read from its steps: skips, growths, calibration and probes.

Pure helpers shared by the scaling detectors. Steps are taken in step order with one entry per
step number (a step sent again by a resumed attempt keeps its last value).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ampscope_server.findings.facts import NonfiniteStep, RunData, StepPoint
from ampscope_server.findings.thresholds import (
    CALIBRATION_GAP_STEPS,
    CALIBRATION_START_STEPS,
    COLLAPSE_SCALE,
    MODERATE_SCALE,
    STORM_MIN_SKIPS,
    STORM_WINDOW_STEPS,
)


def ordered(steps: Iterable[StepPoint]) -> list[StepPoint]:
    """One point per step number, the last given winning, in step order."""
    by_step: dict[int, StepPoint] = {}
    for point in steps:
        by_step[point.step] = point
    return [by_step[step] for step in sorted(by_step)]


def finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def is_growth(point: StepPoint) -> bool:
    before, after = finite(point.scale_before), finite(point.scale_after)
    return before is not None and after is not None and after > before


@dataclass
class ScaleHistory:
    steps: list[StepPoint]
    skips: list[int]
    """Step numbers of skipped steps, ascending."""
    growths: list[int]
    calibration: list[int]
    """The descent from init_scale to the scale the run settles at (`_calibration`)."""
    probes: list[int]
    """The first skip after each growth: the scaler probing a higher scale."""
    _by_step: dict[int, StepPoint] = field(init=False, repr=False)
    _scale_steps: list[int] = field(init=False, repr=False)
    _scales: list[float] = field(init=False, repr=False)

    @property
    def settled_scale(self) -> float | None:
        """The scale the calibration came down to: in effect after its last skip."""
        return self.scale_at(self.calibration[-1]) if self.calibration else None

    @property
    def first_step(self) -> int:
        return self.steps[0].step

    @property
    def last_step(self) -> int:
        return self.steps[-1].step

    @property
    def span(self) -> int:
        """Optimizer attempts from the first to the last step (step numbers are contiguous)."""
        return self.last_step - self.first_step + 1

    def point(self, step: int) -> StepPoint | None:
        return self._by_step.get(step)

    def scale_at(self, step: int) -> float | None:
        """The scale in effect after `step` (the last known `scale_after` at or before it)."""
        at = bisect.bisect_right(self._scale_steps, step)
        return self._scales[at - 1] if at else None

    def __post_init__(self) -> None:
        self._by_step = {p.step: p for p in self.steps}
        known = [(p.step, s) for p in self.steps if (s := finite(p.scale_after)) is not None]
        self._scale_steps = [step for step, _ in known]
        self._scales = [scale for _, scale in known]


def history(run: RunData) -> ScaleHistory | None:
    """The run's scale history; None for a run without steps."""
    steps = ordered(run.steps)
    if not steps:
        return None
    skips = [p.step for p in steps if p.skipped]
    growths = [p.step for p in steps if is_growth(p)]
    first_kind = {entry.step: entry.layers[0][1] for entry in run.nonfinite if entry.layers}
    return ScaleHistory(steps, skips, growths, _calibration(steps, first_kind), _probes(steps))


def _calibration(steps: Sequence[StepPoint], first_kind: Mapping[int, str]) -> list[int]:
    """The initial descent (`_descent`) and the later skips that carry it on: before the first
    growth, each to a scale lower than any before, with a finite loss (only the scaled
    gradients overflowed), a range overflow by its look (a scale above MODERATE_SCALE, or inf
    the first non-finite gradient in backward order: a NaN first at a moderate scale is
    `nan_not_range`'s), and too few to be a storm (fewer than STORM_MIN_SKIPS of the skips
    after the descent in any STORM_WINDOW_STEPS). Such a skip is the scaler finding that the
    scale it came down to is still one step too high for some batch: the run settles at the
    scale after the last of them, the lowest it held before growing, and an `init_scale` there
    would have avoided every one."""
    chain = _descent(steps)
    if not chain:
        return []
    lowest = finite(next(p for p in steps if p.step == chain[-1]).scale_after)
    later: list[int] = []
    late_skips: list[int] = []
    for p in steps:
        if p.step <= chain[-1] or lowest is None:
            continue
        if is_growth(p):
            break
        if not p.skipped:
            continue
        late_skips.append(p.step)
        after, loss = finite(p.scale_after), finite(p.loss)
        before = finite(p.scale_before)
        ranged = (before is not None and before > MODERATE_SCALE) or (
            first_kind.get(p.step) == "inf")
        if (after is not None and after < lowest and loss is not None and ranged
                and after > COLLAPSE_SCALE):
            later.append(p.step)
            lowest = after
    lo = 0
    for hi, step in enumerate(late_skips):
        while step - late_skips[lo] >= STORM_WINDOW_STEPS:
            lo += 1
        if hi - lo + 1 >= STORM_MIN_SKIPS:
            return chain  # the later skips are a storm, not the scaler settling
    return chain + later


def _descent(steps: Sequence[StepPoint]) -> list[int]:
    """Skips of the initial descent: starting within CALIBRATION_START_STEPS of the first step,
    each within CALIBRATION_GAP_STEPS of the previous, no growth in between. A descent that
    reaches COLLAPSE_SCALE without finding a scale that fits is no calibration at all (that is
    a collapse): then there is none."""
    chain: list[int] = []
    first = steps[0].step
    for p in steps:
        if is_growth(p):
            break
        if not p.skipped:
            if chain and p.step - chain[-1] > CALIBRATION_GAP_STEPS:
                break
            if not chain and p.step - first > CALIBRATION_START_STEPS:
                break
            continue
        scale = finite(p.scale_before)
        if scale is not None and scale <= COLLAPSE_SCALE:
            return []  # the descent never found a scale that fits: not calibration
        if chain and p.step - chain[-1] > CALIBRATION_GAP_STEPS:
            break
        if not chain and p.step - first > CALIBRATION_START_STEPS:
            break
        chain.append(p.step)
    return chain


def _probes(steps: Sequence[StepPoint]) -> list[int]:
    probes: list[int] = []
    last_growth = False
    for p in steps:
        if p.skipped:
            if last_growth:
                probes.append(p.step)
            last_growth = False
        elif is_growth(p):
            last_growth = True
    return probes


def culprits(nonfinite: Sequence[NonfiniteStep], steps: set[int]) -> list[tuple[int, int, int]]:
    """(layer index, times first in backward order, times non-finite) over `steps`, most
    responsible first: the layer where the overflow started most often, then the most often
    non-finite, then model order."""
    first: Counter[int] = Counter()
    anywhere: Counter[int] = Counter()
    for entry in nonfinite:
        if entry.step not in steps or not entry.layers:
            continue
        first[entry.layers[0][0]] += 1
        for index in {index for index, _ in entry.layers}:
            anywhere[index] += 1
    ranked = sorted(anywhere, key=lambda i: (-first[i], -anywhere[i], i))
    return [(i, first[i], anywhere[i]) for i in ranked]
