"""AMP usage errors, recorded in a step record's ``misuse`` and never raised (contract "Wire v2").

* ``step_bypassed_scaler``: ``optimizer.step()`` called directly while the scaler is enabled. The
  optimizer's ``step`` is wrapped per instance (a bound method, so an ``LRScheduler`` created later
  can wrap it again; ``step.ScalerSource``), which marks the time spent inside ``scaler.step``,
  and a call outside it is the misuse: the gradients are still scaled and an overflow step is not
  skipped.
* ``unscale_twice``: a second ``scaler.unscale_(opt)`` for one optimizer within one update cycle.
  It is recorded, then torch's own ``RuntimeError`` propagates unchanged; the record carrying it
  is the cycle's (sent at the next ``update()``, if the loop survives the error).
* ``clip_before_unscale``, counted on every step it happens (``GradWrites``): the gradients were
  written between the end of the cycle's last ``backward()`` and the capture at the first
  ``unscale_``/``step`` while still scaled: ``clip_grad_norm_``/``clip_grad_value_`` (or any
  in-place change) on *scaled* gradients. A tensor hook on ``scaler.scale``'s output queues a
  callback at the end of each backward pass that notes each gradient's identity and version
  counter (``Tensor._version``, bumped by every in-place write); the capture compares. Host
  integers only: no device work, no sync. A correct loop (``unscale_`` → clip → ``step``) is
  captured at ``unscale_``, before the clip, so it never matches; loops that unscale themselves
  are captured ``after_unscale`` and not judged. Off under torch.distributed, where DDP writes
  its reduced buckets into the gradients in its own end-of-backward callback: there the
  heuristic below stands in.
* ``ClipHeuristic`` (the fallback where ``GradWrites`` is off): gradients clipped while still
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
from collections.abc import Callable, Sequence

import torch

__all__ = ["ClipHeuristic", "GradWrites", "MisuseTracker"]


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


class GradWrites:
    """``clip_before_unscale`` on every step it happens; see the module docstring. Training
    thread only (the autograd engine runs the end-of-backward callback there on the CPU, and
    on the thread that called ``backward`` on a GPU). Never raises into training: a failure
    goes to ``on_error`` and the step is not judged."""

    def __init__(self, params: Sequence[torch.nn.Parameter],
                 on_error: Callable[[str, Exception], None]) -> None:
        self._params = params
        self._on_error = on_error
        self._after_backward: list[tuple[int, int]] | None = None

    def started(self, grad: torch.Tensor) -> None:
        """The tensor hook on ``scaler.scale``'s output: backward has reached the loss."""
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._ended)
        except Exception as exc:
            self._on_error("backward", exc)

    def _ended(self) -> None:
        try:
            seen: list[tuple[int, int]] = []
            for p in self._params:  # a loop, not a comprehension: no Python call per backward
                g = p.grad
                seen.append((0, -1) if g is None else (id(g), g._version))
            self._after_backward = seen
        except Exception as exc:
            self._after_backward = None
            self._on_error("backward", exc)

    def written(self) -> int:
        """Gradients written (in place, or replaced) since the end of the last backward pass,
        0 when none was seen; forgets that pass."""
        seen, self._after_backward = self._after_backward, None
        if seen is None:
            return 0
        count = 0
        for p, (ident, version) in zip(self._params, seen, strict=True):
            g = p.grad
            if g is not None and (id(g) != ident or g._version != version):
                count += 1
        return count

    @staticmethod
    def entry(written: int, total: int) -> dict[str, str]:
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
