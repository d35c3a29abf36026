"""``Monitor``: wraps one ``GradScaler`` instance and turns each optimizer step into a wire record.

Lifecycle of a step cycle (everything between two ``scaler.update()`` calls):

1. ``scaler.scale(loss)``: the detached loss is remembered (no sync); with gradient accumulation
   the record carries the sum of the losses scaled since the previous ``update()``: the mean loss
   of the step when the loop divides each micro-batch's loss by their number, as the PyTorch
   docs and the frameworks do (a loop that does not gets k times its mean).
2. The *first* ``scaler.unscale_(opt)`` or ``scaler.step(opt)`` of the cycle captures the
   gradients of every watched parameter that has a ``.grad``: before ``unscale_`` when the
   optimizer's stage is READY (the grads are still scaled), or as they are when the loop already
   unscaled them (stage UNSCALED/STEPPED: true units). The capture is ONE read of the gradients
   (``capture.take``): every layer's raw norm on plain steps (for the global grad norm and each
   layer's finiteness, the overflow event's layers in backward order, ``order.py``), the raw
   per-layer partials on the steps ``layer_every`` makes due (``selection.py``), with the
   exponent histogram in the same read every ``histogram_every`` steps; nothing is finalized on
   the training thread. The sampled activation stats of the cycle are collected here too
   (``activations.py``). Later calls in the cycle capture nothing, so ``unscale_`` → clip →
   ``step`` and k backward passes per step both give exactly one capture. The record's
   ``captured`` says "before_unscale" when every watched gradient was still scaled, else
   "after_unscale" (a disabled scaler included: the grads are true units as they are).
3. ``scaler.update()``: the scale before (a device copy), ``found_inf`` (the sum of the scaler's
   per-optimizer ``found_inf_per_device`` tensors), the original ``update()``, then the scale after
   and the growth tracker. On a GPU all scalars and the capture's tensors are stacked into ONE
   float64 device tensor and copied to the host once (``non_blocking`` into pinned memory plus an
   event the sender thread waits on); on the CPU they are handed over unstacked. The training
   thread then only enqueues; the sender thread divides by the scale, computes the norms and
   fractions (``capture.finish``) and encodes.

Without a scaler (``watch(model, None, optimizer)``: BF16 or FP32 training) the cycle comes from
the optimizers' own step hooks (``register_step_pre_hook``/``register_step_post_hook``): the
capture before the first watched optimizer steps, the record once every watched optimizer has
stepped. The loss is what the loop hands to ``Monitor.record_loss``; the record has no scale
(null), ``found_inf`` says whether a gradient held NaN or ±inf (read from the capture on the
sender thread) with those layers in backward order, and nothing is ever ``skipped``: the
optimizer applied the step. The statistics are judged against ``target_format`` (default bf16
here, fp16 with a scaler) at scale 1.

Under ``torch.distributed`` every rank that calls ``watch`` takes part (``collective.py``): the
capture also packs this rank's share (``shards.py``) and issues the step's reductions on the
hook's own process group, asynchronously; rank 0's record waits for them on the sender thread;
the other ranks send nothing. A rank whose hook is off keeps issuing empty shares.

A DeepSpeed engine (``watch(engine)``, ``zero.py``) has no ``GradScaler``: the engine's
``backward`` gives the loss, its ZeRO optimizer's ``step`` is the cycle (the capture before it,
the record after it, with DeepSpeed's own skip decision and, in FP16, its loss scale), and each
rank reads its partition's pieces of the gradients, merged across the ranks as FSDP's shards are.

With several optimizers or parameter groups every record names each watched optimizer's own
skip (the scaler's per-optimizer ``found_inf``, read before ``update()`` clears it) and its
parameter groups' lrs.

AMP misuse (``misuse.py``) is recorded in the cycle's record, never raised.

Optional, wire v3: ``recheck(fn)`` re-runs an overflow step's batch in FP32 inside ``update()``
(``recheck.py``; how the overflow is known without a sync: ``Monitor.recheck``), and for models
with FP16/BF16 parameters ``scaler.step`` is bracketed on layer-stat steps to count swallowed
updates (``swallowed.py``); both add their device blocks to the step's one host copy, and a
model without low-precision parameters that registers no closure pays for neither.

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

from ampscope import collective, wire, zero
from ampscope.activations import ActivationProbe
from ampscope.cycle import StepCycle, per_optimizer
from ampscope.devices import to_device
from ampscope.formats import TargetFormat
from ampscope.misuse import ClipHeuristic, MisuseTracker
from ampscope.order import BackwardOrder
from ampscope.recheck import RecheckFn, run_recheck
from ampscope.record import layer_table
from ampscope.reductions import GradStats
from ampscope.scalerview import ScalerView
from ampscope.selection import Cadence, LayerEvery
from ampscope.swallowed import SwallowProbe
from ampscope.transport import DEFAULT_FLUSH_INTERVAL, HttpSender, Sender, Transport

__all__ = ["AmpscopeWarning", "HookState", "Monitor", "MonitorStats", "watch"]

logger = logging.getLogger("ampscope")

DEFAULT_SERVER = "http://127.0.0.1:8765"
# Queued records above which a CPU step's values are stacked on the training thread again
# (``_after_update``): 256 unstacked records are ~8 MiB.
DEFER_MAX = 256


class AmpscopeWarning(RuntimeWarning):
    """The hook disabled itself; training is unaffected."""


class _Wrapper:
    """A wrapped scaler method, set as an instance attribute of the scaler.

    It pickles (``pickle``, ``copy.deepcopy``, ``torch.save`` of the scaler: ``GradScaler``'s
    ``__getstate__`` keeps its whole ``__dict__``) as the copy's own method, never as the monitor,
    whose threads and locks cannot be copied: a copied or unpickled scaler is a plain, unwatched
    one.
    """

    __slots__ = ("monitor", "name", "scaler", "target")

    def __init__(self, monitor: Monitor, scaler: torch.amp.GradScaler, name: str,
                 target: Callable[..., Any]) -> None:
        self.monitor, self.scaler, self.name, self.target = monitor, scaler, name, target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.target(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return getattr, (self.scaler, self.name)


class HookState(enum.Enum):
    ACTIVE = "active"
    DISABLED = "disabled"  # enabled=False, repeated internal errors, or a forked child
    CLOSED = "closed"


@dataclass(frozen=True)
class MonitorStats:
    """Record accounting: ``produced == acknowledged + spooled + dropped + pending`` always holds
    (``pending``: in memory; ``spooled``: on disk, not yet acknowledged; ``replayed``: acknowledged
    from the spool, included in ``acknowledged``)."""

    produced: int
    acknowledged: int
    dropped: int
    pending: int
    failed_requests: int
    internal_errors: int
    spooled: int = 0
    replayed: int = 0


_MONITORS: weakref.WeakSet[Monitor] = weakref.WeakSet()


def _disable_after_fork() -> None:
    for mon in list(_MONITORS):
        mon._state = HookState.DISABLED


os.register_at_fork(after_in_child=_disable_after_fork)


def unwrap_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside a framework's wrapper (accelerate's ``AcceleratedOptimizer``
    holds it as ``.optimizer``): the one ``scaler.step`` steps, so the hook's view of a step and
    of a bypassed scaler is the same as for a plain loop."""
    seen = 0
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer) and seen < 8:
        optimizer, seen = optimizer.optimizer, seen + 1  # type: ignore[attr-defined]
    return optimizer


