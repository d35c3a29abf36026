"""What the monitor measures within one update cycle, and the step record it becomes.

``StepCycle`` holds the device tensors of the cycle (the remembered loss, the capture at the first
``unscale_``/``step``, the sampled histogram and activation blocks, the swallowed fractions and
the FP32 re-check block set by the monitor) and, at ``update()``, stacks
them with the scaler's scalars into the ONE float64 tensor copied to the host (``build``). See
``ampscope.monitor`` for the lifecycle and the sync guarantees; nothing here reads a device value.

On the CPU there is no copy to make, only kernels to launch, and each costs the training thread
microseconds: there ``build`` hands the pieces themselves to the record (``record.Parts``) and
the sender thread stacks them. The training thread copies only what the loop may change in place
afterwards (the scale and growth tracker ``update()`` rewrites; the loss and a tensor lr are taken
as copies from the start); every other piece is a tensor this cycle created. Past a backlog of
queued records (``monitor.DEFER_MAX``) it stacks here again, as on a GPU: memory stays bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ampscope.activations import ActivationProbe
from ampscope.histogram import exponent_histogram
from ampscope.misuse import ClipHeuristic
from ampscope.order import BackwardOrder
from ampscope.record import SCALARS, Parts, Sections, StepRecord
from ampscope.reductions import GradStats
from ampscope.scalerview import ScalerView
from ampscope.selection import Cadence

__all__ = ["StepCycle"]


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
    ) -> None:
        self._params = params
        self._numels = [p.numel() for p in params]
        self._stats = stats
        self._cadence = cadence
        self._histogram_every = histogram_every
        self._view = view
        self.probe = probe
        self.order = order
        self._last_update: float | None = None
        self._nan: torch.Tensor | None = None
        self.reset()

    def reset(self) -> None:
        self.captured = False
        self._captured_kind: str | None = None
        self._head: torch.Tensor | None = None  # [global norm, per-layer norms or stats block]
        # Set instead of _head when the capture took only the raw per-layer norms
        # (GradStats.raw_layer_norms), unstacked: the global norm and the division by the scale
        # are left to the sender thread. _raw_norms: whether the raw norms are scaled.
        self._raw: list[torch.Tensor] | None = None
        self._raw_norms: bool | None = None
        self._captured_device: torch.device | None = None
        self._has_block = False
        self._float32_norms = False
        self._hist: torch.Tensor | None = None
        self._acts: torch.Tensor | None = None
        self._loss_sum: torch.Tensor | None = None
        self._loss_n = 0
        # Host-side knowledge of the skip (``Monitor.recheck``): set after each ``scaler.step``.
        self.skipped = False
        self.skip_unknown = False
        self.recheck: torch.Tensor | str | None = None  # the result block, or the error
        self.swallowed: torch.Tensor | None = None

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
            self._loss_n += 1

    def capture(
        self, optimizer: torch.optim.Optimizer, optimizers: Sequence[torch.optim.Optimizer],
        step: int,
    ) -> None:
        grads = [p.grad for p in self._params]
        scaled = self._view.scaled_state(optimizer, optimizers, self._params)
        scale = self._view.scale_in_effect()
        all_scaled = scaled if isinstance(scaled, bool) else bool(scaled) and all(scaled)
        self._captured_kind = "before_unscale" if all_scaled else "after_unscale"
        self._has_block = self._cadence.due(step)
        if self._has_block:
            self._head = self._stats.layer_stats(grads, scale, scaled)
            device = self._head.device
        else:
            direct = self._stats.raw_layer_norms(grads, scaled)
            if direct is not None:
                self._raw, self._raw_norms = direct
                device = self._raw[0].device
                if (scale.device if isinstance(scale, torch.Tensor) else device).type != "cpu":
                    try:  # stacked here: the step's one host copy is made on this thread
                        self._head = torch.stack(self._raw)
                        self._raw = None
                    except RuntimeError:  # gradients on several devices
                        self._raw, self._raw_norms = None, None
            if self._raw is None and self._head is None:
                self._head = self._stats.grad_norms(grads, scale, scaled)
                device = self._head.device
            self._float32_norms = self._stats.float32_norms
        self._captured_device = device
        if self._histogram_every and step % self._histogram_every == 0 and self._params:
            self._hist = exponent_histogram(grads, scale, scaled, self._numels).reshape(-1)
        if self.probe is not None and self.probe.armed:
            self._acts = self.probe.collect(scale, device)

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
    ) -> StepRecord:
        """The cycle's record, after the original ``update()`` ran. ``defer``: on the CPU, leave
        the stacking to the sender thread (``record.Parts``); False stacks here, as on a GPU."""
        now = time.perf_counter()
        duration = None if self._last_update is None else now - self._last_update
        self._last_update = now
        device = self._device(before)
        host = defer and device.type == "cpu"
        f64 = torch.float64
        if self._nan is None or self._nan.device != device:
            self._nan = torch.full((), float("nan"), dtype=f64, device=device)
        nan = self._nan  # only ever stacked (copied), never written
        (scale_before, scale_after, growth, found_inf), absent, from_scale = (
            self._view.after_update(before, device, snapshot=host))
        if self._loss_sum is not None:
            loss = self._loss_sum if self._loss_n == 1 else self._loss_sum / self._loss_n
            if not host:
                loss = loss.to(device).reshape(())
        else:
            loss = nan
            absent.add("loss")
        head = self._head
        raw = self._raw_norms is not None
        if head is None and self._raw is None:
            norm = nan
            absent.add("grad_norm")
        else:  # raw per-layer norms: the sender thread fills the slot (StepRecord.to_wire)
            norm = nan if raw or head is None else head[0].to(device)
        rate = lr(device)
        if rate is None:
            rate = nan
            absent.add("lr")
        scalars = [scale_before, scale_after, growth, found_inf, loss, norm, rate]
        assert len(scalars) == len(SCALARS)
        blocks: list[torch.Tensor | list[torch.Tensor]] = []
        if self._raw is not None:
            blocks.append(self._raw)
        elif head is not None and (raw or head.numel() > 1):
            blocks.append(head if raw else head[1:])
        for block in (self._hist, self._acts, self.swallowed):
            if block is not None:
                blocks.append(block)
        recheck_block = self.recheck if isinstance(self.recheck, torch.Tensor) else None
        if recheck_block is not None:
            blocks.append(recheck_block)
        ready = None
        values: Parts | torch.Tensor
        if host:
            values = [scalars, *blocks]  # stacked on the sender thread
        else:
            # One stack, promoting the scaler's float32/int32 tensors to float64 (scale_before,
            # loss and the norm already are): no conversion op per scalar; then ONE copy.
            parts = [torch.stack(scalars)]
            parts += [(b if isinstance(b, torch.Tensor) else torch.stack(b)).to(device)
                      for b in blocks]
            values = parts[0] if len(parts) == 1 else torch.cat(parts)
            if values.is_cuda:
                host_values = torch.empty(values.shape, dtype=f64, pin_memory=True)
                host_values.copy_(values, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record()
                values = host_values
            elif values.device.type != "cpu":
                values = values.to("cpu")
        per_layer = self._raw is not None or (head is not None and (raw or head.numel() > 1))
        sections = Sections(
            num_layers=len(self._params),
            norms=per_layer and not self._has_block,
            block=per_layer and self._has_block,
            histogram=self._hist is not None,
            modules=0 if self._acts is None or self.probe is None else len(self.probe.table),
            swallowed=self.swallowed is not None,
            recheck=recheck_block is not None,
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
            captured=self._captured_kind if self._captured_device is not None else None,
            misuse=misuse,
            order=self.order.order() if self.order is not None else None,
            clip=clip,
            recheck_error=self.recheck if isinstance(self.recheck, str) else None,
            float32_norms=self._float32_norms,
            raw_norms=self._raw_norms,
        )

    def _device(self, before: Mapping[str, Any]) -> torch.device:
        if "scale" in before:
            return torch.device(before["scale"].device)
        if self._captured_device is not None:
            return self._captured_device
        return torch.device("cpu")
