"""AMP usage errors, recorded in a step record's ``misuse`` and never raised (contract "Wire v2").

* ``step_bypassed_scaler``: ``optimizer.step()`` called directly while the scaler is enabled. The
  optimizer's ``step`` is wrapped per instance (a bound method, so an ``LRScheduler`` created later
  can wrap it again); the monitor marks the time spent inside ``scaler.step``, and a call outside
  it is the misuse: the gradients are still scaled and an overflow step is not skipped.
* ``unscale_twice``: a second ``scaler.unscale_(opt)`` for one optimizer within one update cycle.
  It is recorded, then torch's own ``RuntimeError`` propagates unchanged; the record carrying it
  is the cycle's (sent at the next ``update()``, if the loop survives the error).
* ``clip_before_unscale`` (a heuristic, ``ClipHeuristic``): gradients clipped while still scaled
  have a *scaled* global norm equal to the clip threshold, whatever the scale. It fires when, over
  ``WINDOW`` consecutive measured steps captured before ``unscale_`` without overflow, the scaled
  global norm (grad_norm · scale_before) stays constant within ``REL`` while the scale is not the
  same on all of them. Natural gradient norms never repeat that closely, and a correct loop
  (``unscale_`` → clip → ``step``) is captured at ``unscale_``, before the clip, so it cannot
  match; loops that unscale themselves are captured ``after_unscale`` and not judged. The price:
  detection waits for a scale change (growth every ``growth_interval`` steps, or a backoff).
  It fires once per streak. The judgement needs host values, so it runs on the sender thread,
  in record order.
"""

from __future__ import annotations

import math
import threading
import types
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ClipHeuristic", "MisuseTracker"]


class MisuseTracker:
    """Per-cycle misuse list plus the optimizer ``step`` wrappers (training thread only)."""

    def __init__(self, active: Callable[[], bool]) -> None:
        self._active = active
        self.in_scaler_step = False
        # Set when the optimizer's own step ran inside ``scaler.step``: torch's GradScaler calls
        # it only when found_inf was 0 (it read found_inf with ``.item()`` to decide), so this is
        # a host-side "not skipped" at no cost (``Monitor.recheck``).
        self.scaler_stepped = False
        self._pending: list[dict[str, str]] = []
        self._unscaled: set[int] = set()
        self._wrapped: dict[int, tuple[torch.optim.Optimizer, Any, bool, Any]] = {}

    def record(self, kind: str, detail: str) -> None:
        self._pending.append({"kind": kind, "detail": detail})

    def take(self) -> list[dict[str, str]] | None:
        """This cycle's misuse (None when there was none); starts the next cycle."""
        out = self._pending or None
        self._pending = []
        self._unscaled.clear()
        return out

    def note_unscale(self, optimizer: torch.optim.Optimizer, stage: str | None) -> None:
        """Before ``unscale_`` runs: a second call in the cycle is recorded (torch then raises)."""
        if id(optimizer) in self._unscaled or stage == "UNSCALED":
            self.record("unscale_twice", (
                f"scaler.unscale_() was called twice for one {type(optimizer).__name__} since "
                "the last update(); torch raises RuntimeError"))
        self._unscaled.add(id(optimizer))

    def watch(self, optimizer: torch.optim.Optimizer, scaler_enabled: Callable[[], bool]) -> None:
        """Wrap ``optimizer.step`` (per instance, once) to see calls that bypass ``scaler.step``."""
        if id(optimizer) in self._wrapped:
            return
        original = optimizer.step  # bound: chains an earlier instance wrapper too
        had_own = "step" in vars(optimizer)
        previous = vars(optimizer).get("step")
        name = type(optimizer).__name__

        def step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            if self.in_scaler_step:
                self.scaler_stepped = True
            elif self._active():
                try:
                    if scaler_enabled():
                        self.record("step_bypassed_scaler", (
                            f"{name}.step() was called directly while the GradScaler is "
                            "enabled: the gradients are still scaled and an overflow step is not "
                            "skipped; call scaler.step(optimizer)"))
                except Exception:  # never reach training
                    pass
            return original(*args, **kwargs)

        bound = types.MethodType(step, optimizer)
        optimizer.step = bound  # type: ignore[method-assign]
        self._wrapped[id(optimizer)] = (optimizer, bound, had_own, previous)

    def unwatch_all(self) -> None:
        """Restore every ``step`` still ours; one wrapped over by someone else stays, inert."""
        for optimizer, bound, had_own, previous in self._wrapped.values():
            if vars(optimizer).get("step") is not bound:
                continue
            if had_own:
                optimizer.step = previous  # type: ignore[method-assign]
            else:
                del optimizer.step
        self._wrapped.clear()


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
