"""One update cycle on the training thread: what it reads from the scaler and the gradients, and
the step record it becomes.

The step sources (``step.py``) drive one ``StepCycle``: ``on_scale``, ``capture`` (the one read,
once per cycle), ``end`` (the record). It holds device tensors and never reads one; the sender
thread does the arithmetic. On a GPU they are stacked and copied to the host once; on the CPU
(no copy to save) handed over as they are, up to ``DEFER_MAX`` queued records. The plain path is
written inline (each Python call is training-thread time; ``tests/client_hook/test_step.py``
counts them). ``ScalerView`` reads the scaler's private state behind feature checks, keeping
values on the device; without it ``get_scale()`` syncs and ``found_inf`` is inferred from a
scale decrease; no scaler: no scale, ``found_inf`` from the gradients.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from ampscope.activations import ActivationProbe
from ampscope.capture import Kind, Taken, take
from ampscope.collective import Group, Pending, local
from ampscope.devices import to_device
from ampscope.format_probe import FormatsProbe
from ampscope.histogram import NUM_BINS
from ampscope.misuse import ClipHeuristic, MisuseTracker
from ampscope.order import BackwardOrder
from ampscope.recheck import RecheckFn, run_recheck
from ampscope.record import (
    FormatsSection,
    OptimizerSlots,
    Parts,
    Sections,
    StepRecord,
    one_copy,
    optimizer_slots,
)
from ampscope.reductions import GradStats
from ampscope.selection import Cadence
from ampscope.shadow import Shadow, run_shadow, snapshot
from ampscope.shards import Layout, pack
from ampscope.swallowed import SwallowProbe

__all__ = ["DEFER_MAX", "HookState", "ScalerView", "StepCycle", "unwrap_optimizer"]

# Queued records above which a CPU step's values are stacked on the training thread again
# (``StepCycle.end``): 256 unstacked records are ~8 MiB.
DEFER_MAX = 256

_GRAD = operator.attrgetter("grad")


class HookState(enum.Enum):
    ACTIVE = "active"
    DISABLED = "disabled"  # enabled=False, repeated internal errors, or a forked child
    CLOSED = "closed"


class Outlet(Protocol):
    """Where records go: ``put`` never blocks and returns the backlog (``DEFER_MAX``)."""

    def put(self, item: Any) -> int: ...


def _raise(where: str, exc: Exception) -> None:
    raise exc


def unwrap_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside a framework's wrapper (accelerate's ``.optimizer``)."""
    seen = 0
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer) and seen < 8:
        optimizer, seen = optimizer.optimizer, seen + 1  # type: ignore[attr-defined]
    return optimizer


