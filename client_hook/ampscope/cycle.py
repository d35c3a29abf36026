"""What the monitor measures within one update cycle, and the step record it becomes.

``StepCycle`` holds the device tensors of the cycle: the remembered loss, the capture (ONE read
of the gradients at the first ``unscale_``/``step``, ``capture.take``: raw norms, or the raw
partials and on histogram steps the exponent histogram from the same read), the sampled
activation block, the swallowed fractions and the FP32 re-check block set by the monitor. At
``update()`` (``build``) they go into the record with the scaler's scalars as one list of parts,
unfinalized: every division, norm and fraction is computed on the sender thread
(``capture.finish``). See ``ampscope.monitor`` for the lifecycle and the sync guarantees; nothing
here reads a device value.

One shape, two transfers. On a GPU the parts are stacked into ONE float64 tensor and copied to
the host once (``non_blocking``, an event for the sender thread). On the CPU there is no copy to
make, only kernels to launch, each costing the training thread microseconds: the parts go to the
record as they are (``record.Parts``) and the sender thread reads them. The training thread
copies only what the loop may change in place afterwards (the scale and growth tracker
``update()`` rewrites; the loss and a tensor lr are taken as copies from the start); every other
part is a tensor this cycle created. Past a backlog of queued records (``monitor.DEFER_MAX``) the
CPU stacks too, as a GPU does: memory stays bounded.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ampscope.activations import ActivationProbe
from ampscope.capture import Taken, take
from ampscope.collective import Group, Pending, local
from ampscope.devices import to_device
from ampscope.histogram import NUM_BINS
from ampscope.misuse import ClipHeuristic
from ampscope.order import BackwardOrder
from ampscope.record import SCALARS, OptimizerSlots, Parts, Sections, Slot, StepRecord
from ampscope.reductions import GradStats
from ampscope.scalerview import ScalerView
from ampscope.selection import Cadence
from ampscope.shards import Layout, pack

__all__ = ["StepCycle", "per_optimizer"]


def per_optimizer(optimizers: Sequence[torch.optim.Optimizer]) -> bool:
    """Whether records name each optimizer's skip and each group's lr (the wire's
    ``optimizers``): with several optimizers or parameter groups. One optimizer with one group
    is the record's own ``skipped`` and ``lr``, and costs nothing more per step."""
    return len(optimizers) > 1 or any(len(o.param_groups) > 1 for o in optimizers)


