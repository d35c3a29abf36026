"""``Monitor``: wraps one ``GradScaler`` instance and turns each optimizer step into a wire record.

Lifecycle of a step cycle (everything between two ``scaler.update()`` calls):

1. ``scaler.scale(loss)``: the detached loss is remembered (no sync); with gradient accumulation
   the record carries the mean of the losses scaled since the previous ``update()``.
2. The *first* ``scaler.unscale_(opt)`` or ``scaler.step(opt)`` of the cycle captures gradient
   stats of every watched parameter that has a ``.grad``: before ``unscale_`` when the optimizer's
   stage is READY (the grads are still scaled, and are divided by the scale), or as they are when
   the loop already unscaled them (stage UNSCALED/STEPPED: true units). The global grad norm is
   captured every step; per-layer stats every ``layer_every`` steps. Later calls in the cycle
   capture nothing, so ``unscale_`` → clip → ``step`` and k backward passes per step both give
   exactly one capture.
3. ``scaler.update()``: the scale before (a device copy), ``found_inf`` (the sum of the scaler's
   per-optimizer ``found_inf_per_device`` tensors), the original ``update()``, then the scale after
   and the growth tracker. All scalars and the stats are stacked into ONE float64 device tensor and
   copied to the host once (on CUDA: ``non_blocking`` into pinned memory plus an event the sender
   thread waits on); the training thread then only enqueues.

Syncs: none added on the training thread when ``scaler._scale`` and ``_per_optimizer_states`` exist
(feature-checked). Without them the public fallback calls ``get_scale()`` (a sync) per step.

The scaler is wrapped per instance (instance attributes that call the bound originals), never the
class. Every wrapper runs the original exactly once and lets its exceptions through, but an
exception in the hook's own code never reaches training: it is counted and, after ``max_errors``
of them, the hook disables itself with one ``AmpscopeWarning``.
"""

from __future__ import annotations

import atexit
import enum
import logging
import os
import socket
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ampscope import wire
from ampscope.formats import TargetFormat
from ampscope.record import SCALARS, StepRecord, layer_table
from ampscope.reductions import GradStats
from ampscope.transport import HttpSender, Sender, Transport

__all__ = ["AmpscopeWarning", "Monitor", "MonitorStats", "watch"]

logger = logging.getLogger("ampscope")

_WRAPPED = ("scale", "unscale_", "step", "update")


class AmpscopeWarning(RuntimeWarning):
    """The hook disabled itself; training is unaffected."""


class HookState(enum.Enum):
    ACTIVE = "active"
    DISABLED = "disabled"  # enabled=False, repeated internal errors, or a forked child
    CLOSED = "closed"


@dataclass(frozen=True)
class MonitorStats:
    """Record accounting: ``produced == acknowledged + dropped + pending`` always holds."""

    produced: int
    acknowledged: int
    dropped: int
    pending: int
    failed_requests: int
    internal_errors: int


_MONITORS: weakref.WeakSet[Monitor] = weakref.WeakSet()


def _disable_after_fork() -> None:
    for mon in list(_MONITORS):
        mon._state = HookState.DISABLED


os.register_at_fork(after_in_child=_disable_after_fork)


def _rank() -> int:
    if "RANK" in os.environ:
        try:
            return int(os.environ["RANK"])
        except ValueError:
            pass
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


