"""A real FP16 AMP training loop on the CPU with a real hook, for the FP32 re-check's and the
shadow step's tests (tests/client_hook/test_recheck.py, test_shadow.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

import ampscope
from ampscope.transport import MemorySender


class AmpLoop:
    """fp16 autocast, a GradScaler and SGD on the CPU, the hook sending to a MemorySender
    (per-layer statistics every step); ``step(x)`` is one training step on batch ``x`` with the
    FP32 closure registered (``closure=False``: none), ``before_step`` (when set) runs between
    backward and ``scaler.step``."""

    def __init__(self, model: nn.Module, *, lr: float = 1e-3, momentum: float = 0.0,
                 init_scale: float = 2.0**8,
                 opt_params: Iterable[torch.nn.Parameter] | None = None, **watch: Any) -> None:
        self.model = model
        params = model.parameters() if opt_params is None else opt_params
        self.opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        self.sink = MemorySender()
        self.mon = ampscope.watch(model, self.scaler, self.opt, server=None, sender=self.sink,
                                  layer_every=1, **watch)
        self.calls = 0
        self.before_step: Callable[[torch.Tensor], object] | None = None

    def loss_of(self, x: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = self.model(x).float().pow(2).mean()
        return loss

    def step(self, x: torch.Tensor, closure: bool = True) -> None:
        if closure:
            def fn() -> torch.Tensor:
                self.calls += 1
                return self.loss_of(x)
            self.mon.recheck(fn)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = self.loss_of(x)
        self.scaler.scale(loss).backward()
        if self.before_step is not None:
            self.before_step(x)
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad()

    def records(self) -> list[dict[str, Any]]:
        self.mon.close()
        return [r for body in self.sink.payloads() for r in body["records"]]
