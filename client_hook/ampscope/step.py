"""The step seam: where a training loop's optimizer step enters the hook.

A ``StepSource`` attaches to what the loop already calls and drives one ``cycle.StepCycle``:
``ScalerSource`` wraps a ``GradScaler``'s methods per instance (never the class) and each
optimizer's ``step``; ``OptimizerSource`` takes the optimizers' step hooks (no scaler);
``ZeroSource`` a DeepSpeed engine. A plain GradScaler step is, in full: ``_Scale``; in
``scaler.step``, ``_Step`` (the capture), ``_Unscale`` and ``_UnscaleGrads`` (the norms read in
the unscale), ``_bypass``; ``_Update`` (``tests/client_hook/test_step.py`` keeps it so).
Wrappers run the original exactly once (``_UnscaleGrads`` runs it or, where the C loop does
the unscale, none) and let its exceptions through; the hook's own go to ``on_error``, never to
training. A wrapper pickles (``deepcopy``, ``torch.save``) as the copy's own method, never as the
hook.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from itertools import chain
from operator import attrgetter, is_, itemgetter
from typing import Any, Protocol

import torch

from ampscope.cycle import HookState, ScalerView, StepCycle, unwrap_optimizer
from ampscope.misuse import MisuseTracker
from ampscope.zero import ZeroEngine

__all__ = ["OptimizerSource", "ScalerSource", "StepSource", "ZeroSource"]

ACTIVE = HookState.ACTIVE
_GRAD = attrgetter("grad")
_PARAMS = itemgetter("params")


class StepSource(Protocol):
    """What the loop calls, attached to (``attach``) and given back (``detach``, idempotent)."""

    cycle: StepCycle

    def attach(self) -> None: ...

    def detach(self) -> None: ...


class _Wrapper:
    """A wrapped method set on ``owner``'s instance; a subclass's ``__call__`` is the hook."""

    __slots__ = ("name", "original", "owner", "source")

    def __init__(self, source: Any, owner: Any, name: str) -> None:
        self.source, self.owner, self.name = source, owner, name
        self.original: Callable[..., Any] = getattr(owner, name)  # bound: chains a wrapper

    def __reduce__(self) -> tuple[Any, ...]:
        return getattr, (self.owner, self.name)


class _Methods:
    """Installs ``_Wrapper``s on instances and takes them off again."""

    def __init__(self) -> None:
        self._wrapped: list[tuple[Any, str, bool, Any, _Wrapper]] = []

    def wrap(self, wrapper: _Wrapper) -> None:
        owner, name = wrapper.owner, wrapper.name
        had = name in vars(owner)
        self._wrapped.append((owner, name, had, vars(owner).get(name), wrapper))
        setattr(owner, name, wrapper)

    def unwrap(self) -> None:
        for owner, name, had, previous, wrapper in self._wrapped:
            if vars(owner).get(name) is not wrapper:
                continue  # someone wrapped on top of us: stay in the chain as a pass-through
            if had:
                setattr(owner, name, previous)
            else:
                delattr(owner, name)
        self._wrapped = []


# -- GradScaler -----------------------------------------------------------------------------------
class _Scale(_Wrapper):
    __slots__ = ()

    def __call__(self, outputs: Any) -> Any:
        cycle = self.source.cycle
        if cycle.state is not ACTIVE:
            return self.original(outputs)
        try:  # ``cycle.on_scale``, inline: every step's path
            if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
                loss = outputs.detach().to(torch.float64, copy=True)
                cycle.loss_sum = loss if cycle.loss_sum is None else cycle.loss_sum + loss
        except Exception as exc:
            cycle.on_error("scale", exc)
        scaled = self.original(outputs)
        if cycle.count_writes and isinstance(scaled, torch.Tensor) and scaled.requires_grad:
            try:  # the end of its backward: where clipping before unscale_ is seen (misuse.py)
                scaled.register_hook(self.backward_end)
            except Exception as exc:
                cycle.on_error("scale", exc)
        return scaled

    def backward_end(self, grad: torch.Tensor | None = None) -> None:
        """Called twice per backward: as the scaled loss's tensor hook it queues itself as the
        engine's end-of-backward callback; called back, it notes each gradient's id and version
        for ``StepCycle.capture`` (one function: two calls on every step's path)."""
        cycle = self.source.cycle
        try:
            if grad is not None:
                torch.autograd.Variable._execution_engine.queue_callback(self.backward_end)
                return
            seen: list[tuple[int, int]] = []
            for p in cycle.params:  # a loop, not a comprehension: no Python call per backward
                g = p.grad
                seen.append((0, -1) if g is None else (id(g), g._version))
            cycle.after_backward = seen
        except Exception as exc:
            cycle.after_backward = None  # the step is not judged
            cycle.on_error("backward", exc)


class _Unscale(_Wrapper):
    __slots__ = ()

    def __call__(self, optimizer: torch.optim.Optimizer) -> Any:
        source: ScalerSource = self.source
        cycle = source.cycle
        if cycle.state is ACTIVE:
            try:
                if source.in_step:  # scaler.step's own unscale_: torch checked the stage
                    cycle.misuse.unscaled.add(id(optimizer))
                else:
                    cycle.misuse.note_unscale(optimizer, source.view.stage(optimizer))
            except Exception as exc:
                cycle.on_error("unscale_", exc)
            if not cycle.captured:
                cycle.capture(optimizer)
                if id(optimizer) not in source.bypass and cycle.sends:
                    try:  # as at ``scaler.step``: a direct step after this is seen too
                        source.watch(optimizer)
                    except Exception as exc:
                        cycle.on_error("unscale_", exc)
        elif cycle.group is not None:
            cycle.contribute_nothing()
        return self.original(optimizer)


class _UnscaleGrads(_Wrapper):
    """``GradScaler._unscale_grads_``, the pass that multiplies every gradient by the inverse
    scale. Where the capture left the norms due (``StepCycle.due``) and these are exactly this
    optimizer's gradients, in order, the C loop unscales them as torch's kernel would and reads
    the norms in the same pass (``GradStats.raw_norms``): the every-step norms add no pass over
    the gradients (docs/hook-cost.md#the-norms-in-the-unscale). It returns what torch's returns,
    ``{device: found_inf}``. Else the norms are read first and torch unscales."""

    __slots__ = ()

    def __call__(self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor,
                 found_inf: torch.Tensor, allow_fp16: bool) -> Any:
        cycle = self.source.cycle
        due = cycle.due
        if due is not None:
            try:
                norms, grads = due
                params = list(chain.from_iterable(map(_PARAMS, optimizer.param_groups)))
                if len(params) == len(grads) and all(map(is_, map(_GRAD, params), grads)):
                    stats = cycle.stats
                    stats.raw_norms(grads, acc64=True, out=norms, unscale=(inv_scale, found_inf))
                    cycle.due = None
                    if stats.unscaled:
                        return {found_inf.device: found_inf}
            except Exception as exc:
                cycle.on_error("unscale_", exc)
            cycle.settle()  # the norms before torch's unscale, if not read yet
        return self.original(optimizer, inv_scale, found_inf, allow_fp16)


class _Step(_Wrapper):
    __slots__ = ()

    def __call__(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        source: ScalerSource = self.source
        cycle = source.cycle
        active = cycle.state is ACTIVE
        snapshot = None
        if active:
            if not cycle.captured:
                cycle.capture(optimizer)
            if id(optimizer) not in source.bypass and (cycle.sends or cycle.recheck_fn):
                try:  # a loop's optimizer met here first: see its direct steps too
                    source.watch(optimizer)
                except Exception as exc:
                    cycle.on_error("step", exc)
            if cycle.swallow is not None and cycle.has_block:
                try:
                    snapshot = cycle.swallow.before_step(optimizer)
                except Exception as exc:
                    cycle.on_error("step", exc)
        elif cycle.group is not None:
            cycle.contribute_nothing()
        source.in_step, source.stepped = True, False
        try:
            result = self.original(optimizer, *args, **kwargs)
        finally:
            source.in_step = False
        if active and cycle.state is ACTIVE and (snapshot or cycle.recheck_fn is not None):
            try:  # host-side skip knowledge for the re-check (``Monitor.recheck``), swallowed
                if cycle.recheck_fn is not None:
                    if getattr(optimizer, "_step_supports_amp_scaling", False) and source.view.on:
                        cycle.skip_unknown = True  # always called: its kernel applies found_inf
                    elif not source.stepped:
                        cycle.skipped = True
                if snapshot and cycle.swallow is not None:
                    cycle.swallow.after_step(snapshot)
            except Exception as exc:
                cycle.on_error("step", exc)
        return result


class _Update(_Wrapper):
    __slots__ = ()

    def __call__(self, new_scale: Any = None) -> Any:
        source: ScalerSource = self.source
        cycle = source.cycle
        before: dict[str, Any] | None = None
        if cycle.state is ACTIVE:
            try:
                before = source.view.before_update(cycle.optimizers)
            except Exception as exc:
                cycle.on_error("update", exc)
        result = self.original(new_scale)
        cycle.end(before)
        return result


class ScalerSource:
    """A ``GradScaler``'s step cycle. ``stepped``: the optimizer's ``step`` ran inside
    ``scaler.step`` (torch calls it only when found_inf was 0: "not skipped", for free);
    ``bypass``: the optimizers whose ``step`` is wrapped, by id."""

    def __init__(self, cycle: StepCycle, scaler: torch.amp.GradScaler, view: ScalerView) -> None:
        self.cycle, self.scaler, self.view = cycle, scaler, view
        self.in_step = False
        self.stepped = False
        self.bypass: dict[int, tuple[torch.optim.Optimizer, Any, bool, Any]] = {}
        self._methods = _Methods()

    def attach(self) -> None:
        for opt in self.cycle.optimizers:
            self.watch(opt)
        for hook, name in ((_Scale, "scale"), (_Unscale, "unscale_"), (_Step, "step"),
                           (_Update, "update")):
            self._methods.wrap(hook(self, self.scaler, name))
        # torch's own unscale (a subclass's, e.g. FSDP's ShardedGradScaler, is left alone), and
        # the whole gradients on this process: no peer sums their squares.
        if (self.cycle.group is None and getattr(type(self.scaler), "_unscale_grads_", None)
                is torch.amp.GradScaler._unscale_grads_):
            self._methods.wrap(_UnscaleGrads(self, self.scaler, "_unscale_grads_"))
            self.cycle.unscale_reads = True

    def detach(self) -> None:
        self.cycle.unscale_reads = False
        self.cycle.settle()
        self._methods.unwrap()
        for optimizer, bound, had_own, previous in self.bypass.values():
            if vars(optimizer).get("step") is not bound:
                continue  # wrapped over by someone else: stays, inert
            if had_own:
                optimizer.step = previous  # type: ignore[method-assign]
            else:
                del optimizer.step
        self.bypass.clear()

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Wrap ``optimizer.step`` once per instance to see calls that bypass ``scaler.step``: a
        bound method, so an ``LRScheduler`` made later can wrap it again."""
        optimizer = unwrap_optimizer(optimizer)
        if id(optimizer) in self.bypass:
            return
        original = optimizer.step  # bound: chains an earlier instance wrapper too
        cycle, view = self.cycle, self.view

        def _bypass(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            if self.in_step:
                self.stepped = True
                if cycle.shadow_every and not (
                        view.on and getattr(opt, "_step_supports_amp_scaling", False)):
                    cycle.taken()  # applied, not yet stepped: the shadow step's point
            elif cycle.state is ACTIVE and view.on:
                cycle.misuse.pending.append(MisuseTracker.bypass(opt))
            return original(*args, **kwargs)

        bound = types.MethodType(_bypass, optimizer)
        had_own = "step" in vars(optimizer)
        self.bypass[id(optimizer)] = (optimizer, bound, had_own, vars(optimizer).get("step"))
        optimizer.step = bound  # type: ignore[method-assign]


# -- the optimizers' own hooks (no scaler) --------------------------------------------------------
class OptimizerSource:
    """Without a scaler a cycle is one step of every watched optimizer: captured before the
    first steps, recorded when the last has (or earlier, at the next loss or a second step of
    one). Its hooks are left out of a pickled or saved optimizer (``__getstate__``)."""

    def __init__(self, cycle: StepCycle) -> None:
        self.cycle = cycle
        self._handles: list[Any] = []
        self._snapshot: list[Any] | None = None

    def attach(self) -> None:
        for opt in self.cycle.optimizers:
            self._handles.append(opt.register_step_pre_hook(self._before))
            self._handles.append(opt.register_step_post_hook(self._after))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _before(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        cycle = self.cycle
        if cycle.state is not ACTIVE:
            if cycle.state is HookState.DISABLED and cycle.group is not None:
                # The cycles go on: its peers count on this rank's (empty) share.
                if id(optimizer) in cycle.stepped:
                    cycle.end({})
                cycle.contribute_nothing()
            return None
        if id(optimizer) in cycle.stepped:
            cycle.end({})
        # torch passes the hook step()'s own arguments, the optimizer first: a closure given
        # by position is args[1].
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if not callable(closure):
            self._ready(optimizer)
            return None

        # ``step(closure)`` (LBFGS, Lightning without a scaler): the closure runs the backward
        # inside ``step``, after this hook, so the capture follows the closure's first call.
        def closure_then_capture() -> Any:
            result = closure()
            if cycle.state is ACTIVE and not cycle.captured:
                self._ready(optimizer)
            return result

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_capture}
        return (args[0], closure_then_capture, *args[2:]), kwargs

    def _ready(self, optimizer: torch.optim.Optimizer) -> None:
        """The gradients are final: the capture (once per cycle) and the swallowed snapshot."""
        cycle = self.cycle
        if not cycle.captured:
            cycle.capture(optimizer)
        if cycle.shadow_every:
            cycle.taken()  # nothing skips a step without a scaler
        if cycle.swallow is not None and cycle.has_block and cycle.state is ACTIVE:
            try:
                self._snapshot = cycle.swallow.before_step(optimizer)
            except Exception as exc:
                cycle.on_error("step", exc)

    def _after(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        cycle = self.cycle
        if cycle.state is HookState.DISABLED and cycle.group is not None:
            cycle.stepped.add(id(optimizer))
            if len(cycle.stepped) >= len(cycle.optimizers):
                cycle.end({})
            return
        if cycle.state is not ACTIVE:
            return
        snapshot, self._snapshot = self._snapshot, None
        if snapshot and cycle.swallow is not None:
            try:
                cycle.swallow.after_step(snapshot)
            except Exception as exc:
                cycle.on_error("step", exc)
        cycle.stepped.add(id(optimizer))
        if len(cycle.stepped) >= len(cycle.optimizers):
            cycle.end({})


# -- DeepSpeed ------------------------------------------------------------------------------------
class _Backward(_Wrapper):
    __slots__ = ()

    def __call__(self, loss: Any, *args: Any, **kwargs: Any) -> Any:
        source: ZeroSource = self.source
        cycle = source.cycle
        if cycle.state is ACTIVE:
            try:
                # backward(loss, retain_graph=False, scale_wrt_gas=True)
                by_gas = kwargs.get("scale_wrt_gas", args[1] if len(args) > 1 else True)
                cycle.on_scale(source.zero.loss_share(loss, bool(by_gas)))
                source.losses_from_backward = True
            except Exception as exc:
                cycle.on_error("backward", exc)
        return self.original(loss, *args, **kwargs)


class _ZeroStep(_Wrapper):
    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        source: ZeroSource = self.source
        cycle = source.cycle
        before: dict[str, Any] | None = None
        if cycle.state is ACTIVE:
            if not cycle.captured:
                cycle.capture(cycle.optimizers[0])
            try:
                before = source.view.before_update()
            except Exception as exc:
                cycle.on_error("step", exc)
        else:
            cycle.contribute_nothing()
        result = self.original(*args, **kwargs)
        cycle.end(before)
        return result


class ZeroSource:
    """A DeepSpeed engine (``zero.py``): the loss from ``backward``; captured before the ZeRO
    optimizer's ``step``, recorded after it. ``losses_from_backward``: else ``record_loss``."""

    def __init__(self, cycle: StepCycle, zero: ZeroEngine, view: ScalerView) -> None:
        self.cycle, self.zero, self.view = cycle, zero, view
        self.losses_from_backward = False
        self._methods = _Methods()

    def attach(self) -> None:
        self._methods.wrap(_Backward(self, self.zero.engine, "backward"))
        self._methods.wrap(_ZeroStep(self, self.zero.optimizer, "step"))

    def detach(self) -> None:
        self._methods.unwrap()
