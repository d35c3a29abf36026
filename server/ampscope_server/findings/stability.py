"""Stable live findings: the same finding stays one finding while its numbers update in place.

A live run is analysed again every few seconds over its most recent data. A quantity close to a
detector's threshold would make the finding appear and disappear from one analysis to the next
(the issue's demo: the underflow warning present 27 of 30 samples). Two mechanisms prevent it:

- hysteresis inside the threshold detectors: once a finding is shown, every layer stays in it
  until its value is clearly below the entry threshold (UNDERFLOW_EXIT_FRAC, SWALLOWED_EXIT_FRAC);
  the layers a shown finding cites are handed back to the detectors through `Memory.holding`
  (shown at all, and which layer to keep naming first);
- a hold here: a finding the detectors stop raising stays shown, marked `held_since` (the last
  step it was raised), until HOLD_STEPS steps have passed without it.

A finding's identity is `Finding.identity` (kind + subject); its title, evidence, layers and
severity are those of the latest analysis that raised it. Pure: `track` returns a new Memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ampscope_server.findings.facts import Finding
from ampscope_server.findings.thresholds import HOLD_STEPS


@dataclass(frozen=True)
class Memory:
    """What the previous live analyses of one run left behind."""

    step: int | None = None
    """The newest step analysed."""
    shown: Mapping[str, Finding] = field(default_factory=dict)
    """{identity: the finding as shown (raised now, or held with `held_since`)}."""
    last_raised: Mapping[str, int] = field(default_factory=dict)
    """{identity: the newest step at which the detectors raised it}."""

    def holding(self) -> dict[str, tuple[str, ...]]:
        """{kind: the layers its shown finding cites, most responsible first}: the detectors'
        hysteresis input (and the order they keep when values are close)."""
        out: dict[str, tuple[str, ...]] = {}
        for finding in self.shown.values():
            known = out.get(finding.kind, ())
            out[finding.kind] = known + tuple(n for n in finding.layers if n not in known)
        return out

    def findings(self) -> list[Finding]:
        return list(self.shown.values())


def track(memory: Memory | None, raised: Sequence[Finding], step: int) -> Memory:
    """The memory after an analysis at `step` raised `raised`: those replace their previous
    versions in place; a finding not raised stays, held, while `step` is within HOLD_STEPS of
    the last step it was raised; older ones go."""
    previous = memory or Memory()
    step = max(step, previous.step) if previous.step is not None else step
    shown: dict[str, Finding] = {}
    last: dict[str, int] = {}
    for finding in raised:
        identity = finding.identity
        shown[identity] = dataclasses.replace(finding, held_since=None)
        last[identity] = step
    for identity, old in previous.shown.items():
        if identity in shown:
            continue
        seen = previous.last_raised.get(identity, step)
        if step - seen < HOLD_STEPS:
            shown[identity] = dataclasses.replace(old, held_since=seen)
            last[identity] = seen
    return Memory(step=step, shown=shown, last_raised=last)
