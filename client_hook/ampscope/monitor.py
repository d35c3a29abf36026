"""``Monitor``: wraps one ``GradScaler`` instance and turns each optimizer step into a wire record.

A step cycle runs from one ``scaler.update()`` to the next. ``scaler.scale(loss)`` keeps the
detached loss (summed over gradient accumulation: the step's mean when each micro-batch's loss is
divided by their number). The *first* ``unscale_``/``step`` captures the watched gradients, once
(``unscale_`` → clip → ``step`` and k backward passes still give one capture): still scaled when
the optimizer's stage is READY, else as the loop left them (``captured``: "before_unscale" or
"after_unscale"), in ONE read (``capture.take``: raw norms, or on sampled steps the partials and
histogram), plus sampled activation stats. ``update()`` adds the scales, ``found_inf`` and the
growth tracker; on a GPU all is stacked and copied to the host once, on the CPU handed over as
is, and the sender thread does the arithmetic and encodes.

Without a scaler (BF16, FP32: ``watch(model, None, optimizer)``) the optimizers' step hooks make
the cycle, the loss comes from ``record_loss``, ``found_inf`` says whether a gradient was
non-finite, nothing is ``skipped`` and the stats are judged at scale 1. ``target_format`` is
inferred when not given (``formats.infer_target``). Distributed jobs: one run, rank 0 sends
(``collective.py``); DeepSpeed: ``zero.py``. Misuse (``misuse.py``) is recorded, never raised;
the extras (``recheck``, ``shadow_every``, swallowed updates) cost nothing when off.

Syncs: none on the training thread while ``scaler._scale`` and ``_per_optimizer_states`` exist
(feature-checked); otherwise ``get_scale()`` syncs once per step. Every wrapper (``step.py``)
runs the original exactly once and lets its exceptions through; the hook's own exceptions never
reach training: counted, and after ``max_errors`` the hook disables itself (``AmpscopeWarning``).
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

from ampscope import collective, topology, wire, zero
from ampscope.activations import ActivationProbe
from ampscope.cycle import HookState, ScalerView, StepCycle, unwrap_optimizer
from ampscope.format_probe import FormatsProbe
from ampscope.formats import TargetFormat, infer_target
from ampscope.order import BackwardOrder
from ampscope.recheck import RecheckFn
from ampscope.recipes import RECIPES, Recipe
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
    """Record accounting: ``produced == acknowledged + spooled + dropped + pending``."""

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
    """Watches one model and ``GradScaler``; the options are ``watch``'s."""

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
        formats_every: int = 100,
        formats: Sequence[str] | None = None,
    ) -> None:
        topo = topology.resolve(model, scaler, enabled=enabled, all_ranks=all_ranks,
                                dist_timeout_s=dist_timeout_s, include=include, exclude=exclude)
        self._topology = topo
        enabled, engine, model = topo.enabled, topo.engine, topo.model
        self._layers, self._params = list(topo.layers), list(topo.params)
        # From what the model is (``infer_target``): its parameters' dtype, else whether the
        # loss is scaled (FP16 needs it), said in the run header with the reason.
        scaling = (engine.fp16 if engine is not None
                   else scaler is not None and bool(scaler.is_enabled()))
        self.fmt, self.format_reason = infer_target(target_format, self._params,
                                                    scaling=scaling)
        self.run_id = run_id or str(uuid.uuid4())
        self.attempt_id = str(uuid.uuid4())
        self.layer_every = layer_every
        self.activation_every = max(0, activation_every)
        self.histogram_every = max(0, histogram_every)
        self.formats_every = max(0, formats_every)
        self.recipes = _recipes(formats)
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
        if self.formats_every and self.recipes:
            self._cycle.formats = FormatsProbe(
                model, {id(p): i for i, p in enumerate(self._params)}, self.recipes,
                lambda exc: self._internal_error("formats", exc))
            self._cycle.formats_every = self.formats_every
            self._cycle.formats.arm()  # step 0 is a sample
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
        """The layer table, as sent."""
        return [dict(layer) for layer in self._layers]

    @property
    def modules(self) -> list[dict[str, Any]] | None:
        """The activation module table, as sent (None when off)."""
        return None if self._probe is None else [dict(m) for m in self._probe.table]

    @property
    def has_scaler(self) -> bool:
        """Whether a ``GradScaler`` was given (the loss then comes from ``scaler.scale``)."""
        return self._view.present

    @property
    def state(self) -> HookState:
        return self._state

    def recheck(self, fn: RecheckFn | None) -> None:
        """Register the FP32 re-check closure (``None``, the default, turns it off).

        ``fn()`` returns the *current* batch's scalar loss; on an overflow step the hook reruns
        it inside ``scaler.update()`` without autocast or scaling, and records whether the NaN/inf
        persisted in FP32 or vanished (``ampscope.recheck``). No sync: ``scaler.step`` calls the
        optimizer only when ``found_inf`` was 0, so a skip is known for free; an optimizer applying
        ``found_inf`` itself is re-checked only with ``found_inf`` on the CPU
        (docs/hook-cost.md#why-the-re-check-decides-on-the-training-thread). Cost: an FP32
        forward and backward per overflow step; ``fn``'s errors are recorded, never raised."""
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
        """Take ``loss`` as this step's (detached, no sync) and return it, for loops without a
        ``GradScaler``: ``mon.record_loss(loss).backward()``; a step's calls add up. With a scaler
        it is ignored (one warning): the losses come from ``scaler.scale``."""
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
        """Block until every record so far is acknowledged, spooled or dropped; False after
        ``timeout`` s (default ``close_timeout_s``) or when closed or disabled. Never in a step."""
        if self._transport is None or self._state is HookState.CLOSED:
            return False
        return self._transport.flush(self.close_timeout_s if timeout is None else timeout)

    def close(self, timeout: float | None = None) -> None:
        """Unwrap and unhook, flush and send the final batch, within ``timeout`` s (default
        ``close_timeout_s``) even if the server is unreachable (the rest dropped). Idempotent."""
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
        if self._cycle.formats is not None:
            self._cycle.formats.disarm()

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
        """One request body; the module table rides with the layer table and activation stats."""
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


