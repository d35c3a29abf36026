"""AMP usage errors, recorded in a step record's ``misuse`` and never raised (contract "Wire v2").

* ``step_bypassed_scaler``: ``optimizer.step()`` outside ``scaler.step`` with the scaler on:
  gradients still scaled, an overflow step not skipped.
* ``unscale_twice``: a second ``unscale_(opt)`` in a cycle; recorded, then torch's error propagates.
* ``clip_before_unscale``: gradients written while still scaled, between the last ``backward()``
  and the capture (``clip_grad_norm_`` on *scaled* gradients): each backward's end notes every
  gradient's id and ``_version``, the capture compares (host integers, no sync); a correct loop
  is captured at ``unscale_``, before its clip. Under torch.distributed (DDP writes the gradients
  at backward's end) ``ClipHeuristic`` stands in: a scaled global norm constant within ``REL``
  over ``WINDOW`` pre-``unscale_`` steps while the scale changed is a clip threshold (once per
  streak, on the sender thread).
"""

from __future__ import annotations

import math
import threading
from collections import deque

import torch

__all__ = ["ClipHeuristic", "MisuseTracker"]


class MisuseTracker:
    """This cycle's misuse list (training thread only; the step cycle reads it inline)."""

    def __init__(self) -> None:
        self.pending: list[dict[str, str]] = []
        self.unscaled: set[int] = set()  # optimizers unscaled in this cycle, by id

    def record(self, kind: str, detail: str) -> None:
        self.pending.append({"kind": kind, "detail": detail})

    def take(self) -> list[dict[str, str]] | None:
        """This cycle's misuse (None when there was none); starts the next cycle."""
        out = self.pending or None
        self.pending = []
        self.unscaled.clear()
        return out

    def note_unscale(self, optimizer: torch.optim.Optimizer, stage: str | None) -> None:
        """Before ``unscale_`` runs: a second call in the cycle is recorded (torch then raises)."""
        if id(optimizer) in self.unscaled or stage == "UNSCALED":
            self.record("unscale_twice", (
                f"scaler.unscale_() was called twice for one {type(optimizer).__name__} since "
                "the last update(); torch raises RuntimeError"))
        self.unscaled.add(id(optimizer))

    @staticmethod
    def bypass(optimizer: torch.optim.Optimizer) -> dict[str, str]:
        """The ``step_bypassed_scaler`` entry for ``optimizer``."""
        return {"kind": "step_bypassed_scaler", "detail": (
            f"{type(optimizer).__name__}.step() was called directly while the GradScaler is "
            "enabled: the gradients are still scaled and an overflow step is not skipped; call "
            "scaler.step(optimizer)")}

    @staticmethod
    def clip_before_unscale(written: int, total: int) -> dict[str, str]:
        """The ``clip_before_unscale`` entry: ``written`` of ``total`` gradients changed."""
        return {"kind": "clip_before_unscale", "detail": (
            f"{written} of {total} gradients were modified between the end of backward() and "
            "scaler.unscale_() while still scaled (clip_grad_norm_/clip_grad_value_ before "
            "unscale_?): call scaler.unscale_(optimizer) before clipping")}


class ClipHeuristic:
    """The ``clip_before_unscale`` detector; see the module docstring. Thread-safe."""

    WINDOW = 3
    REL = 1e-3

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._window: deque[tuple[float, float]] = deque(maxlen=self.WINDOW)
        self._fired = False

    def observe(self, scaled_norm: float | None, scale: float | None) -> dict[str, str] | None:
        """Feed one measured step captured before ``unscale_``; a misuse entry when it fires."""
        with self._lock:
            if (scaled_norm is None or scale is None or not math.isfinite(scaled_norm)
                    or scaled_norm <= 0.0):
                return None  # an overflow step or all-zero grads: no evidence either way
            window = self._window
            if window and abs(scaled_norm - window[-1][0]) > self.REL * max(
                    scaled_norm, window[-1][0]):
                window.clear()
                self._fired = False
            window.append((scaled_norm, scale))
            if len(window) < self.WINDOW or self._fired:
                return None
            norms = [n for n, _ in window]
            if max(norms) - min(norms) > self.REL * max(norms):
                return None
            if len({s for _, s in window}) < 2:
                return None
            self._fired = True
            return {"kind": "clip_before_unscale", "detail": (
                f"the scaled gradient norm stayed at {norms[-1]:.6g} over {self.WINDOW} steps "
                f"while the scale changed: gradients look clipped before scaler.unscale_(); "
                f"call scaler.unscale_(optimizer) before clipping")}