class ScalerView:
    """The scaler as the step cycle reads it, in plain attributes (a property is a Python call
    per step): ``present`` (even disabled), ``on`` (it scales), ``skips_on_host``
    (``host_skip`` knows the skip: DeepSpeed's, not a GradScaler's)."""

    def __init__(self, scaler: torch.amp.GradScaler | None) -> None:
        self.scaler = scaler
        self.present = scaler is not None
        self.on = scaler is not None and bool(scaler.is_enabled())
        self.skips_on_host = False
        self._owner: dict[int, torch.optim.Optimizer] = {}
        self._owner_of: tuple[int, ...] = ()

    def enabled(self) -> bool:
        return self.on

    def capture_state(
        self,
        optimizer: torch.optim.Optimizer,
        optimizers: Sequence[torch.optim.Optimizer],
        params: Sequence[torch.nn.Parameter],
    ) -> tuple[bool | list[bool], torch.Tensor | float]:
        """(``scaled_state``, ``scale_in_effect``); a GradScaler's common case is read inline
        by ``StepCycle.capture``."""
        return self.scaled_state(optimizer, optimizers, params), self.scale_in_effect()

    def scale_in_effect(self) -> torch.Tensor | float:
        """The scale as a device tensor when the scaler exposes it, else a float (a sync)."""
        scaler = self.scaler
        if scaler is None or not self.on:
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

    def scaled_state(
        self,
        optimizer: torch.optim.Optimizer,
        optimizers: Sequence[torch.optim.Optimizer],
        params: Sequence[torch.nn.Parameter],
    ) -> bool | list[bool]:
        """Per watched parameter, whether its ``.grad`` is still scaled (one bool when shared)."""
        if not params:
            return []
        if not self.on:
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
        """After the step: whether it was skipped, if the host knows (DeepSpeed), else None."""
        return None

    def before_update(
        self, each: bool | Sequence[torch.optim.Optimizer] = False
    ) -> dict[str, Any]:
        """What must be read before ``update()`` rewrites it: the scale (a device copy),
        ``found_inf`` and, with several optimizers or groups (``each``), each one's own."""
        before: dict[str, Any] = {}
        scaler = self.scaler
        if scaler is None or not self.on:
            return before
        if not isinstance(each, bool):
            several = len(each) > 1
            for opt in each:
                several = several or len(opt.param_groups) > 1
            each = several
        scale = getattr(scaler, "_scale", None)
        if isinstance(scale, torch.Tensor):
            before["scale"] = scale.clone()  # update() writes the scaler's own in place
        else:
            before["scale_host"] = float(scaler.get_scale())
        states = getattr(scaler, "_per_optimizer_states", None)
        found: list[torch.Tensor] = []
        # Each optimizer's own found_inf (``update()`` clears the states): whether THAT one's
        # step was skipped, keyed by id (the record's ``optimizers`` block, asked for only when
        # there are several optimizers or groups, ``StepCycle.build``).
        mine: dict[int, torch.Tensor] = {}
        if isinstance(states, Mapping):
            for key, state in states.items():
                if not isinstance(state, Mapping):
                    continue
                per_device = state.get("found_inf_per_device", {})
                # A loop, not a comprehension: one Python call fewer on every step (3.11).
                tensors: list[torch.Tensor] = []
                for t in per_device.values():
                    if isinstance(t, torch.Tensor):
                        tensors.append(t)
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
        """(scale_before, scale_after, growth_tracker, found_inf) as 0-d device tensors, the
        names sent as null, and whether found_inf comes from the scale. The after values are
        views of the scaler's state until the next ``update()`` (``snapshot``: copies)."""
        f64 = torch.float64

        def const(x: float) -> torch.Tensor:
            return torch.full((), x, dtype=f64, device=device)

        absent: set[str] = set()
        if self.scaler is None:  # no scale to report; found_inf comes from the gradients
            nan = const(float("nan"))
            return [nan, nan, nan, nan], {"scale_before", "scale_after", "growth_tracker"}, False
        if not self.on:
            absent.add("growth_tracker")
            return [const(1.0), const(1.0), const(0.0), const(0.0)], absent, False
        after = getattr(self.scaler, "_scale", None)
        tracker = getattr(self.scaler, "_growth_tracker", None)
        if (snapshot and "scale" in before and "found_inf" in before
                and isinstance(after, torch.Tensor) and isinstance(tracker, torch.Tensor)):
            # Both copies in one dispatch (x + 0 is x: an int32 tracker and a finite scale).
            scale_after, growth = torch._foreach_add([after, tracker], 0)
            return [before["scale"], scale_after, growth, before["found_inf"]], absent, False
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