def _rank() -> int:
    return _distributed("RANK", "get_rank", 0)


def _world_size() -> int:
    return _distributed("WORLD_SIZE", "get_world_size", 1)


def _distributed(variable: str, getter: str, default: int) -> int:
    """The launcher's environment variable (torchrun, Lightning, accelerate set it before the
    process group exists), else the initialized process group's answer, else ``default``."""
    if variable in os.environ:
        try:
            return int(os.environ[variable])
        except ValueError:
            pass
    if _process_group_ready():
        return int(getattr(torch.distributed, getter)())
    return default


def _process_group_ready() -> bool:
    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _local_numel(p: torch.nn.Parameter) -> int:
    """This rank's number of elements of ``p`` (its shard's, for a DTensor)."""
    inner = collective.local(p)
    return inner.numel() if inner is not None else p.numel()


class Monitor:
    """Watches one model + ``torch.amp.GradScaler`` instance; see the module docstring and
    ``watch`` for the options."""

    def __init__(
        self,
        model: torch.nn.Module,
        scaler: torch.amp.GradScaler | None,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        *,
        run: str | None = None,
        server: str | None = DEFAULT_SERVER,
        project: str = "default",
        tags: Iterable[str] = (),
        config: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        target_format: str | TargetFormat | None = None,
        layer_every: LayerEvery = 10,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        activation_every: int = 50,
        histogram_every: int = 100,
        enabled: bool = True,
        close_timeout_s: float = 5.0,
        sender: Sender | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        spool_max_bytes: int = 256 * 2**20,
        max_errors: int = 3,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        token: str | None = None,
        fused: bool | None = None,
        all_ranks: bool = False,
        dist_timeout_s: float = collective.DEFAULT_TIMEOUT_S,
    ) -> None:
        rank, world_size = _rank(), _world_size()
        # A DeepSpeed engine (``zero.py``): its model's parameters are the layers, its ZeRO
        # optimizer the step cycle, its partitions the gradients.
        engine = zero.engine_of(model) if enabled else None
        if engine is not None:
            if scaler is not None:
                raise ValueError("DeepSpeed scales the loss itself: watch the engine without a "
                                 "GradScaler, ampscope.watch(engine)")
            model = engine.module
        self._zero = engine
        # The module inside a ZeRO engine, watched as a plain model (a framework's callback):
        # its .grad is empty, and reading it would send zeros as the layers' statistics.
        inside_engine = engine is None and enabled and zero.partitioned(model)
        if inside_engine:
            logger.warning("ampscope: these parameters belong to a DeepSpeed ZeRO engine, whose "
                           "gradients are not in .grad: gradient statistics are off; watch the "
                           "engine, ampscope.watch(engine)")
        flat = collective.flat_shards(model) if enabled else None
        full = engine.full_shapes() if engine is not None else (
            None if flat is None else flat.full)
        self._layers, self._params = layer_table(model, include, exclude, full)
        # One run per distributed job (``collective.py``): every rank takes part in the hook's
        # reductions, rank 0 sends. Without a group (no process group yet, or a rank that never
        # called watch()) rank 0 records alone and the others are inert, as enabled=False.
        group: collective.Group | None = None
        if enabled and not all_ranks and world_size > 1:
            if _process_group_ready():
                device = self._params[0].device if self._params else torch.device("cpu")
                group = collective.join(rank, world_size, device, dist_timeout_s)
            if group is None and rank != 0:
                logger.info("ampscope: global rank %d of %d does not record (rank 0 does; "
                            "all_ranks=True records every rank)", rank, world_size)
                enabled = False
        self._group = group
        self._sends = group is None or rank == 0
        # FSDP2's gradients are DTensor shards: without a group to merge them no rank holds a
        # layer's statistics, and a shard's would be sent as the layer's: none are taken (one
        # process's only shard is the whole gradient). A ZeRO job of one process reads each
        # gradient whole (its one piece), as an unsharded model is read.
        self._sharded = collective.sharded(self._params) or (
            flat is not None and not flat.flat_only) or (
            engine is not None and engine.has_pieces and world_size > 1)
        self._grads_off = (self._sharded and group is None and world_size > 1) or inside_engine
        if self._grads_off and enabled and not inside_engine:
            logger.warning("ampscope: the gradients are sharded (FSDP) and the ranks are not "
                           "all watched: gradient statistics are off (call watch() on every "
                           "rank, without all_ranks)")
        self._pieces_only = flat is not None and flat.flat_only
        if engine is not None and not engine.has_pieces:
            self._pieces_only = True  # no piece is read: the losses, scale and skips only
            logger.warning("ampscope: DeepSpeed ZeRO stage 3 with an offloaded optimizer: no "
                           "gradient statistics (the losses, the loss scale and the skipped "
                           "steps are recorded)")
        elif self._pieces_only:
            # Flat parameters are not layers: only their pieces' finiteness goes into the
            # ranks' shares; alone, nothing is read.
            self._grads_off = group is None
            logger.warning("ampscope: FSDP1 with use_orig_params=False keeps flat parameters: "
                           "no gradient statistics (the losses and the ranks' non-finite "
                           "gradients are recorded); use_orig_params=True or FSDP2 have them")
        # Without a scaler the run is BF16 (or FP32, judged against BF16's range): FP16 needs one.
        fp16 = scaler is not None or (engine is not None and engine.fp16)
        self.fmt = TargetFormat.get(target_format or ("fp16" if fp16 else "bf16"))
        self.run_id = run_id or str(uuid.uuid4())
        self.attempt_id = str(uuid.uuid4())
        self.layer_every = layer_every
        self.activation_every = max(0, activation_every)
        self.histogram_every = max(0, histogram_every)
        self.close_timeout_s = close_timeout_s
        self._model = model
        self._scaler = scaler
        self._view = ScalerView(scaler) if engine is None else zero.ZeroView(engine)
        self._optimizers: list[torch.optim.Optimizer] = []
        if engine is not None:  # the torch optimizer the ZeRO one steps: the lrs
            self._optimizers = [engine.torch_optimizer or engine.optimizer]
        elif optimizer is not None:
            # One optimizer (a framework's wrapper too: DeepSpeed's ZeRO optimizer holds the
            # torch one as ``.optimizer``), or a sequence of them.
            given = [optimizer] if not isinstance(optimizer, Sequence) else list(optimizer)
            self._optimizers = [unwrap_optimizer(o) for o in given]
            for opt in self._optimizers:
                if not isinstance(opt, torch.optim.Optimizer):
                    raise ValueError(f"ampscope: {type(opt).__name__} is not a torch optimizer "
                                     "and holds none as .optimizer")
        if scaler is None and not self._optimizers and engine is None:
            raise ValueError("without a GradScaler ampscope takes each step from the optimizer: "
                             "pass it, ampscope.watch(model, None, optimizer)")
        self._cadence = Cadence(layer_every, [layer["name"] for layer in self._layers])
        # A disabled scaler reports no found_inf, which alone tells a float32 overflow of the
        # every-step norms from an inf gradient (record.StepRecord.to_wire): exact norms there.
        # A shard's absent gradient stands for its own piece of zeros: local sizes there.
        numels = (engine.piece_numels(self._params) if engine is not None
                  else [_local_numel(p) for p in self._params])
        self._stats = GradStats(self.fmt, numels,
                                exact_norms=not self._view.enabled(),
                                fused=False if not enabled or self._sharded else fused)
        self._max_errors = max_errors
        self._errors = 0
        self._updates = 0
        self._seq = 0
        self._misuse = MisuseTracker(lambda: self._state is HookState.ACTIVE)
        self._clip = ClipHeuristic()
        self._order: BackwardOrder | None = None
        self._lr_cache: tuple[tuple[float, torch.device], torch.Tensor] | None = None
        self._probe: ActivationProbe | None = None
        self._recheck_fn: RecheckFn | None = None
        # DeepSpeed updates its own FP32 partitions, not the parameters the probe would watch.
        self._swallow = SwallowProbe.for_params(self._params) if engine is None else None
        self._cycle = StepCycle(self._params, self._stats, self._cadence, self.histogram_every,
                                self._view, None, None,
                                numels=[layer["numel"] for layer in self._layers],
                                grads=None if engine is None else engine.reader(self._params),
                                group=group, sharded=self._sharded, sends=self._sends,
                                pieces_only=self._pieces_only)
        self._run_info: dict[str, Any] = {
            "id": self.run_id,
            "project": project,
            "name": run if run is not None else f"run-{self.run_id[:8]}",
            "tags": [str(t) for t in tags],
            "config": wire.jsonable(dict(config or {})),
            "host": socket.gethostname(),
            "rank": rank,
            "world_size": world_size,
            "target_format": self.fmt.name,
        }
        self._attempt_info: dict[str, Any] = {
            "id": self.attempt_id, "pid": os.getpid(), "started_at": time.time()}
        self._originals: dict[str, Callable[..., Any]] = {}
        self._previous: dict[str, Any] = {}
        self._wrapped: list[tuple[Any, str]] = []  # (object, method name), as wrapped
        # Without a scaler: the optimizers' step hooks, those that stepped in this cycle, and the
        # swallowed-update snapshot taken before the step.
        self._step_handles: list[Any] = []
        self._stepped: set[int] = set()
        self._snapshot: list[Any] | None = None
        self._warned_record_loss = False
        self._losses_from_backward = False  # DeepSpeed: engine.backward delivered a loss
        self._state = HookState.ACTIVE if enabled else HookState.DISABLED
        self._transport: Transport | None = None
        if not enabled:
            return
        if not self._sends:  # a contributing rank: the step cycle and its share, nothing sent
            self._wrap()
            atexit.register(self.close)
            _MONITORS.add(self)
            return
        if os.environ.get("AMPSCOPE_MODE", "").strip().lower() == "offline":
            server = None
        if sender is None and server is not None:
            sender = HttpSender(server, token=token or os.environ.get("AMPSCOPE_TOKEN") or None)
        self._transport = Transport(sender, self._encode, spool_dir=spool_dir,
                                    spool_max_bytes=spool_max_bytes, flush_interval=flush_interval)
        self._order = BackwardOrder(self._params)
        if self.activation_every:
            self._probe = ActivationProbe(model, self.fmt,
                                          lambda exc: self._internal_error("activation", exc))
            self._probe.arm()  # step 0 is a sample
        self._cycle.probe, self._cycle.order = self._probe, self._order
        if self._scaler is not None:  # without a scaler there is nothing to bypass
            for opt in self._optimizers:
                self._misuse.watch(opt, self._view.enabled)
        self._wrap()
        atexit.register(self.close)
        _MONITORS.add(self)

    # -- public ----------------------------------------------------------------------------------
    @property
    def layers(self) -> list[dict[str, Any]]:
        """The layer table as sent on the wire."""
        return [dict(layer) for layer in self._layers]

    @property
    def modules(self) -> list[dict[str, Any]] | None:
        """The activation source's module table as sent on the wire (None when it is off)."""
        return None if self._probe is None else [dict(m) for m in self._probe.table]

    @property
    def has_scaler(self) -> bool:
        """Whether a ``GradScaler`` was given (the loss then comes from ``scaler.scale``)."""
        return self._view.present

    @property
    def state(self) -> HookState:
        return self._state

    def recheck(self, fn: RecheckFn | None) -> None:
        """Register the FP32 re-check closure (``None`` turns it off; off by default).

        ``fn()`` must return the scalar loss of the *current* batch: register a new closure
        each step (``mon.recheck(lambda: loss_fn(model(x), y))``, only a reference is kept) or
        once, reading the batch from a variable the loop updates. When a step overflows, the
        hook runs it inside ``scaler.update()`` with autocast off and no scaling, and the step's
        record says whether the NaN/inf persisted in FP32 (data or model) or vanished (dynamic
        range), with the FP32 loss and the layers whose FP32 gradient was non-finite
        (``ampscope.recheck`` has the details and what it leaves untouched).

        How the hook knows a step overflowed, without a sync: ``scaler.step`` already reads
        ``found_inf`` on the host (torch's ``.item()``) and calls ``optimizer.step()`` only when
        it is 0; the hook sees that call through its optimizer wrapper, so a skipped step is
        known on the training thread for free, and steps that did not overflow cost one flag.
        The trade-off: an optimizer that applies the scaler's ``found_inf`` itself (fused or
        capturable Adam on CUDA, ``_step_supports_amp_scaling``) is always called, torch does
        not sync, and the hook does not add one either: its overflow steps are re-checked only
        when ``found_inf`` lives on the CPU (readable without a device sync); on CUDA they are
        not re-checked (``recheck`` null). Deciding on the sender thread instead would need the
        batch and the pre-step weights kept alive until the host copy lands, and the model run
        off the training thread; at the next step boundary the weights could have moved on.

        Cost when registered: nothing on steps that do not overflow; on an overflow step one
        FP32 forward and backward on the training thread. Exceptions from ``fn`` are recorded
        (``status: "failed"``), never raised. Without a scaler no step is skipped, so nothing
        is re-checked.
        """
        if fn is not None and self._zero is not None:
            logger.warning("ampscope: recheck() is off for DeepSpeed engines (the FP32 re-run "
                           "would go through the engine's own scaling and collectives)")
            return
        if fn is not None and _world_size() > 1:
            # The re-check runs the model on one rank: DDP's and FSDP's collectives inside its
            # forward and backward would wait for ranks that are not running it.
            logger.warning("ampscope: recheck() is off under torch.distributed (it would run the "
                           "model's collectives on one rank only)")
            return
        self._recheck_fn = fn

    def record_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Take ``loss`` as this step's (detached, no sync) and return it unchanged:
        ``mon.record_loss(loss).backward()``. For loops without a ``GradScaler``, where the hook
        has no ``scaler.scale(loss)`` to read it from; called more than once in a step (gradient
        accumulation), the step's loss is the sum, as for ``scale``. With a scaler the losses
        come from ``scaler.scale`` and this is ignored (a warning, once): both would count
        every loss twice."""
        if self._state is not HookState.ACTIVE:
            return loss
        if self._zero is not None:  # loss.backward() instead of engine.backward(loss)
            if not self._losses_from_backward:
                try:
                    self._cycle.on_scale(self._zero.loss_share(loss, scale_wrt_gas=True))
                except Exception as exc:
                    self._internal_error("record_loss", exc)
            return loss
        if self._view.present:
            if not self._warned_record_loss:
                self._warned_record_loss = True
                logger.warning("ampscope: record_loss() is ignored with a GradScaler: the losses "
                               "are read from scaler.scale()")
            return loss
        if self._stepped:  # an optimizer stepped since the last record: this loss is the next
            self._end_cycle({})  # step's, so the cycle the others never ended is over
        try:
            self._cycle.on_scale(loss)
        except Exception as exc:
            self._internal_error("record_loss", exc)
        return loss

    def stats(self) -> MonitorStats:
        t = self._transport.stats() if self._transport is not None else None
        return MonitorStats(
            produced=t.produced if t else 0,
            acknowledged=t.acknowledged if t else 0,
            dropped=t.dropped if t else 0,
            pending=t.pending if t else 0,
            failed_requests=t.failed_requests if t else 0,
            internal_errors=self._errors,
            spooled=t.spooled if t else 0,
            replayed=t.replayed if t else 0,
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every record of the steps so far has been sent (acknowledged by the
        server), spooled or counted dropped; False if ``timeout`` seconds (default
        ``close_timeout_s``) pass first, or the monitor is closed or was made with
        ``enabled=False``. For the end of a phase (an epoch, an evaluation, a benchmark's
        segment): it waits for the sender thread, so not inside a training step. Records keep
        flowing afterwards."""
        if self._transport is None or self._state is HookState.CLOSED:
            return False
        return self._transport.flush(self.close_timeout_s if timeout is None else timeout)

    def close(self, timeout: float | None = None) -> None:
        """Unwrap the scaler and optimizers, remove every hook, flush and send the final batch
        (``"final": true``).

        Returns within ``timeout`` seconds (default ``close_timeout_s``) even when the server is
        unreachable; what could not be sent by then is counted as dropped. Idempotent.
        """
        if self._state is HookState.CLOSED:
            return
        self._state = HookState.CLOSED
        try:
            atexit.unregister(self.close)
            self._unwrap()
            self._remove_hooks()
            if self._transport is not None:
                self._transport.close(self.close_timeout_s if timeout is None else timeout)
            if self._group is not None:
                self._group.release(self.close_timeout_s if timeout is None else timeout)
                self._cycle.pending = None
        except Exception as exc:  # close runs from atexit too: never raise
            logger.warning("ampscope close failed: %r", exc)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- wrapping --------------------------------------------------------------------------------
    def _wrap(self) -> None:
        if self._zero is not None:
            self._wrap_methods(self._zero.engine, {"backward": self._wrapped_backward})
            self._wrap_methods(self._zero.optimizer, {"step": self._wrapped_zero_step})
            return
        scaler = self._scaler
        if scaler is None:
            # The step cycle from the optimizers' own step hooks. They live in the optimizer's
            # hook dicts, which its ``__getstate__`` leaves out: a pickled, deep-copied or saved
            # optimizer carries none of them.
            for opt in self._optimizers:
                self._step_handles.append(opt.register_step_pre_hook(self._before_opt_step))
                self._step_handles.append(opt.register_step_post_hook(self._after_opt_step))
            return
        self._wrap_methods(scaler, {
            "scale": self._wrapped_scale,
            "unscale_": self._wrapped_unscale,
            "step": self._wrapped_step,
            "update": self._wrapped_update,
        })

    def _wrap_methods(self, target: Any, hooks: Mapping[str, Callable[..., Any]]) -> None:
        """Each of ``target``'s methods named in ``hooks`` replaced, on this instance only, by a
        ``_Wrapper`` calling the hook (which calls ``self._originals[name]``)."""
        for name, hook in hooks.items():
            self._originals[name] = getattr(target, name)  # bound: chains an earlier wrapper
            if name in vars(target):
                self._previous[name] = vars(target)[name]
            setattr(target, name, _Wrapper(self, target, name, hook))
            self._wrapped.append((target, name))

    def _unwrap(self) -> None:
        for handle in self._step_handles:
            handle.remove()
        self._step_handles = []
        for target, name in self._wrapped:
            mine = vars(target).get(name)
            if not (isinstance(mine, _Wrapper) and mine.monitor is self):
                continue  # someone wrapped on top of us: stay in the chain as a pass-through
            if name in self._previous:
                setattr(target, name, self._previous[name])
            else:
                delattr(target, name)
        self._wrapped = []
        self._misuse.unwatch_all()

    def _remove_hooks(self) -> None:
        if self._order is not None:
            self._order.remove()
        if self._probe is not None:
            self._probe.disarm()

    def _wrapped_scale(self, outputs: Any) -> Any:
        if self._state is HookState.ACTIVE:
            try:
                self._on_scale(outputs)
            except Exception as exc:
                self._internal_error("scale", exc)
        return self._originals["scale"](outputs)

    # DeepSpeed (``zero.py``): the loss from the engine's backward, the cycle from its ZeRO
    # optimizer's step: captured before it, recorded after it (its own overflow and scale).
    def _wrapped_backward(self, loss: Any, *args: Any, **kwargs: Any) -> Any:
        if self._state is HookState.ACTIVE and self._zero is not None:
            try:
                # backward(loss, retain_graph=False, scale_wrt_gas=True)
                by_gas = kwargs.get("scale_wrt_gas", args[1] if len(args) > 1 else True)
                self._cycle.on_scale(self._zero.loss_share(loss, bool(by_gas)))
                self._losses_from_backward = True
            except Exception as exc:
                self._internal_error("backward", exc)
        return self._originals["backward"](loss, *args, **kwargs)

    def _wrapped_zero_step(self, *args: Any, **kwargs: Any) -> Any:
        before: dict[str, Any] | None = None
        if self._state is HookState.ACTIVE:
            if not self._cycle.captured:
                self._capture_guarded(self._optimizers[0])
            try:
                before = self._view.before_update()
            except Exception as exc:
                self._internal_error("step", exc)
        else:
            self._contribute_nothing()
        result = self._originals["step"](*args, **kwargs)
        self._end_cycle(before)
        return result

    def _wrapped_unscale(self, optimizer: torch.optim.Optimizer) -> Any:
        if self._state is HookState.ACTIVE:
            try:
                self._misuse.note_unscale(optimizer, self._view.stage(optimizer))
            except Exception as exc:
                self._internal_error("unscale_", exc)
            if not self._cycle.captured:
                self._capture_guarded(optimizer)
        else:
            self._contribute_nothing()
        return self._originals["unscale_"](optimizer)

    def _wrapped_step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        active = self._state is HookState.ACTIVE
        if active and not self._cycle.captured:
            self._capture_guarded(optimizer)
        elif not active:
            self._contribute_nothing()
        if active and self._recheck_fn is not None:
            try:  # the skip is seen through the optimizer's wrapper (``recheck``): make sure
                self._misuse.watch(optimizer, self._view.enabled)  # it exists (idempotent)
            except Exception as exc:
                self._internal_error("step", exc)
        snapshot = None
        if active and self._swallow is not None and self._cycle.has_block:
            try:
                snapshot = self._swallow.before_step(optimizer)
            except Exception as exc:
                self._internal_error("step", exc)
        self._misuse.in_scaler_step = True
        self._misuse.scaler_stepped = False
        try:
            result = self._originals["step"](optimizer, *args, **kwargs)
        finally:
            self._misuse.in_scaler_step = False
        if active and self._state is HookState.ACTIVE and (
                snapshot or self._recheck_fn is not None):
            try:
                self._after_step(optimizer, snapshot)
            except Exception as exc:
                self._internal_error("step", exc)
        return result

    def _after_step(
        self, optimizer: torch.optim.Optimizer, snapshot: list[Any] | None
    ) -> None:
        """Host-side skip knowledge for the re-check (see ``recheck``), swallowed counts."""
        cycle = self._cycle
        if self._recheck_fn is not None:
            if getattr(optimizer, "_step_supports_amp_scaling", False) and self._view.enabled():
                cycle.skip_unknown = True  # always called: its own kernel applies found_inf
            elif not self._misuse.scaler_stepped:
                cycle.skipped = True
        if snapshot and self._swallow is not None:
            self._swallow.after_step(snapshot)

    def _wrapped_update(self, new_scale: Any = None) -> Any:
        before: dict[str, Any] | None = None
        if self._state is HookState.ACTIVE:
            try:
                before = self._view.before_update(each=per_optimizer(self._optimizers))
            except Exception as exc:
                self._internal_error("update", exc)
        result = self._originals["update"](new_scale)
        self._end_cycle(before)
        return result

    def _end_cycle(self, before: Mapping[str, Any] | None) -> None:
        """The cycle's record (``before``: what ``ScalerView.before_update`` read, None when that
        failed: no record), then the next cycle."""
        if before is not None and self._state is HookState.ACTIVE:
            try:
                self._after_update(before)
            except Exception as exc:
                self._internal_error("update", exc)
        if self._state is not HookState.CLOSED:
            self._updates += 1
            self._cycle.reset()
            self._stepped.clear()
            if self._swallow is not None:
                self._swallow.reset()
            if self._state is HookState.ACTIVE:
                try:
                    self._cycle.start(self._updates, self.activation_every)
                except Exception as exc:
                    self._internal_error("update", exc)

    # Without a scaler a cycle is one step of every watched optimizer: captured before the first
    # one steps (the gradients are final then), recorded once the last has stepped. Where some
    # optimizer steps less often, the next step's loss (``record_loss``) or a second step of
    # one optimizer ends the cycle first.
    def _before_opt_step(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if self._state is not HookState.ACTIVE:
            if self._state is HookState.DISABLED and self._group is not None:
                self._count_cycle_off(optimizer)  # the cycles go on: its peers count on them
            return None
        if id(optimizer) in self._stepped:
            self._end_cycle({})
        # torch passes the hook step()'s own arguments, the optimizer first: a closure given
        # by position is args[1].
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if not callable(closure):
            self._ready_to_step(optimizer)
            return None

        # ``step(closure)`` (LBFGS, Lightning without a scaler): the closure runs the backward
        # inside ``step``, after this hook, so the capture follows the closure's first call.
        def closure_then_capture() -> Any:
            result = closure()
            if self._state is HookState.ACTIVE and not self._cycle.captured:
                self._ready_to_step(optimizer)
            return result

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_capture}
        return (args[0], closure_then_capture, *args[2:]), kwargs

    def _ready_to_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The gradients are final: the capture (once per cycle) and the swallowed snapshot."""
        if not self._cycle.captured:
            self._capture_guarded(optimizer)
        if self._swallow is not None and self._cycle.has_block and self._state is HookState.ACTIVE:
            try:
                self._snapshot = self._swallow.before_step(optimizer)
            except Exception as exc:
                self._internal_error("step", exc)

    def _count_cycle_off(self, optimizer: torch.optim.Optimizer) -> None:
        """A disabled rank in a group, without a scaler: the cycle bookkeeping of
        ``_before_opt_step``/``_after_opt_step`` and an empty share, nothing else."""
        if id(optimizer) in self._stepped:
            self._end_cycle({})
        self._contribute_nothing()

    def _after_opt_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._state is HookState.DISABLED and self._group is not None:
            self._stepped.add(id(optimizer))
            if len(self._stepped) >= len(self._optimizers):
                self._end_cycle({})
            return
        if self._state is not HookState.ACTIVE:
            return
        snapshot, self._snapshot = self._snapshot, None
        if snapshot and self._swallow is not None:
            try:
                self._swallow.after_step(snapshot)
            except Exception as exc:
                self._internal_error("step", exc)
        self._stepped.add(id(optimizer))
        if len(self._stepped) >= len(self._optimizers):
            self._end_cycle({})

    def _internal_error(self, where: str, exc: Exception) -> None:
        self._errors += 1
        if self._errors == 1:
            logger.warning("ampscope hook error in %s (training continues)", where, exc_info=exc)
        if self._errors >= self._max_errors and self._state is HookState.ACTIVE:
            self._state = HookState.DISABLED
            try:
                self._remove_hooks()
                warnings.warn(
                    f"ampscope disabled itself after {self._errors} internal errors "
                    f"(last in {where}: {exc!r}); training is unaffected",
                    AmpscopeWarning,
                    stacklevel=4,
                )
            except Exception:  # warnings turned into errors must not reach training either
                logger.warning("ampscope disabled after %d internal errors", self._errors)

    # -- the step cycle --------------------------------------------------------------------------
    def _on_scale(self, outputs: Any) -> None:
        self._cycle.on_scale(outputs)

    def _capture_guarded(self, optimizer: torch.optim.Optimizer) -> None:
        self._cycle.captured = True  # even on failure: one attempt per cycle
        try:
            if optimizer not in self._optimizers:  # the watched ones are unwrapped already
                optimizer = unwrap_optimizer(optimizer)
                if optimizer not in self._optimizers:
                    self._optimizers.append(optimizer)
            if self._scaler is not None and self._sends:
                self._misuse.watch(optimizer, self._view.enabled)
            if not self._grads_off:
                self._capture(optimizer)
        except Exception as exc:
            self._internal_error("capture", exc)
        self._contribute_nothing()  # if the capture did not get as far as its share

    def _contribute_nothing(self) -> None:
        """Issue this cycle's reductions with an empty share unless it issued its own: a rank
        whose capture failed or whose hook is off never leaves its peers waiting."""
        cycle, group = self._cycle, self._group
        if group is None or cycle.contributed or self._state is HookState.CLOSED:
            return
        cycle.contributed = True
        try:
            layout = cycle.layout(self._updates)
            assert layout is not None
            device = self._params[0].device if self._params else torch.device("cpu")
            group.contribute_nothing(layout.sum_size, layout.max_size, device)
        except Exception as exc:
            logger.warning("ampscope: an empty share failed (%r)", exc)

    def _capture(self, optimizer: torch.optim.Optimizer) -> None:
        self._cycle.capture(optimizer, self._optimizers, self._updates)

    def _after_update(self, before: Mapping[str, Any]) -> None:
        cycle = self._cycle
        if not self._sends:  # a contributing rank: its share is all it makes
            if cycle.pending is not None and self._group is not None:
                self._group.retain(cycle.pending)
            return
        if self._recheck_fn is not None and self._overflowed(before):
            cycle.recheck = run_recheck(self._recheck_fn, self._model, self._params)
        if self._swallow is not None and cycle.has_block:
            cycle.swallowed = self._swallow.block()
        assert self._transport is not None
        # A CPU record left unstacked holds ~60 small tensors (~30 KiB) where a stacked one holds
        # 1 KiB: only while the sender keeps up, so a stalled server cannot make the bounded
        # queue cost 4096 x 30 KiB (DESIGN.md §8: <= 32 MiB with the server down).
        defer = self._transport.backlog() < DEFER_MAX
        record = cycle.build(before, seq=self._seq, step=self._updates, lr=self._lr,
                             misuse=self._misuse.take(), clip=self._clip, defer=defer,
                             optimizers=self._optimizers, stepped=self._stepped)
        self._seq += 1
        self._transport.put(record)

    def _overflowed(self, before: Mapping[str, Any]) -> bool:
        """Whether this cycle's step was skipped, known on the host without a device sync."""
        cycle = self._cycle
        if cycle.skipped:
            return True
        found = before.get("found_inf")
        if cycle.skip_unknown and isinstance(found, torch.Tensor) and found.device.type == "cpu":
            return bool(found.item())  # a CPU tensor: no device to wait for
        return False

    def _lr(self, device: torch.device) -> torch.Tensor | None:
        if not self._optimizers:
            return None
        groups = self._optimizers[0].param_groups
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

    def _encode(self, records: list[dict[str, Any]], include_layers: bool, final: bool) -> bytes:
        """One request body. The module table rides along with the layer table and with every
        batch that carries activation stats, so the server always has it before it needs it."""
        modules = None
        if self._probe is not None and (
                include_layers or any(r.get("activations") is not None for r in records)):
            modules = self._probe.table
        payload = wire.build_payload(
            run=self._run_info,
            attempt=self._attempt_info,
            layers=self._layers if include_layers else None,
            modules=modules,
            records=records,
            final=final,
            client=self._client_accounting(),
        )
        return wire.dumps(payload)

    def _client_accounting(self) -> dict[str, int] | None:
        if self._transport is None:
            return None
        t = self._transport.stats()
        return {
            "produced": t.produced,
            "acknowledged": t.acknowledged,
            "spooled": t.spooled,
            "dropped": t.dropped,
            "replayed": t.replayed,
        }


