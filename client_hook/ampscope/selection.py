"""Which parameters are watched, and on which steps their per-layer statistics are computed.

A parameter is watched when it requires grad, matches an ``include`` glob (none = all) and no
``exclude``; scalars are recorded every step regardless. ``layer_every``: N (every N-th step, 0 =
never) or ``{pattern: N}`` (the first match's N, else 0: end with ``"*": N``). The block covers
**all** watched layers on every step where **any** is due (N is a layer's longest interval): one
pass whatever it holds, and full-length arrays keep every value a number, as the wire requires.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["Cadence", "LayerEvery", "selected"]

LayerEvery = int | Mapping[str, int]


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def selected(name: str, include: Sequence[str] | None, exclude: Sequence[str] | None) -> bool:
    """Whether parameter ``name`` is watched under ``include``/``exclude``."""
    if include and not _matches(name, include):
        return False
    return not (exclude and _matches(name, exclude))


class Cadence:
    """Per-layer intervals resolved once from ``layer_every``; ``due(step)`` is pure arithmetic."""

    def __init__(self, layer_every: LayerEvery, names: Sequence[str]) -> None:
        if isinstance(layer_every, int):
            if layer_every < 0:
                raise ValueError(f"layer_every must be >= 0, not {layer_every}")
            self.intervals = [layer_every] * len(names)
        else:
            bad = {p: n for p, n in layer_every.items() if not isinstance(n, int) or n < 0}
            if bad:
                raise ValueError(f"layer_every intervals must be ints >= 0, got {bad}")
            self.intervals = [
                next((n for p, n in layer_every.items() if fnmatch.fnmatchcase(name, p)), 0)
                for name in names
            ]
        # The distinct intervals, public: the step cycle tests them inline (no call per step).
        self.distinct = sorted({n for n in self.intervals if n > 0})

    def due(self, step: int) -> bool:
        """Whether the per-layer block is computed on ``step`` (some interval divides it)."""
        return any(step % n == 0 for n in self.distinct)