class StepCycle:
    """One update cycle at a time; ``build`` is ``end``'s record (tests call it alone)."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        stats: GradStats,
        cadence: Cadence,
        histogram_every: int,
        view: ScalerView,
        probe: ActivationProbe | None,
        order: BackwardOrder | None,
        numels: Sequence[int] | None = None,
        grads: Callable[[Sequence[torch.nn.Parameter]], list[torch.Tensor | None]] | None = None,
        *,
        group: Group | None = None,
        sharded: bool = False,
        sends: bool = True,
        pieces_only: bool = False,
        grads_off: bool = False,
        optimizers: list[torch.optim.Optimizer] | None = None,
        activation_every: int = 0,
        on_error: Callable[[str, Exception], None] = _raise,
    ) -> None:
        self.params = params
        # Where the gradients are read from: ``.grad`` (a DTensor's local shard), or a framework
        # that keeps them elsewhere (DeepSpeed ZeRO's partitions, ``zero.ZeroEngine.reader``).
        self._grads = grads
        # The layers' sizes for ``partials.finalize`` on the sender thread: one tensor, shared.
        # ``numels``: the layers' own where a parameter is only this rank's piece (FSDP1).
        self._numel_t = torch.tensor(
            list(numels) if numels is not None else [p.numel() for p in params],
            dtype=torch.float64)
        self.stats = stats
        # Whether GradScaler's unscale reads the plain step's norms in its own pass
        # (``step._UnscaleGrads``, set by ``ScalerSource``): the capture leaves them ``due``.
        self.unscale_reads = False
        self._cadence = cadence
        self._histogram_every = histogram_every
        self._view = view
        self.probe = probe
        self.order = order
        # Under torch.distributed (``collective.py``): the hook's group, whether the gradients
        # are this rank's shards (FSDP, ZeRO), and whether this rank sends (rank 0) or only
        # contributes. ``pieces_only``: FSDP1's flat parameters, ZeRO-3 offloaded: read for the
        # share's finiteness only, never sent as the layers' statistics. ``grads_off``: nothing
        # is read (``topology.py``).
        self.group = group
        self.sharded = sharded
        self.sends = sends
        self.pieces_only = pieces_only
        self.grads_off = grads_off
        # What the monitor wires in (``Monitor.__init__``): the watched optimizers (a capture
        # through one not yet seen adds it), the sampling cadence, the hook's state, the
        # records' outlet and what rides on a step: misuse (gradient writes before unscale_, or
        # the clip heuristic where those are not tracked), re-check, swallowed.
        self.optimizers: list[torch.optim.Optimizer] = optimizers if optimizers is not None else []
        self.activation_every = activation_every
        # The formats probe (``format_probe.py``), armed every ``formats_every`` steps.
        self.formats: FormatsProbe | None = None
        self.formats_every = 0
        self.on_error = on_error
        self.state = HookState.ACTIVE
        self.outlet: Outlet | None = None
        self.misuse = MisuseTracker()
        # clip_before_unscale counted exactly (misuse.py): each gradient's (id, version) as the
        # last backward pass left it (``step._Scale.backward_end``), compared at the capture.
        self.count_writes = False
        self.after_backward: list[tuple[int, int]] | None = None
        self.clip: ClipHeuristic | None = ClipHeuristic()
        self.recheck_fn: RecheckFn | None = None
        self.recheck_low: torch.dtype | None = None  # the training's format: the origin's re-run
        # The sampled FP32 shadow step (``shadow.py``): every ``shadow_every``-th applied step
        # (0: off); ``taken_steps`` counts the applied steps while it is on.
        self.shadow_every = 0
        self.taken_steps = 0
        self.swallow: SwallowProbe | None = None
        self.model: torch.nn.Module | None = None
        self.step = 0  # updates so far: the record's step
        self.seq = 0
        self.backlog = 0  # the outlet's queue after the last put
        self.stepped: set[int] = set()  # optimizers that stepped this cycle (no scaler)
        self._last_update: float | None = None
        self._nan: torch.Tensor | None = None
        self._lr_cache: tuple[tuple[float, torch.device], torch.Tensor] | None = None
        self.reset()

    def reset(self) -> None:
        self.captured = False
        # The capture's raw device tensors (``capture.take``).
        self._parts: list[torch.Tensor] | None = None
        self._taken: Taken | None = None
        self._has_block = False
        self._acts: torch.Tensor | None = None
        self._formats: torch.Tensor | None = None
        self.loss_sum: torch.Tensor | None = None
        # Host-side knowledge of the skip (``Monitor.recheck``): set after each ``scaler.step``.
        self.skipped = False
        self.skip_unknown = False
        self.recheck: torch.Tensor | str | None = None  # the result block, or the error
        self.recheck_names: tuple[str, ...] = ()  # the hooked calls the block's origin indexes
        self.swallowed: torch.Tensor | None = None
        self.counted = False  # this cycle's step was counted as applied (``taken``)
        self.shadow_amp: list[torch.Tensor | None] | None = None  # the capture's copy, if due
        self.shadow: Shadow | None = None  # the shadow step's block and absent layers, or error
        # This cycle's cross-rank reductions: issued (or an empty share, ``contribute_nothing``)
        # at most once, and what they will reduce into.
        self.contributed = False
        self.pending: Pending | None = None
        # The plain step's norms tensor and gradients, left to the unscale (``unscale_reads``).
        self.due: tuple[torch.Tensor, list[torch.Tensor | None]] | None = None

    @property
    def has_block(self) -> bool:
        """Whether this cycle's capture took the per-layer statistics block."""
        return self._has_block

    def start(self, step: int, activation_every: int) -> None:
        """After ``update()``: stop learning the backward order, arm a sampled step's probe."""
        if self.order is not None and self.order.learning:
            self.order.end_cycle()
        if self.probe is not None and activation_every and step % activation_every == 0:
            self.probe.arm()

    def on_scale(self, outputs: Any) -> None:
        """A loss of this cycle (``step._Scale`` does the same inline)."""
        if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
            # A copy even of a float64 loss: on the CPU the record reads it later (``build``).
            # Any shape of one element; ``build`` makes it 0-d where it stacks on the device.
            loss = outputs.detach().to(torch.float64, copy=True)
            self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss

    def _reads(self, step: int) -> tuple[bool, bool]:
        """(per-layer statistics, histogram) read at ``step``'s capture; a DDP peer (the same
        gradients as rank 0, sends nothing) reads only its share's norms."""
        per_layer = self._cadence.due(step)
        histogram = bool(self._histogram_every and self.params
                         and step % self._histogram_every == 0)
        if self.pieces_only or (self.group is not None and not self.sends
                                and not self.sharded):
            return False, False
        return per_layer, histogram

    def layout(self, step: int) -> Layout | None:
        """This step's share of the reductions (None outside a group): the same on every rank."""
        if self.group is None:
            return None
        per_layer, histogram = self._reads(step)
        return Layout(len(self.params), self.group.world_size, self.sharded,
                      stats=per_layer or histogram, histogram_bins=NUM_BINS if histogram else 0)

    def capture(
        self, optimizer: torch.optim.Optimizer,
        optimizers: Sequence[torch.optim.Optimizer] | None = None, step: int | None = None,
    ) -> None:
        """The gradients are final: the whole capture, once per cycle (a failure counts): one
        read (``capture.take``), this rank's share of the reductions (issued, never waited for)
        and the armed probe's block. Exceptions go to ``on_error``, never to training."""
        self.captured = True
        try:
            if optimizers is None:
                optimizers = self.optimizers
                if optimizer not in optimizers:  # the watched ones are unwrapped already
                    optimizer = unwrap_optimizer(optimizer)
                    if optimizer not in optimizers:
                        self.optimizers.append(optimizer)
            if step is None:
                step = self.step
            if not self.grads_off:
                params = self.params
                if self._grads is not None:
                    grads = self._grads(params)
                else:
                    grads = list(map(_GRAD, params))
                    if self.sharded:  # each rank reads its own shard; the reductions merge
                        grads = list(map(local, grads))
                # A GradScaler's stage and scale (``ScalerView.capture_state``), inline.
                view = self._view
                scale = getattr(view.scaler, "_scale", None)
                states = getattr(view.scaler, "_per_optimizer_states", None)
                if (view.on and params and isinstance(scale, torch.Tensor)
                        and isinstance(states, Mapping) and len(optimizers) == 1
                        and optimizers[0] is optimizer):
                    state = states.get(id(optimizer))  # .get: never grow the scaler's defaultdict
                    scaled = state is None or getattr(state.get("stage"), "name", None) == "READY"
                else:
                    scaled, scale = view.capture_state(optimizer, optimizers, params)
                if self.shadow_every and (self.taken_steps + 1) % self.shadow_every == 0:
                    self._snapshot(optimizer, optimizers, grads, scaled, scale)
                seen, self.after_backward = self.after_backward, None
                if seen is not None and (scaled if isinstance(scaled, bool) else all(scaled)):
                    written = 0  # gradients written (in place, or replaced) since backward
                    for p, (ident, version) in zip(params, seen, strict=True):
                        g = p.grad
                        if g is not None and (id(g) != ident or g._version != version):
                            written += 1
                    if written:
                        self.misuse.pending.append(
                            MisuseTracker.clip_before_unscale(written, len(params)))
                per_layer = False
                for n in self._cadence.distinct:
                    if step % n == 0:
                        per_layer = True
                        break
                histogram = bool(self._histogram_every and params
                                 and step % self._histogram_every == 0)
                if self.pieces_only or (self.group is not None and not self.sends
                                        and not self.sharded):
                    per_layer = histogram = False
                self._has_block = per_layer and self.sends
                stats = self.stats
                # Sharded norms are summed across ranks as squares: the float64 read.
                checked = stats.exact_norms and not self.sharded
                if per_layer or histogram or checked:
                    parts, taken = take(stats, grads, scale, scaled, per_layer=per_layer,
                                        histogram=histogram, checked=checked)
                else:  # the plain step: the norms, read as ``take`` would (inline: no call)
                    n = len(grads)
                    native = stats.native
                    if self.unscale_reads and scaled is True and native and native.unscale:
                        # GradScaler's unscale reads and writes every gradient next: its pass
                        # reads the norms too (``step._UnscaleGrads``), in float64.
                        norms = torch.empty(n, dtype=torch.float64)
                        self.due = (norms, grads)
                        float32 = False
                    else:
                        norms = stats.raw_norms(grads)
                        float32 = stats.float32_norms
                    flags = (scaled,) * n if isinstance(scaled, bool) else tuple(scaled)
                    device = norms.device if n else (
                        scale.device if isinstance(scale, torch.Tensor)
                        else torch.device("cpu"))
                    parts = [norms]
                    taken = Taken(Kind.NORMS, device, flags, float32_norms=float32)
                if self.group is not None:
                    layout = self.layout(step)
                    assert layout is not None
                    kept, sums, maxes = pack(parts, layout, self.group.rank, self.loss_sum)
                    # Before issuing: a failure must not make it issue twice.
                    self.contributed = True
                    self.pending = self.group.reduce(sums, maxes)
                    parts = [*kept, sums] if maxes is None else [*kept, sums, maxes]
                    taken = dataclasses.replace(taken, layout=layout)
                self._parts, self._taken = parts, taken
                if self.probe is not None and self.probe.armed:
                    self._acts = self.probe.collect(scale, taken.device)
                if self.formats is not None and self.formats.armed:
                    self._formats = self.formats.collect(scale, taken.device)
        except Exception as exc:
            self.on_error("capture", exc)
        if self.group is not None and not self.contributed:
            self.contribute_nothing()  # the capture did not get as far as its share

    def settle(self) -> None:
        """The due norms read now, as the gradients are, where no unscale read them
        (``step._UnscaleGrads``); if that fails, the record goes without them."""
        due, self.due = self.due, None
        if due is None:
            return
        try:
            self.stats.raw_norms(due[1], acc64=True, out=due[0])
        except Exception as exc:
            self._parts = self._taken = None
            self.on_error("capture", exc)

    def _snapshot(
        self, optimizer: torch.optim.Optimizer, optimizers: Sequence[torch.optim.Optimizer],
        grads: Sequence[torch.Tensor | None], scaled: bool | list[bool],
        scale: torch.Tensor | float,
    ) -> None:
        """Keep the gradients in true units if this may be the shadow step; not without a
        closure, nor for an optimizer applying ``found_inf`` itself (skip unknown on the host)."""
        if self.recheck_fn is None or self.model is None or (
                self._view.on and getattr(optimizer, "_step_supports_amp_scaling", False)):
            return
        self.shadow_amp = snapshot(grads, self.params, scaled, scale, optimizers, self._view.on)

    def taken(self) -> None:
        """The step is being applied and no weight has changed yet (``step.py``): counted once
        per cycle; every ``shadow_every``-th runs the FP32 shadow step here. Never raises."""
        if self.counted or self.skipped or self.state is not HookState.ACTIVE:
            return
        self.counted = True
        self.taken_steps += 1
        amp, self.shadow_amp = self.shadow_amp, None
        fn, model = self.recheck_fn, self.model
        if amp is None or fn is None or model is None or self.taken_steps % self.shadow_every:
            return
        try:
            self.shadow = run_shadow(fn, model, self.params, amp)
        except Exception as exc:
            self.on_error("shadow", exc)

    def contribute_nothing(self) -> None:
        """Issue this cycle's reductions with an empty share unless it issued its own."""
        group = self.group
        if group is None or self.contributed or self.state is HookState.CLOSED:
            return
        self.contributed = True
        try:
            layout = self.layout(self.step)
            assert layout is not None
            device = self.params[0].device if self.params else torch.device("cpu")
            group.contribute_nothing(layout.sum_size, layout.max_size, device)
        except Exception as exc:
            self.on_error("share", exc)

    def end(self, before: Mapping[str, Any] | None) -> None:
        """The cycle's record (none when ``before`` is None), then the next cycle; never raises."""
        if self.due is not None:  # no unscale came between the capture and ``update()``
            self.settle()
        state = self.state
        due = before is not None and state is HookState.ACTIVE
        if due and not self.sends:  # a contributing rank: its share is all it makes
            if self.pending is not None and self.group is not None:
                self.group.retain(self.pending)
        elif due and before is not None:
            try:
                if self.recheck_fn is not None and self.model is not None and (
                        self._overflowed(before)):
                    result = run_recheck(self.recheck_fn, self.model, self.params,
                                         self.recheck_low)
                    self.recheck, self.recheck_names = (
                        (result, ()) if isinstance(result, str) else result)
                if self.swallow is not None and self._has_block:
                    self.swallowed = self.swallow.block()
                misuse = self.misuse
                found = misuse.take() if misuse.pending else None
                misuse.unscaled.clear()
                # A CPU record left unstacked holds ~60 small tensors (~30 KiB) where a stacked
                # one holds 1 KiB: only while the sender keeps up, so a stalled server cannot
                # make the bounded queue cost 4096 x 30 KiB (DESIGN.md §8: <= 32 MiB with the
                # server down).
                record = self.build(before, seq=self.seq, step=self.step, misuse=found,
                                    clip=self.clip, defer=self.backlog < DEFER_MAX,
                                    optimizers=self.optimizers, stepped=self.stepped)
                self.seq += 1
                assert self.outlet is not None
                self.backlog = self.outlet.put(record)
            except Exception as exc:
                self.on_error("update", exc)
        if state is HookState.CLOSED:
            return
        self.step += 1
        self.reset()
        self.stepped.clear()
        if self.swallow is not None:
            self.swallow.reset()
        if state is not HookState.ACTIVE:
            return
        try:  # ``start``, inline
            order, probe, every = self.order, self.probe, self.activation_every
            if order is not None and order.learning:
                order.end_cycle()
            if probe is not None and every and self.step % every == 0:
                probe.arm()
            formats, every = self.formats, self.formats_every
            if formats is not None and every and self.step % every == 0:
                formats.arm()
        except Exception as exc:
            self.on_error("update", exc)

    def _overflowed(self, before: Mapping[str, Any]) -> bool:
        """Whether this cycle's step was skipped, known on the host without a device sync."""
        if self.skipped:
            return True
        found = before.get("found_inf")
        if self.skip_unknown and isinstance(found, torch.Tensor) and found.device.type == "cpu":
            return bool(found.item())  # a CPU tensor: no device to wait for
        return False

    def build(
        self,
        before: Mapping[str, Any],
        *,
        seq: int,
        step: int,
        lr: Callable[[torch.device], torch.Tensor | None] | None = None,
        misuse: list[dict[str, str]] | None,
        clip: ClipHeuristic | None,
        defer: bool = True,
        optimizers: Sequence[torch.optim.Optimizer] = (),
        stepped: frozenset[int] | set[int] = frozenset(),
    ) -> StepRecord:
        """The cycle's record after ``update()``: scalars and blocks as one list, stacked and
        copied once on a GPU, handed over on the CPU (``defer``; False stacks). ``lr``: the
        record's lr on ``device`` (default: the first optimizer's first group's)."""
        now = time.perf_counter()
        duration = None if self._last_update is None else now - self._last_update
        self._last_update = now
        view, taken = self._view, self._taken
        if "scale" in before:
            device = torch.device(before["scale"].device)
        elif taken is not None:
            device = taken.device
        else:
            device = torch.device("cpu")
        # A pending reduction is read by the sender thread once it finished: never stacked here.
        host = (defer or self.pending is not None) and device.type == "cpu"
        if self._nan is None or self._nan.device != device:
            self._nan = torch.full((), float("nan"), dtype=torch.float64, device=device)
        nan = self._nan  # only ever stacked (copied), never written
        (scale_before, scale_after, growth, found_inf), absent, from_scale = (
            view.after_update(before, device, snapshot=host))
        loss = nan
        if self.loss_sum is None:
            absent.add("loss")
        else:
            loss = self.loss_sum
        if taken is None:
            absent.add("grad_norm")
        if lr is not None:
            rate = lr(device)
        else:  # the cached float lr inline; a tensor lr or a new value through ``_lr``
            groups = optimizers[0].param_groups if optimizers else None
            value = groups[0].get("lr") if groups else None
            cache = self._lr_cache
            if (cache is not None and value is not None and not isinstance(value, torch.Tensor)
                    and cache[0] == (value, device)):
                rate = cache[1]
            else:
                rate = self._lr(device, optimizers)
        if rate is None:
            rate = nan
            absent.add("lr")
        # grad_norm's slot stays NaN: the sender thread computes it (``capture.finish``).
        scalars = [scale_before, scale_after, growth, found_inf, loss, nan, rate]
        parts: Parts = [scalars]
        if self._parts:
            parts += self._parts
        if self._acts is not None:
            parts.append(self._acts)
        if self.swallowed is not None:
            parts.append(self.swallowed)
        recheck_block = self.recheck if isinstance(self.recheck, torch.Tensor) else None
        if recheck_block is not None:
            parts.append(recheck_block)
        shadow = self.shadow
        shadow_block = shadow[0] if isinstance(shadow, tuple) else None
        if shadow_block is not None:
            parts.append(shadow_block)
        probe = self.formats
        formats = None
        if self._formats is not None and probe is not None:
            parts.append(self._formats.reshape(-1))
            formats = FormatsSection(tuple(r.name for r in probe.recipes), tuple(probe.layers),
                                     tuple(probe.trained) if probe.keeps_trained else None)
        several = len(optimizers) > 1
        for opt in optimizers:
            several = several or len(opt.param_groups) > 1
        slots: tuple[OptimizerSlots, ...] | None = None
        opt_values: list[torch.Tensor] = []
        if several:
            slots, opt_values = optimizer_slots(view, before, optimizers, stepped, device)
            if opt_values:
                parts.append(opt_values)
        pending = self.pending
        if pending is not None and not host:  # CUDA: the copy queued behind the reduction
            pending.wait_stream()
            pending = None
        values, ready = (parts, None) if host else one_copy(parts, device)
        order = self.order
        if order is not None and order.learning:
            order.end_cycle()
        captured = None
        if taken is not None:
            captured = ("before_unscale" if self.params and all(taken.scaled)
                        else "after_unscale")
        return StepRecord(
            seq=seq,
            step=step,
            wall_time=time.time(),
            duration=duration,
            values=values,
            ready=ready,
            absent=frozenset(absent),
            sections=Sections(
                num_layers=len(self.params),
                taken=taken,
                layers=self._has_block,
                modules=0 if self._acts is None or self.probe is None else len(self.probe.table),
                swallowed=self.swallowed is not None,
                recheck=recheck_block is not None,
                shadow=shadow_block is not None,
                formats=formats,
                optimizer_values=len(opt_values),
            ),
            found_inf_from_scale=from_scale,
            captured=captured,
            misuse=misuse,
            order=None if order is None else (
                order.final if order.final is not None else order.order()),
            clip=clip,
            recheck_error=self.recheck if isinstance(self.recheck, str) else None,
            recheck_names=self.recheck_names,
            shadow_error=shadow if isinstance(shadow, str) else None,
            shadow_absent=shadow[1] if isinstance(shadow, tuple) else frozenset(),
            numels=self._numel_t,
            found_inf_from_grads=not view.present,
            skipped_host=view.host_skip() if view.skips_on_host else None,
            pending=pending,
            optimizers=slots,
            pieces_only=self.pieces_only,
        )

    def _lr(
        self, device: torch.device, optimizers: Sequence[torch.optim.Optimizer]
    ) -> torch.Tensor | None:
        """The first optimizer's first group's lr, a float64 0-d tensor on ``device`` (cached)."""
        if not optimizers:
            return None
        groups = optimizers[0].param_groups
        if not groups or "lr" not in groups[0]:
            return None
        lr = groups[0]["lr"]
        if isinstance(lr, torch.Tensor):
            # A copy: a scheduler writes a tensor lr in place, and a CPU record reads it later.
            # A CPU lr reaches a CUDA record through pinned memory (no host sync).
            lr64 = lr.detach().to(dtype=torch.float64, copy=True).reshape(())
            return lr64 if lr64.device == device else to_device(lr64, device)
        key = (float(lr), device)
        if self._lr_cache is None or self._lr_cache[0] != key:  # a schedule changes it rarely
            self._lr_cache = (key, torch.full((), key[0], dtype=torch.float64, device=device))
        return self._lr_cache[1]