class Monitor:
    """Watches one model + ``torch.amp.GradScaler`` instance; see the module docstring."""

    def __init__(
        self,
        model: torch.nn.Module,
        scaler: torch.amp.GradScaler,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        *,
        run: str | None = None,
        server: str | None = "http://127.0.0.1:8765",
        project: str = "default",
        tags: Iterable[str] = (),
        config: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        target_format: str | TargetFormat = "fp16",
        layer_every: int = 10,
        enabled: bool = True,
        close_timeout_s: float = 5.0,
        sender: Sender | None = None,
        max_errors: int = 3,
    ) -> None:
        self.fmt = TargetFormat.get(target_format)
        self.run_id = run_id or str(uuid.uuid4())
        self.attempt_id = str(uuid.uuid4())
        self.layer_every = layer_every
        self.close_timeout_s = close_timeout_s
        self._model = model
        self._scaler = scaler
        if optimizer is None:
            self._optimizers: list[torch.optim.Optimizer] = []
        elif isinstance(optimizer, torch.optim.Optimizer):
            self._optimizers = [optimizer]
        else:
            self._optimizers = list(optimizer)
        self._owner: dict[int, torch.optim.Optimizer] = {}
        self._owner_of: tuple[int, ...] = ()
        self._layers, self._params = layer_table(model)
        self._stats = GradStats(self.fmt, [p.numel() for p in self._params])
        self._max_errors = max_errors
        self._errors = 0
        self._updates = 0
        self._seq = 0
        self._last_update: float | None = None
        self._reset_cycle()
        self._run_info: dict[str, Any] = {
            "id": self.run_id,
            "project": project,
            "name": run if run is not None else f"run-{self.run_id[:8]}",
            "tags": [str(t) for t in tags],
            "config": wire.jsonable(dict(config or {})),
            "host": socket.gethostname(),
            "rank": _rank(),
            "target_format": self.fmt.name,
        }
        self._attempt_info: dict[str, Any] = {
            "id": self.attempt_id, "pid": os.getpid(), "started_at": time.time()}
        self._originals: dict[str, Callable[..., Any]] = {}
        self._previous: dict[str, Any] = {}
        self._state = HookState.ACTIVE if enabled else HookState.DISABLED
        self._transport: Transport | None = None
        if not enabled:
            return
        if sender is None and server is not None:
            sender = HttpSender(server)
        self._transport = Transport(sender, self._encode)
        self._wrap()
        atexit.register(self.close)
        _MONITORS.add(self)

    # -- public ----------------------------------------------------------------------------------
    @property
    def layers(self) -> list[dict[str, Any]]:
        """The layer table as sent on the wire."""
        return [dict(layer) for layer in self._layers]

    @property
    def state(self) -> HookState:
        return self._state

    def stats(self) -> MonitorStats:
        t = self._transport.stats() if self._transport is not None else None
        return MonitorStats(
            produced=t.produced if t else 0,
            acknowledged=t.acknowledged if t else 0,
            dropped=t.dropped if t else 0,
            pending=t.pending if t else 0,
            failed_requests=t.failed_requests if t else 0,
            internal_errors=self._errors,
        )

    def close(self, timeout: float | None = None) -> None:
        """Unwrap the scaler, flush and send the final batch (``"final": true``).

        Returns within ``timeout`` seconds (default ``close_timeout_s``) even when the server is
        unreachable; what could not be sent by then is counted as dropped. Idempotent.
        """
        if self._state is HookState.CLOSED:
            return
        self._state = HookState.CLOSED
        try:
            atexit.unregister(self.close)
            self._unwrap()
            if self._transport is not None:
                self._transport.close(self.close_timeout_s if timeout is None else timeout)
        except Exception as exc:  # close runs from atexit too: never raise
            logger.warning("ampscope close failed: %r", exc)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- wrapping --------------------------------------------------------------------------------
    def _wrap(self) -> None:
        scaler = self._scaler
        hooks: dict[str, Callable[..., Any]] = {
            "scale": self._wrapped_scale,
            "unscale_": self._wrapped_unscale,
            "step": self._wrapped_step,
            "update": self._wrapped_update,
        }
        for name in _WRAPPED:
            self._originals[name] = getattr(scaler, name)  # bound: chains an earlier wrapper too
            if name in vars(scaler):
                self._previous[name] = vars(scaler)[name]
            setattr(scaler, name, hooks[name])

    def _unwrap(self) -> None:
        attrs = vars(self._scaler)
        for name in self._originals:
            mine = attrs.get(name)
            if getattr(mine, "__self__", None) is not self:
                continue  # someone wrapped on top of us: stay in the chain as a pass-through
            if name in self._previous:
                setattr(self._scaler, name, self._previous[name])
            else:
                delattr(self._scaler, name)

    def _wrapped_scale(self, outputs: Any) -> Any:
        if self._state is HookState.ACTIVE:
            try:
                self._on_scale(outputs)
            except Exception as exc:
                self._internal_error("scale", exc)
        return self._originals["scale"](outputs)

    def _wrapped_unscale(self, optimizer: torch.optim.Optimizer) -> Any:
        if self._state is HookState.ACTIVE and not self._captured:
            self._capture_guarded(optimizer)
        return self._originals["unscale_"](optimizer)

    def _wrapped_step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        if self._state is HookState.ACTIVE and not self._captured:
            self._capture_guarded(optimizer)
        return self._originals["step"](optimizer, *args, **kwargs)

    def _wrapped_update(self, new_scale: Any = None) -> Any:
        before: dict[str, Any] | None = None
        if self._state is HookState.ACTIVE:
            try:
                before = self._before_update()
            except Exception as exc:
                self._internal_error("update", exc)
        result = self._originals["update"](new_scale)
        if before is not None and self._state is HookState.ACTIVE:
            try:
                self._after_update(before)
            except Exception as exc:
                self._internal_error("update", exc)
        if self._state is not HookState.CLOSED:
            self._updates += 1
            self._reset_cycle()
        return result

    def _internal_error(self, where: str, exc: Exception) -> None:
        self._errors += 1
        if self._errors == 1:
            logger.warning("ampscope hook error in %s (training continues)", where, exc_info=exc)
        if self._errors >= self._max_errors and self._state is HookState.ACTIVE:
            self._state = HookState.DISABLED
            try:
                warnings.warn(
                    f"ampscope disabled itself after {self._errors} internal errors "
                    f"(last in {where}: {exc!r}); training is unaffected",
                    AmpscopeWarning,
                    stacklevel=4,
                )
            except Exception:  # warnings turned into errors must not reach training either
                logger.warning("ampscope disabled after %d internal errors", self._errors)

    # -- the step cycle --------------------------------------------------------------------------
    def _reset_cycle(self) -> None:
        self._captured = False
        self._norm: torch.Tensor | None = None
        self._block: torch.Tensor | None = None
        self._loss_sum: torch.Tensor | None = None
        self._loss_n = 0

    def _on_scale(self, outputs: Any) -> None:
        if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
            loss = outputs.detach().reshape(()).to(torch.float64)
            self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
            self._loss_n += 1

    def _enabled_scaler(self) -> bool:
        return bool(self._scaler.is_enabled())

    def _scale_in_effect(self) -> torch.Tensor | float:
        """The scale as a device tensor when the scaler exposes it, else a float (a sync)."""
        if not self._enabled_scaler():
            return 1.0
        scale = getattr(self._scaler, "_scale", None)
        if isinstance(scale, torch.Tensor):
            return scale
        return float(self._scaler.get_scale())

    def _stage(self, optimizer: torch.optim.Optimizer) -> str | None:
        """The scaler's stage name for ``optimizer``, READY if untouched, None if unknowable."""
        states = getattr(self._scaler, "_per_optimizer_states", None)
        if not isinstance(states, Mapping):
            return None
        state = states.get(id(optimizer))  # .get: never grow the scaler's defaultdict
        if state is None:
            return "READY"
        return getattr(state.get("stage"), "name", None)

    def _scaled_flags(self, optimizer: torch.optim.Optimizer) -> list[bool]:
        if not self._enabled_scaler():
            return [False] * len(self._params)
        if optimizer not in self._optimizers:
            self._optimizers.append(optimizer)
        current = self._stage(optimizer)
        if current is None:  # no private state: we run before the first unscale_, so scaled
            return [True] * len(self._params)
        key = tuple(id(o) for o in self._optimizers)
        if key != self._owner_of:
            self._owner = {id(p): o for o in self._optimizers
                           for g in o.param_groups for p in g["params"]}
            self._owner_of = key
        stages = {id(o): self._stage(o) for o in self._optimizers}
        flags = []
        for p in self._params:
            owner = self._owner.get(id(p))
            stage = stages[id(owner)] if owner is not None else current
            flags.append(stage == "READY")
        return flags

    def _capture_guarded(self, optimizer: torch.optim.Optimizer) -> None:
        self._captured = True  # even on failure: one attempt per cycle
        try:
            self._capture(optimizer)
        except Exception as exc:
            self._internal_error("capture", exc)

    def _capture(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for p in self._params]
        scaled = self._scaled_flags(optimizer)
        scale = self._scale_in_effect()
        if self.layer_every > 0 and self._updates % self.layer_every == 0:
            out = self._stats.layer_stats(grads, scale, scaled)
            self._norm, self._block = out[0], out[1:]
        else:
            self._norm = self._stats.grad_norm(grads, scale, scaled)

    def _before_update(self) -> dict[str, Any]:
        before: dict[str, Any] = {}
        if not self._enabled_scaler():
            return before
        scale = getattr(self._scaler, "_scale", None)
        if isinstance(scale, torch.Tensor):
            before["scale"] = scale.detach().to(torch.float64, copy=True)
        else:
            before["scale_host"] = float(self._scaler.get_scale())
        states = getattr(self._scaler, "_per_optimizer_states", None)
        found: list[torch.Tensor] = []
        if isinstance(states, Mapping):
            for state in states.values():
                if not isinstance(state, Mapping):
                    continue
                per_device = state.get("found_inf_per_device", {})
                found.extend(t for t in per_device.values() if isinstance(t, torch.Tensor))
        if found:
            device = found[0].device
            before["found_inf"] = torch.stack(
                [t.detach().to(device=device, dtype=torch.float64).reshape(()) for t in found]
            ).sum().clamp(max=1.0)
        return before

    def _after_update(self, before: Mapping[str, Any]) -> None:
        now = time.perf_counter()
        duration = None if self._last_update is None else now - self._last_update
        self._last_update = now
        device = self._device(before)
        f64 = torch.float64

        def const(x: float) -> torch.Tensor:
            return torch.full((), x, dtype=f64, device=device)

        absent: set[str] = set()
        from_scale = False
        if not self._enabled_scaler():
            scale_before = scale_after = const(1.0)
            found_inf = const(0.0)
            growth = const(0.0)
            absent.add("growth_tracker")
        else:
            after = getattr(self._scaler, "_scale", None)
            if "scale" in before and isinstance(after, torch.Tensor):
                scale_before = before["scale"].to(device)
                scale_after = after.detach().to(device=device, dtype=f64)
            else:
                scale_before = const(before.get("scale_host", float("nan")))
                scale_after = const(float(self._scaler.get_scale()))
            tracker = getattr(self._scaler, "_growth_tracker", None)
            if isinstance(tracker, torch.Tensor):
                growth = tracker.detach().to(device=device, dtype=f64)
            else:
                growth = const(0.0)
                absent.add("growth_tracker")
            if "found_inf" in before:
                found_inf = before["found_inf"].to(device)
            else:
                found_inf = const(0.0)
                from_scale = True
        if self._loss_sum is not None:
            loss = (self._loss_sum / self._loss_n).to(device)
        else:
            loss = const(float("nan"))
            absent.add("loss")
        norm = self._norm.to(device) if self._norm is not None else const(float("nan"))
        if self._norm is None:
            absent.add("grad_norm")
        lr = self._lr(device)
        if lr is None:
            lr = const(float("nan"))
            absent.add("lr")
        head = torch.stack([scale_before, scale_after, growth, found_inf, loss, norm, lr])
        assert head.numel() == len(SCALARS)
        block = self._block
        values = head if block is None else torch.cat([head, block.to(device)])
        ready = None
        if values.is_cuda:
            host = torch.empty(values.shape, dtype=f64, pin_memory=True)
            host.copy_(values, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            values = host
        elif values.device.type != "cpu":
            values = values.to("cpu")
        record = StepRecord(
            seq=self._seq,
            step=self._updates,
            wall_time=time.time(),
            duration=duration,
            values=values,
            ready=ready,
            absent=frozenset(absent),
            num_layers=None if block is None else len(self._params),
            found_inf_from_scale=from_scale,
        )
        self._seq += 1
        assert self._transport is not None
        self._transport.put(record)

    def _device(self, before: Mapping[str, Any]) -> torch.device:
        if "scale" in before:
            return torch.device(before["scale"].device)
        if self._norm is not None:
            return self._norm.device
        return torch.device("cpu")

    def _lr(self, device: torch.device) -> torch.Tensor | None:
        if not self._optimizers:
            return None
        groups = self._optimizers[0].param_groups
        if not groups or "lr" not in groups[0]:
            return None
        lr = groups[0]["lr"]
        if isinstance(lr, torch.Tensor):
            return lr.detach().to(device=device, dtype=torch.float64).reshape(())
        return torch.full((), float(lr), dtype=torch.float64, device=device)

    def _encode(self, records: list[dict[str, Any]], include_layers: bool, final: bool) -> bytes:
        payload = wire.build_payload(
            run=self._run_info,
            attempt=self._attempt_info,
            layers=self._layers if include_layers else None,
            records=records,
            final=final,
        )
        return wire.dumps(payload)


def watch(
    model: torch.nn.Module,
    scaler: torch.amp.GradScaler,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
    *,
    run: str | None = None,
    server: str | None = "http://127.0.0.1:8765",
    project: str = "default",
    tags: Iterable[str] = (),
    config: Mapping[str, Any] | None = None,
    run_id: str | None = None,
    target_format: str | TargetFormat = "fp16",
    layer_every: int = 10,
    enabled: bool = True,
    close_timeout_s: float = 5.0,
    sender: Sender | None = None,
) -> Monitor:
    """Start monitoring ``model`` trained through ``scaler``; returns the ``Monitor``.

    ``server=None`` sends nothing (records are counted as dropped); ``sender`` replaces the HTTP
    sender (tests, embedding). ``layer_every``: per-layer stats on every N-th step (0: never);
    scalars are recorded every step. ``enabled=False`` returns an inert monitor.
    """
    return Monitor(
        model, scaler, optimizer, run=run, server=server, project=project, tags=tags,
        config=config, run_id=run_id, target_format=target_format, layer_every=layer_every,
        enabled=enabled, close_timeout_s=close_timeout_s, sender=sender,
    )