def watch(
    model: torch.nn.Module,
    scaler: torch.amp.GradScaler | None = None,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> Monitor:
    """Start monitoring ``model`` trained through ``scaler``; returns the ``Monitor``.

    Options (keywords of ``Monitor``): ``run``, ``project``, ``tags``, ``config``, ``run_id``;
    ``server`` (default ``http://127.0.0.1:8765``; ``None``, or ``AMPSCOPE_MODE=offline`` in the
    environment, sends nothing and spools only, when a spool exists); ``sender`` replaces the HTTP
    sender (tests, embedding); ``spool_dir``/``spool_max_bytes`` bound the disk spool;
    ``token`` (default ``$AMPSCOPE_TOKEN``) is the server's ingest token, sent as
    ``Authorization: Bearer``; a server that refuses it (401/403/410) stops the sending with one
    warning and the records go to the spool; ``flush_interval`` (seconds, default 0.5) is how
    often the sender thread wakes to send what is queued: the live latency's main term
    (``bench/live_latency.py``: p95 ~0.5 s at 0.5, ~0.23 s at 0.2) against fewer, larger
    requests and fewer steps slowed by the sender's batch (``transport.DEFAULT_FLUSH_INTERVAL``);
    ``target_format`` (fp16, bf16, fp8_e4m3fn, fp8_e5m2); ``fused``: the per-layer stats'
    compiled one-read kernel (``ampscope.fused``), compiled in the background on the first
    per-layer step while the exact eager path answers; None (default) takes it for models of at
    least ``reductions.FUSE_MIN_ELEMS`` (2^17) gradient elements, True always, False never
    (nothing is compiled). Under ``torch.distributed`` (``WORLD_SIZE`` > 1, a process group
    initialized) call it on every rank: the job is one run, global rank 0 sends it and every
    rank contributes its loss, its non-finite layers and, for DTensor (FSDP2) gradients, its
    shard's partials through the hook's own group (``ampscope.collective``); when not every
    rank calls it within ``dist_timeout_s`` (default 30, waited once, here) rank 0 records
    alone. ``all_ranks=True`` records each rank as a run of its own. A DeepSpeed ZeRO engine is
    watched as itself, ``watch(engine)``, on every rank: no scaler or optimizer to pass
    (``ampscope.zero``).

    What is measured: scalars every step; per-layer stats per ``layer_every`` (an int N, 0 =
    never, or ``{pattern: N}``; see ``ampscope.selection``) over the parameters selected by the
    ``include``/``exclude`` glob patterns; the exponent histogram every ``histogram_every`` steps
    (default 100, 0 = never); module ``grad_output`` stats every ``activation_every`` steps
    (default 50, 0 = never; hooks exist only during the sampled step). ``enabled=False``
    returns an inert monitor.
    """
    return Monitor(model, scaler, optimizer, **options)