def _recipes(names: Sequence[str] | None) -> tuple[Recipe, ...]:
    """The recipes ``formats=`` names (None: all of them), or a ValueError naming the unknown."""
    if names is None:
        return tuple(RECIPES.values())
    if isinstance(names, str):
        names = (names,)
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        raise ValueError(f"ampscope: unknown formats {unknown}; known: {', '.join(RECIPES)}")
    return tuple(RECIPES[n] for n in dict.fromkeys(names))


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
    formats_every: int = 100,
    formats: Sequence[str] | None = None,
) -> Monitor:
    """Start monitoring ``model`` trained through ``scaler``; returns the ``Monitor``.

    Keyword options: ``run``, ``project``, ``tags``, ``config``, ``run_id``; ``server`` (default
    ``http://127.0.0.1:8765``; None or ``AMPSCOPE_MODE=offline``: spool only) or a ``sender``;
    ``spool_dir``/``spool_max_bytes``; ``token`` (default ``$AMPSCOPE_TOKEN``; a refusal,
    401/403/410, stops sending with one warning, records go to the spool); ``flush_interval``
    (s: the live latency's main term); ``target_format`` (fp16, bf16, fp8_e4m3fn, fp8_e5m2;
    default inferred); ``fused`` (the one-read kernel, ``ampscope.fused``: a C loop on the
    CPU, which also reads every step's norms, in the ``GradScaler``'s unscale where it can do
    that unscale as torch does; None from ``reductions.FUSE_MIN_ELEMS`` gradient elements, True
    always, False never, torch's ops only).
    Under ``torch.distributed`` call it on every rank: one run, rank 0 sends, ranks missing
    after ``dist_timeout_s`` leave rank 0 alone (``all_ranks=True``: a run per rank). A
    DeepSpeed engine: ``watch(engine)`` on every rank.

    Measured: scalars every step; per-layer stats per ``layer_every`` (N, 0 = never, or
    ``{pattern: N}``) over the ``include``/``exclude`` selection; the exponent histogram every
    ``histogram_every`` steps; module ``grad_output`` stats every ``activation_every`` steps
    (hooks only during that step); with a re-check closure, every ``shadow_every``-th applied step
    again in FP32, compared per layer (``ampscope.shadow``); every ``formats_every`` steps (0:
    never) what the FP8/MX/NVFP4 ``formats`` (recipe names, ``ampscope.recipes.RECIPES``; None:
    all, ``()``: none) would do to each ``Linear``/``Conv`` module's input, weight and output
    gradient (``ampscope.format_probe``). ``enabled=False``: an inert monitor.
    """
    return Monitor(
        model, scaler, optimizer, run=run, server=server, project=project, tags=tags,
        config=config, run_id=run_id, target_format=target_format, layer_every=layer_every,
        include=include, exclude=exclude, activation_every=activation_every,
        histogram_every=histogram_every, enabled=enabled, close_timeout_s=close_timeout_s,
        sender=sender, spool_dir=spool_dir, spool_max_bytes=spool_max_bytes,
        max_errors=max_errors, flush_interval=flush_interval, token=token, fused=fused,
        all_ranks=all_ranks, dist_timeout_s=dist_timeout_s, shadow_every=shadow_every,
        formats_every=formats_every, formats=formats)
