"""AMP usage errors, recorded in a step record's ``misuse`` and never raised (contract "Wire v2").

* ``step_bypassed_scaler``: ``optimizer.step()`` called directly while the scaler is enabled. The
  optimizer's ``step`` is wrapped per instance (a bound method, so an ``LRScheduler`` created later
  can wrap it again; ``step.ScalerSource``), which marks the time spent inside ``scaler.step``,
  and a call outside it is the misuse: the gradients are still scaled and an overflow step is not
  skipped.
* ``unscale_twice``: a second ``scaler.unscale_(opt)`` for one optimizer within one update cycle.
  It is recorded, then torch's own ``RuntimeError`` propagates unchanged; the record carrying it
  is the cycle's (sent at the next ``update()``, if the loop survives the error).
* ``clip_before_unscale``, counted on every step it happens: the gradients were written between
  the end of the cycle's last ``backward()`` and the capture at the first ``unscale_``/``step``
  while still scaled: ``clip_grad_norm_``/``clip_grad_value_`` (or any in-place change) on
  *scaled* gradients. A tensor hook on ``scaler.scale``'s output queues a callback at the end of
  each backward pass that notes each gradient's identity and version counter
  (``Tensor._version``, bumped by every in-place write; ``step._Scale.backward_end``); the
  capture compares (``cycle.StepCycle.capture``). Both live on the step's own path, not here:
  they run on every step, and each call into another module is one more to read there. Host
  integers only: no device work, no sync. A correct loop (``unscale_`` → clip → ``step``) is
  captured at ``unscale_``, before the clip, so it never matches; loops that unscale themselves
  are captured ``after_unscale`` and not judged. Off under torch.distributed, where DDP writes
  its reduced buckets into the gradients in its own end-of-backward callback: there the
  heuristic below stands in.
* ``ClipHeuristic`` (the fallback where the version counting is off): gradients clipped while still
  scaled have a *scaled* global norm equal to the clip threshold, whatever the scale. It fires
  when, over ``WINDOW`` consecutive measured steps captured before ``unscale_`` without
  overflow, the scaled global norm (grad_norm · scale_before) stays constant within ``REL``
  while the scale is not the same on all of them: once per streak, after a scale change. The
  judgement needs host values, so it runs on the sender thread, in record order.
"""

from __future__ import annotations

import math
import threading
from collections import deque

import torch

__all__ = ["ClipHeuristic", "MisuseTracker"]


class MisuseTracker:
    """This cycle's misuse list (training thread only). The wrappers that see the misuse live
    with the step source that owns them (``step.ScalerSource``); ``pending`` and ``unscaled``
    are plain attributes the step cycle reads inline (``cycle.StepCycle.end``)."""

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
