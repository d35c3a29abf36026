"""Reading a ``GradScaler``'s state without adding host syncs.

Private attributes (``_scale``, ``_growth_tracker``, ``_per_optimizer_states`` with their
``stage`` and ``found_inf_per_device``) are read behind feature checks: when they exist, every
value stays a device tensor; without them the public fallback calls ``get_scale()`` (a sync) and
infers ``found_inf`` from a scale decrease. ``enabled=False`` scalers read as scale 1, no overflow.
No scaler at all (``None``: BF16 or FP32 training) reads as no scale: the scale and growth
tracker are absent, and ``found_inf`` is read from the captured gradients on the sender thread
(``record.StepRecord.to_wire``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["ScalerView"]


class ScalerView:
    def __init__(self, scaler: torch.amp.GradScaler | None) -> None:
        self.scaler = scaler
        self._owner: dict[int, torch.optim.Optimizer] = {}
        self._owner_of: tuple[int, ...] = ()

    @property
    def present(self) -> bool:
        """Whether there is a scaler at all (an ``enabled=False`` one is present)."""
        return self.scaler is not None

    def enabled(self) -> bool:
        return self.scaler is not None and bool(self.scaler.is_enabled())

    def scale_in_effect(self) -> torch.Tensor | float:
        """The scale as a device tensor when the scaler exposes it, else a float (a sync)."""
        scaler = self.scaler
        if scaler is None or not self.enabled():
            return 1.0
        scale = getattr(scaler, "_scale", None)
        if isinstance(scale, torch.Tensor):
            return scale
        return float(scaler.get_scale())

    def stage(self, optimizer: torch.optim.Optimizer) -> str | None:
        """The scaler's stage name for ``optimizer``, READY if untouched, None if unknowable."""
        states = getattr(self.scaler, "_per_optimizer_states", None)
        if not isinstance(states, Mapping):
            return None
        state = states.get(id(optimizer))  # .get: never grow the scaler's defaultdict
        if state is None:
            return "READY"
        return getattr(state.get("stage"), "name", None)

    def scaled_flags(
        self,
        optimizer: torch.optim.Optimizer,
        optimizers: Sequence[torch.optim.Optimizer],
        params: Sequence[torch.nn.Parameter],
    ) -> list[bool]:
        """Per watched parameter: is its ``.grad`` still multiplied by the scale?"""
        flags = self.scaled_state(optimizer, optimizers, params)
        return [flags] * len(params) if isinstance(flags, bool) else flags

    def scaled_state(
        self,
        optimizer: torch.optim.Optimizer,
        optimizers: Sequence[torch.optim.Optimizer],
        params: Sequence[torch.nn.Parameter],
    ) -> bool | list[bool]:
        """``scaled_flags`` as one bool when every parameter shares it (no per-step list)."""
        if not params:
            return []
        if not self.enabled():
            return False
        current = self.stage(optimizer)
        if current is None:  # no private state: we run before the first unscale_, so scaled
            return True
        if len(optimizers) == 1 and optimizers[0] is optimizer:
            return current == "READY"  # one optimizer: an unowned parameter takes ``current``
        key = tuple(id(o) for o in optimizers)
        if key != self._owner_of:
            self._owner = {id(p): o for o in optimizers
                           for g in o.param_groups for p in g["params"]}
            self._owner_of = key
        stages = {id(o): self.stage(o) for o in optimizers}
        if all(stage == current for stage in stages.values()):
            # Every owner (and an unowned parameter, which takes ``current``) is at one stage.
            return current == "READY"
        flags = []
        for p in params:
            owner = self._owner.get(id(p))
            stage = stages[id(owner)] if owner is not None else current
            flags.append(stage == "READY")
        return flags

    def host_skip(self) -> bool | None:
        """After the step: whether it was skipped, when the host knows it without a read of a
        device value (a ``GradScaler`` does not say; DeepSpeed's optimizer does, ``zero.py``)."""
        return None

    def before_update(self, each: bool = False) -> dict[str, Any]:
        """What must be read before ``update()``: the scale (a device copy) and ``found_inf``;
        with ``each``, every optimizer's own found_inf too (``found_inf_each``)."""
        before: dict[str, Any] = {}
        scaler = self.scaler
        if scaler is None or not self.enabled():
            return before
        scale = getattr(scaler, "_scale", None)
        if isinstance(scale, torch.Tensor):
            before["scale"] = scale.clone()  # update() writes the scaler's own in place
        else:
            before["scale_host"] = float(scaler.get_scale())
        states = getattr(scaler, "_per_optimizer_states", None)
        found: list[torch.Tensor] = []
        # Each optimizer's own found_inf (``update()`` clears the states): whether THAT one's
        # step was skipped, keyed by id (the record's ``optimizers`` block, asked for only when
        # there are several optimizers or groups: ``cycle.per_optimizer``).
        mine: dict[int, torch.Tensor] = {}
        if isinstance(states, Mapping):
            for key, state in states.items():
                if not isinstance(state, Mapping):
                    continue
                per_device = state.get("found_inf_per_device", {})
                tensors = [t for t in per_device.values() if isinstance(t, torch.Tensor)]
                found.extend(tensors)
                if not each or not tensors:
                    continue
                mine[key] = tensors[0] if len(tensors) == 1 else sum(
                    (t.to(tensors[0].device) for t in tensors), torch.zeros_like(tensors[0]))
        if len(found) > 1:  # update() adds the others into the first in place: copies
            mine = {key: t.clone() for key, t in mine.items()}
        if mine:
            before["found_inf_each"] = mine
        if len(found) == 1:  # one optimizer on one device: the common case, no op at all
            # update() reads a lone found_inf tensor without writing it (it adds in place into
            # the first one only when there are several), and the scaler only ever sets it to
            # 0 or 1: keep it as it is (the scaler's own, which needs no grad: no detach op);
            # ``after_update`` makes it a 0-d view, the record's stack promotes it to float64.
            before["found_inf"] = found[0]
        elif found:
            device = found[0].device
            before["found_inf"] = torch.stack(
                [t.detach().to(device=device, dtype=torch.float64).reshape(()) for t in found]
            ).sum().clamp(max=1.0)
        return before

    def after_update(
        self, before: Mapping[str, Any], device: torch.device, snapshot: bool = False
    ) -> tuple[list[torch.Tensor], set[str], bool]:
        """(scale_before, scale_after, growth_tracker, found_inf) as 0-d device tensors in the
        scaler's own dtypes (the record's one ``stack`` promotes them to float64), the names to
        send as null, and whether found_inf must be inferred from the scale.

        By default scale_after and growth_tracker are views of the scaler's state, good until
        the next ``update()``. ``snapshot``: the scaler is on the CPU (``device``) and the
        values are read later, on the sender thread: copies of those two and nothing else, no
        conversion, no move (each op is microseconds of the training thread there)."""
        f64 = torch.float64

        def const(x: float) -> torch.Tensor:
            return torch.full((), x, dtype=f64, device=device)

        absent: set[str] = set()
        if self.scaler is None:  # no scale to report; found_inf comes from the gradients
            nan = const(float("nan"))
            return [nan, nan, nan, nan], {"scale_before", "scale_after", "growth_tracker"}, False
        if not self.enabled():
            absent.add("growth_tracker")
            return [const(1.0), const(1.0), const(0.0), const(0.0)], absent, False
        after = getattr(self.scaler, "_scale", None)
        tracker = getattr(self.scaler, "_growth_tracker", None)
        if (snapshot and "scale" in before and "found_inf" in before
                and isinstance(after, torch.Tensor) and isinstance(tracker, torch.Tensor)):
            copies = [before["scale"], after.clone(), tracker.clone(), before["found_inf"]]
            return copies, absent, False
        if "scale" in before and isinstance(after, torch.Tensor):
            scale_before = before["scale"].to(device)
            scale_after = after.to(device=device, copy=snapshot).reshape(())
        else:
            scale_before = const(before.get("scale_host", float("nan")))
            scale_after = const(float(self.scaler.get_scale()))
        if isinstance(tracker, torch.Tensor):
            growth = tracker.to(device=device, copy=snapshot)
        else:
            growth = const(0.0)
            absent.add("growth_tracker")
        from_scale = "found_inf" not in before
        found_inf = const(0.0) if from_scale else before["found_inf"].to(device).reshape(())
        return [scale_before, scale_after, growth.reshape(()), found_inf], absent, from_scale