class StepCycle:
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
    ) -> None:
        self._params = params
        # Where the gradients are read from: ``.grad`` (a DTensor's local shard), or a framework
        # that keeps them elsewhere (DeepSpeed ZeRO's partitions, ``zero.ZeroEngine.reader``).
        self._grads = grads
        # The layers' sizes for ``partials.finalize`` on the sender thread: one tensor, shared.
        # ``numels``: the layers' own where a parameter is only this rank's piece (FSDP1).
        self._numel_t = torch.tensor(
            list(numels) if numels is not None else [p.numel() for p in params],
            dtype=torch.float64)
        self._stats = stats
        self._cadence = cadence
        self._histogram_every = histogram_every
        self._view = view
        self.probe = probe
        self.order = order
        # Under torch.distributed (``collective.py``): the hook's group, whether the gradients
        # are this rank's shards (FSDP, ZeRO), and whether this rank sends (rank 0) or only
        # contributes.
        self.group = group
        self.sharded = sharded
        self.sends = sends
        # FSDP1's flat parameters (``collective.FlatShards.flat_only``), ZeRO-3 offloaded: read
        # for the share's finiteness only (norms), never sent as the layers' statistics.
        self.pieces_only = pieces_only
        self._last_update: float | None = None
        self._nan: torch.Tensor | None = None
        self.reset()

    def reset(self) -> None:
        self.captured = False
        # The capture's raw device tensors (``capture.take``).
        self._parts: list[torch.Tensor] | None = None
        self._taken: Taken | None = None
        self._has_block = False
        self._acts: torch.Tensor | None = None
        self._loss_sum: torch.Tensor | None = None
        # Host-side knowledge of the skip (``Monitor.recheck``): set after each ``scaler.step``.
        self.skipped = False
        self.skip_unknown = False
        self.recheck: torch.Tensor | str | None = None  # the result block, or the error
        self.swallowed: torch.Tensor | None = None
        # This cycle's cross-rank reductions: issued (or an empty share, ``contribute_nothing``)
        # at most once, and what they will reduce into.
        self.contributed = False
        self.pending: Pending | None = None

    @property
    def has_block(self) -> bool:
        """Whether this cycle's capture took the per-layer statistics block."""
        return self._has_block

    def start(self, step: int, activation_every: int) -> None:
        """After ``update()``: stop learning the backward order, arm a sampled step's probe."""
        if self.order is not None:
            self.order.end_cycle()
        if self.probe is not None and activation_every and step % activation_every == 0:
            self.probe.arm()

    def on_scale(self, outputs: Any) -> None:
        if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
            # A copy even of a float64 loss: on the CPU the record reads it later (``build``).
            # Any shape of one element; ``build`` makes it 0-d where it stacks on the device.
            loss = outputs.detach().to(torch.float64, copy=True)
            self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss

    def _reads(self, step: int) -> tuple[bool, bool]:
        """(per-layer statistics, histogram): what the capture of ``step`` reads. A DDP peer
        (same gradients as rank 0, sends nothing) reads only the norms its share needs."""
        per_layer = self._cadence.due(step)
        histogram = bool(self._histogram_every and self._params
                         and step % self._histogram_every == 0)
        if self.pieces_only or (self.group is not None and not self.sends
                                and not self.sharded):
            return False, False
        return per_layer, histogram

    def layout(self, step: int) -> Layout | None:
        """The shape of this step's share of the reductions (None outside a group): the same
        on every rank, which is what keeps their collectives matched."""
        if self.group is None:
            return None
        per_layer, histogram = self._reads(step)
        return Layout(len(self._params), self.group.world_size, self.sharded,
                      stats=per_layer or histogram, histogram_bins=NUM_BINS if histogram else 0)

    def capture(
        self, optimizer: torch.optim.Optimizer, optimizers: Sequence[torch.optim.Optimizer],
        step: int,
    ) -> None:
        """The training thread's whole capture: one read of the gradients (``capture.take``),
        its share of the cross-rank reductions when in a group (issued, never waited for), and
        the sampled activation block when the probe is armed."""
        if self._grads is not None:
            grads = self._grads(self._params)
        else:
            grads = [p.grad for p in self._params]
            if self.sharded:  # each rank reads its own shard; the reductions merge them
                grads = [local(g) for g in grads]
        scaled = self._view.scaled_state(optimizer, optimizers, self._params)
        scale = self._view.scale_in_effect()
        per_layer, histogram = self._reads(step)
        self._has_block = per_layer and self.sends
        # Sharded norms are summed across ranks as squares: they keep the float64 read.
        parts, taken = take(self._stats, grads, scale, scaled, per_layer=per_layer,
                            histogram=histogram,
                            checked=self._stats.exact_norms and not self.sharded)
        layout = self.layout(step)
        if self.group is not None and layout is not None:
            kept, sums, maxes = pack(parts, layout, self.group.rank, self._loss_sum)
            self.contributed = True  # before issuing: a failure must not make it issue twice
            self.pending = self.group.reduce(sums, maxes)
            parts = [*kept, sums] if maxes is None else [*kept, sums, maxes]
            taken = dataclasses.replace(taken, layout=layout)
        self._parts, self._taken = parts, taken
        if self.probe is not None and self.probe.armed:
            self._acts = self.probe.collect(scale, taken.device)

    def build(
        self,
        before: Mapping[str, Any],
        *,
        seq: int,
        step: int,
        lr: Callable[[torch.device], torch.Tensor | None],
        misuse: list[dict[str, str]] | None,
        clip: ClipHeuristic,
        defer: bool = True,
        optimizers: Sequence[torch.optim.Optimizer] = (),
        stepped: frozenset[int] | set[int] = frozenset(),
    ) -> StepRecord:
        """The cycle's record, after the original ``update()`` ran: the scalars and the blocks
        in one list (``record.Parts``), stacked into ONE float64 tensor and copied to the host
        once on a GPU, handed over as they are on the CPU (``defer``; False stacks there too)."""
        now = time.perf_counter()
        duration = None if self._last_update is None else now - self._last_update
        self._last_update = now
        device = self._device(before)
        # A pending reduction is read by the sender thread once it finished: never stacked here.
        host = (defer or self.pending is not None) and device.type == "cpu"
        if self._nan is None or self._nan.device != device:
            self._nan = torch.full((), float("nan"), dtype=torch.float64, device=device)
        nan = self._nan  # only ever stacked (copied), never written
        (scale_before, scale_after, growth, found_inf), absent, from_scale = (
            self._view.after_update(before, device, snapshot=host))
        loss = nan
        if self._loss_sum is None:
            absent.add("loss")
        else:
            loss = self._loss_sum
        if self._taken is None:
            absent.add("grad_norm")
        rate = lr(device)
        if rate is None:
            rate = nan
            absent.add("lr")
        # grad_norm's slot stays NaN: the sender thread computes it (``capture.finish``).
        scalars = [scale_before, scale_after, growth, found_inf, loss, nan, rate]
        assert len(scalars) == len(SCALARS)
        parts: Parts = [scalars, *(self._parts or ())]
        parts += [b for b in (self._acts, self.swallowed) if b is not None]
        recheck_block = self.recheck if isinstance(self.recheck, torch.Tensor) else None
        if recheck_block is not None:
            parts.append(recheck_block)
        slots, opt_values = self._optimizer_slots(before, optimizers, stepped, device)
        if opt_values:
            parts.append(opt_values)
        pending = self.pending
        if pending is not None and not host:  # CUDA: the copy queued behind the reduction
            pending.wait_stream()
            pending = None
        values, ready = (parts, None) if host else _one_copy(parts, device)
        sections = Sections(
            num_layers=len(self._params),
            taken=self._taken,
            layers=self._has_block,
            modules=0 if self._acts is None or self.probe is None else len(self.probe.table),
            swallowed=self.swallowed is not None,
            recheck=recheck_block is not None,
            optimizer_values=len(opt_values),
        )
        if self.order is not None:
            self.order.end_cycle()
        return StepRecord(
            seq=seq,
            step=step,
            wall_time=time.time(),
            duration=duration,
            values=values,
            ready=ready,
            absent=frozenset(absent),
            sections=sections,
            found_inf_from_scale=from_scale,
            captured=self._captured_kind(),
            misuse=misuse,
            order=self.order.order() if self.order is not None else None,
            clip=clip,
            recheck_error=self.recheck if isinstance(self.recheck, str) else None,
            numels=self._numel_t,
            found_inf_from_grads=not self._view.present,
            skipped_host=self._view.host_skip(),
            pending=pending,
            optimizers=slots,
            pieces_only=self.pieces_only,
        )

    def _optimizer_slots(
        self, before: Mapping[str, Any], optimizers: Sequence[torch.optim.Optimizer],
        stepped: frozenset[int] | set[int], device: torch.device,
    ) -> tuple[tuple[OptimizerSlots, ...] | None, list[torch.Tensor]]:
        """Each watched optimizer's skip and every parameter group's lr (the wire's
        ``optimizers``): host floats where the loop keeps them so (no op), 0-d copies of tensor
        lrs and the scaler's per-optimizer found_inf (no copy: ``ScalerView.before_update``),
        read on the sender thread. None unless ``per_optimizer``."""
        if not per_optimizer(optimizers):
            return None, []
        each: Mapping[int, torch.Tensor] = before.get("found_inf_each", {})
        values: list[torch.Tensor] = []

        def slot(t: torch.Tensor) -> Slot:
            values.append(t if t.dim() == 0 else t.reshape(()))
            return Slot(len(values) - 1)

        slots = []
        for opt in optimizers:
            skipped: Slot | bool | None
            if id(opt) in each:
                skipped = slot(each[id(opt)])
            elif (decided := self._view.host_skip()) is not None:
                skipped = decided  # DeepSpeed: one decision for the step, known on the host
            elif self._view.present:  # a disabled scaler skips nothing; absent: not stepped
                skipped = False if not self._view.enabled() else None
            else:
                skipped = False if id(opt) in stepped else None
            lrs: list[Slot | float | None] = []
            for group in opt.param_groups:
                lr = group.get("lr")
                if isinstance(lr, torch.Tensor):  # a CPU lr reaches a CUDA record unsynced
                    lr64 = lr.detach().to(torch.float64, copy=True)
                    lrs.append(slot(lr64 if lr64.device == device else to_device(lr64, device)))
                else:
                    lrs.append(None if lr is None else float(lr))
            slots.append(OptimizerSlots(skipped, tuple(lrs)))
        return tuple(slots), values

    def _captured_kind(self) -> str | None:
        if self._taken is None:
            return None
        return "before_unscale" if self._taken.all_scaled and self._params else "after_unscale"

    def _device(self, before: Mapping[str, Any]) -> torch.device:
        if "scale" in before:
            return torch.device(before["scale"].device)
        if self._taken is not None:
            return self._taken.device
        return torch.device("cpu")


def _one_copy(parts: Parts, device: torch.device) -> tuple[torch.Tensor, Any]:
    """Every part stacked into ONE float64 tensor (promoting the scaler's float32/int32 scalars
    and the float32 norms: no conversion op per part), then ONE host copy: on CUDA
    ``non_blocking`` into pinned memory, with the event the sender thread waits on."""
    flat = [(p if isinstance(p, torch.Tensor) else
             torch.stack([t.reshape(()).to(device) for t in p])).reshape(-1).to(device)
            for p in parts]
    values = flat[0] if len(flat) == 1 else torch.cat(flat)
    values = values.to(torch.float64)
    if values.is_cuda:
        host = torch.empty(values.shape, dtype=torch.float64, pin_memory=True)
        host.copy_(values, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return host, ready
    if values.device.type != "cpu":
        values = values.to("cpu")
    return values, None
