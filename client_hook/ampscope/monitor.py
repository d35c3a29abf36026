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
optimizer applied the step. The statistics are judged against ``target_format`` at scale 1;
without one it is inferred from the model (``formats.infer``: FP16/BF16 parameters, else fp16
with a loss scale and bf16 without) and the run says why (``target_format_reason``).

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
(``recheck.py``; how the overflow is known without a sync: ``Monitor.recheck``); with
``shadow_every=N`` (wire v6) the same closure runs every N-th applied step in FP32 before the
optimizer moves a weight, compared per layer with the AMP gradients (``shadow.py``); and for models
with FP16/BF16 parameters ``scaler.step`` is bracketed on layer-stat steps to count swallowed
updates (``swallowed.py``); each adds its device block to the step's one host copy, and a
model without low-precision parameters that registers no closure pays for none of them.

Syncs: none added on the training thread when ``scaler._scale`` and ``_per_optimizer_states`` exist
(feature-checked). Without them the public fallback calls ``get_scale()`` (a sync) per step.

Where a step enters the hook is one seam (``step.py``): a ``StepSource`` (the scaler's methods
wrapped per instance, never the class; the optimizers' step hooks; the DeepSpeed engine) driving
one ``cycle.StepCycle``. Where the gradients live (single process, DDP, FSDP, ZeRO) is resolved
once into a ``topology.Topology``. Every wrapper runs the original exactly once and lets its
exceptions through, but an exception in the hook's own code never reaches training: it is
counted and, after ``max_errors`` of them, the hook disables itself with one
``AmpscopeWarning``.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import time
import uuid
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ampscope import collective, formats, topology, wire, zero
from ampscope.activations import ActivationProbe
from ampscope.cycle import HookState, ScalerView, StepCycle, unwrap_optimizer
from ampscope.formats import TargetFormat
from ampscope.order import BackwardOrder
from ampscope.recheck import RecheckFn
from ampscope.reductions import GradStats
from ampscope.run_view import DEFAULT_SERVER, RunView
from ampscope.selection import Cadence, LayerEvery
from ampscope.step import OptimizerSource, ScalerSource, StepSource, ZeroSource
from ampscope.swallowed import SwallowProbe
from ampscope.transport import DEFAULT_FLUSH_INTERVAL, HttpSender, Sender, Transport

__all__ = ["AmpscopeWarning", "HookState", "Monitor", "MonitorStats", "unwrap_optimizer",
           "watch"]

logger = logging.getLogger("ampscope")


class AmpscopeWarning(RuntimeWarning):
    """The hook disabled itself; training is unaffected."""


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
        shadow_every: int = 0,
    ) -> None:
        topo = topology.resolve(model, scaler, enabled=enabled, all_ranks=all_ranks,
                                dist_timeout_s=dist_timeout_s, include=include, exclude=exclude)
        self._topology = topo
        enabled, engine, model = topo.enabled, topo.engine, topo.model
        self._layers, self._params = list(topo.layers), list(topo.params)
        # From what the model is (formats.infer): its parameters' dtype, else whether the loss
        # is scaled (FP16 needs it), said in the run header with the reason.
        scaling = (engine.fp16 if engine is not None
                   else scaler is not None and bool(scaler.is_enabled()))
        self.fmt, self.format_reason = formats.infer(target_format, self._params,
                                                     scaling=scaling)
        self.run_id = run_id or str(uuid.uuid4())
        self.attempt_id = str(uuid.uuid4())
        self.layer_every = layer_every
        self.activation_every = max(0, activation_every)
        self.histogram_every = max(0, histogram_every)
        self.close_timeout_s = close_timeout_s
        self._model = model
        self._scaler = scaler
        self._view = ScalerView(scaler) if engine is None else zero.ZeroView(engine)
        optimizers: list[torch.optim.Optimizer] = []
        if engine is not None:  # the torch optimizer the ZeRO one steps: the lrs
            optimizers = [engine.torch_optimizer or engine.optimizer]
        elif optimizer is not None:
            # One optimizer (a framework's wrapper too: DeepSpeed's ZeRO optimizer holds the
            # torch one as ``.optimizer``), or a sequence of them.
            given = [optimizer] if not isinstance(optimizer, Sequence) else list(optimizer)
            optimizers = [unwrap_optimizer(o) for o in given]
            for opt in optimizers:
                if not isinstance(opt, torch.optim.Optimizer):
                    raise ValueError(f"ampscope: {type(opt).__name__} is not a torch optimizer "
                                     "and holds none as .optimizer")
        if scaler is None and not optimizers and engine is None:
            raise ValueError("without a GradScaler ampscope takes each step from the optimizer: "
                             "pass it, ampscope.watch(model, None, optimizer)")
        self._cadence = Cadence(layer_every, [layer["name"] for layer in self._layers])
        # A disabled scaler reports no found_inf, which alone tells a float32 overflow of the
        # every-step norms from an inf gradient (record.StepRecord.to_wire): exact norms there.
        # A shard's absent gradient stands for its own piece of zeros: local sizes there.
        numels = (engine.piece_numels(self._params) if engine is not None
                  else [_local_numel(p) for p in self._params])
        self._stats = GradStats(self.fmt, numels, exact_norms=not self._view.on,
                                fused=False if not enabled or topo.sharded else fused)
        self._max_errors = max_errors
        self._errors = 0
        self._order: BackwardOrder | None = None
        self._probe: ActivationProbe | None = None
        self._cycle = StepCycle(self._params, self._stats, self._cadence, self.histogram_every,
                                self._view, None, None,
                                numels=[layer["numel"] for layer in self._layers],
                                grads=None if engine is None else engine.reader(self._params),
                                group=topo.group, sharded=topo.sharded, sends=topo.sends,
                                pieces_only=topo.pieces_only, grads_off=topo.grads_off,
                                optimizers=optimizers, activation_every=self.activation_every,
                                on_error=self._internal_error)
        self._cycle.model = model
        self._cycle.recheck_low = self.fmt.dtype
        self.shadow_every = max(0, shadow_every)
        """Every N-th applied step is an FP32 shadow step (0: off; ``ampscope.shadow``)."""
        self._cycle.shadow_every = self.shadow_every
        if (self._view.on and engine is None and topo.group is None and not topo.sharded
                and topology.world_size() == 1):
            # Exact clip-before-unscale_ counting (misuse.py) in place of the heuristic; under
            # torch.distributed DDP writes the gradients after backward itself.
            self._cycle.count_writes = True
            self._cycle.clip = None
        # DeepSpeed updates its own FP32 partitions, not the parameters the probe would watch.
        self._cycle.swallow = SwallowProbe.for_params(self._params) if engine is None else None
        self._run_info: dict[str, Any] = {
            "id": self.run_id,
            "project": project,
            "name": run if run is not None else f"run-{self.run_id[:8]}",
            "tags": [str(t) for t in tags],
            "config": wire.jsonable(dict(config or {})),
            "host": socket.gethostname(),
            "rank": topo.rank,
            "world_size": topo.world_size,
            "target_format": self.fmt.name,
            "target_format_reason": self.format_reason,
        }
        self._attempt_info: dict[str, Any] = {
            "id": self.attempt_id, "pid": os.getpid(), "started_at": time.time()}
        self._warned_record_loss = False
        self._source: StepSource
        if engine is not None:
            self._source = ZeroSource(self._cycle, engine, self._view)
        elif scaler is not None:
            self._source = ScalerSource(self._cycle, scaler, self._view)
        else:
            self._source = OptimizerSource(self._cycle)
        self._state = HookState.ACTIVE if enabled else HookState.DISABLED
        self._transport: Transport | None = None
        self._server: str | None = None
        """Where the run page is (`show`): the server records go to, None when offline."""
        if not enabled:
            return
        if not topo.sends:  # a contributing rank: the step cycle and its share, nothing sent
            self._source.attach()
            atexit.register(self.close)
            _MONITORS.add(self)
            return
        if os.environ.get("AMPSCOPE_MODE", "").strip().lower() == "offline":
            server = None
        self._server = server if sender is None else None
        if sender is None and server is not None:
            sender = HttpSender(server, token=token or os.environ.get("AMPSCOPE_TOKEN") or None)
        self._transport = Transport(sender, self._encode, spool_dir=spool_dir,
                                    spool_max_bytes=spool_max_bytes, flush_interval=flush_interval)
        self._cycle.outlet = self._transport
        self._order = BackwardOrder(self._params)
        if self.activation_every:
            self._probe = ActivationProbe(model, self.fmt,
                                          lambda exc: self._internal_error("activation", exc))
            self._probe.arm()  # step 0 is a sample
        self._cycle.probe, self._cycle.order = self._probe, self._order
        self._source.attach()
        atexit.register(self.close)
        _MONITORS.add(self)

    @property
    def _state(self) -> HookState:
        """The hook's state lives on the step cycle, which every source reads on every call."""
        return self._cycle.state

    @_state.setter
    def _state(self, state: HookState) -> None:
        self._cycle.state = state

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
        if fn is not None and self._topology.engine is not None:
            logger.warning("ampscope: recheck() is off for DeepSpeed engines (the FP32 re-run "
                           "would go through the engine's own scaling and collectives)")
            return
        if fn is not None and topology.world_size() > 1:
            # The re-check runs the model on one rank: DDP's and FSDP's collectives inside its
            # forward and backward would wait for ranks that are not running it.
            logger.warning("ampscope: recheck() is off under torch.distributed (it would run the "
                           "model's collectives on one rank only)")
            return
        self._cycle.recheck_fn = fn

    def record_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Take ``loss`` as this step's (detached, no sync) and return it unchanged:
        ``mon.record_loss(loss).backward()``. For loops without a ``GradScaler``, where the hook
        has no ``scaler.scale(loss)`` to read it from; called more than once in a step (gradient
        accumulation), the step's loss is the sum, as for ``scale``. With a scaler the losses
        come from ``scaler.scale`` and this is ignored (a warning, once): both would count
        every loss twice."""
        if self._state is not HookState.ACTIVE:
            return loss
        source = self._source
        if isinstance(source, ZeroSource):  # loss.backward() instead of engine.backward(loss)
            if not source.losses_from_backward:
                try:
                    self._cycle.on_scale(source.zero.loss_share(loss, scale_wrt_gas=True))
                except Exception as exc:
                    self._internal_error("record_loss", exc)
            return loss
        if self._view.present:
            if not self._warned_record_loss:
                self._warned_record_loss = True
                logger.warning("ampscope: record_loss() is ignored with a GradScaler: the losses "
                               "are read from scaler.scale()")
            return loss
        if self._cycle.stepped:  # an optimizer stepped since the last record: this loss is the
            self._cycle.end({})  # next step's, so the cycle the others never ended is over
        try:
            self._cycle.on_scale(loss)
        except Exception as exc:
            self._internal_error("record_loss", exc)
        return loss

    def show(self, height: int = 720) -> RunView:
        """This run's page for a notebook cell (Jupyter renders it inline: `run_view.py`)."""
        return RunView(self._server, self.run_id, height)

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
            self._source.detach()
            self._remove_hooks()
            if self._transport is not None:
                self._transport.close(self.close_timeout_s if timeout is None else timeout)
            group = self._topology.group
            if group is not None:
                group.release(self.close_timeout_s if timeout is None else timeout)
                self._cycle.pending = None
        except Exception as exc:  # close runs from atexit too: never raise
            logger.warning("ampscope close failed: %r", exc)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _remove_hooks(self) -> None:
        if self._order is not None:
            self._order.remove()
        if self._probe is not None:
            self._probe.disarm()

    def _internal_error(self, where: str, exc: Exception) -> None:
        self._errors += 1
        if self._errors == 1:
            logger.warning("ampscope hook error in %s (training continues)", where, exc_info=exc)
        if self._errors >= self._max_errors and self._state is HookState.ACTIVE:
            self._state = HookState.DISABLED
            try:
                self._remove_hooks()  # the sources stay: a disabled rank still shares (empty)
                warnings.warn(
                    f"ampscope disabled itself after {self._errors} internal errors "
                    f"(last in {where}: {exc!r}); training is unaffected",
                    AmpscopeWarning,
                    stacklevel=4,
                )
            except Exception:  # warnings turned into errors must not reach training either
                logger.warning("ampscope disabled after %d internal errors", self._errors)

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
    shadow_every: int = 0,
) -> Monitor:
    """Start monitoring ``model`` trained through ``scaler``; returns the ``Monitor``.

    Options (keywords only, the same as ``Monitor``'s): ``run``, ``project``, ``tags``,
    ``config``, ``run_id``;
    ``server`` (default ``http://127.0.0.1:8765``; ``None``, or ``AMPSCOPE_MODE=offline`` in the
    environment, sends nothing and spools only, when a spool exists); ``sender`` replaces the HTTP
    sender (tests, embedding); ``spool_dir``/``spool_max_bytes`` bound the disk spool;
    ``token`` (default ``$AMPSCOPE_TOKEN``) is the server's ingest token, sent as
    ``Authorization: Bearer``; a server that refuses it (401/403/410) stops the sending with one
    warning and the records go to the spool; ``flush_interval`` (seconds, default 0.5) is how
    often the sender thread wakes to send what is queued: the live latency's main term
    (``bench/live_latency.py``: p95 ~0.5 s at 0.5, ~0.23 s at 0.2) against fewer, larger
    requests and fewer steps slowed by the sender's batch (``transport.DEFAULT_FLUSH_INTERVAL``);
    ``target_format`` (fp16, bf16, fp8_e4m3fn, fp8_e5m2; default: inferred from the parameters'
    dtype and the loss scaling, ``formats.infer``); ``fused``: the per-layer stats'
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
    (default 50, 0 = never; hooks exist only during the sampled step); ``shadow_every`` (default
    0 = never): while a re-check closure is registered (``Monitor.recheck``), every N-th applied
    step is run once more in FP32 from the same weights and batch, each layer's gradient compared
    with the AMP step's (``ampscope.shadow``). ``enabled=False`` returns an inert monitor.
    """
    return Monitor(
        model, scaler, optimizer, run=run, server=server, project=project, tags=tags,
        config=config, run_id=run_id, target_format=target_format, layer_every=layer_every,
        include=include, exclude=exclude, activation_every=activation_every,
        histogram_every=histogram_every, enabled=enabled, close_timeout_s=close_timeout_s,
        sender=sender, spool_dir=spool_dir, spool_max_bytes=spool_max_bytes,
        max_errors=max_errors, flush_interval=flush_interval, token=token, fused=fused,
        all_ranks=all_ranks, dist_timeout_s=dist_timeout_s, shadow_every=shadow_every)
