"""The optional FP32 re-check of an overflow step (``Monitor.recheck``; contract "Wire v3").

When a step's gradients overflowed (the scaler skipped it), the user's closure is run once more
for that batch with autocast off and no loss scaling, and its loss and parameter gradients are
checked for NaN/inf:

* they **persist** in FP32 → the data or the computation produces them (a NaN in the batch, a
  log of 0, a division by zero): no loss scale or format can fix it;
* they **vanish** → the overflow was a dynamic-range problem of the low-precision format.

The closure returns the scalar loss of the current batch (``lambda: loss_fn(model(x), y)``).
It runs on the training thread inside ``scaler.update()``, after the skipped ``step`` (so the
parameters are exactly those the overflowing forward used) and leaves the training state as it
was: gradients come from ``torch.autograd.grad`` (``.grad`` is not touched), the RNG state is
forked (dropout draws do not shift training's), and the model's buffers (BatchNorm statistics)
are restored. Autocast is disabled (also the one accelerate's ``prepare`` builds into the model's
``forward``), so a model whose parameters are FP32 runs in FP32; a model
held in FP16 (``model.half()``) keeps its FP16 parameters and the re-check says only whether the
values persist without autocast and loss scaling.

Cost: nothing unless an overflow step occurs; then one forward and one backward in FP32 plus a
copy of the buffers. The result stays on the device, stacked into the step's one host copy
(``cycle.py``). An exception raised by the closure is recorded (``"failed"``), never raised.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["INF_CODE", "NAN_CODE", "RecheckFn", "run_recheck"]

RecheckFn = Callable[[], Any]
INF_CODE = 1.0
NAN_CODE = 2.0
"""Per-layer codes in the result block: 0 finite (or no gradient), 1 inf, 2 NaN (NaN wins)."""
DETAIL_MAX = 1000


def run_recheck(
    fn: RecheckFn, model: torch.nn.Module, params: Sequence[torch.nn.Parameter]
) -> torch.Tensor | str:
    """Run ``fn`` in FP32 and return the float64 block ``[loss given (0/1), loss, code per
    parameter]`` (device tensors, no sync), or the error message when ``fn`` or its backward
    raised."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        with contextlib.ExitStack() as stack:
            cuda = sorted({p.device.index or 0 for p in params if p.device.type == "cuda"})
            stack.enter_context(torch.random.fork_rng(devices=cuda))
            for device_type in {"cpu", *(p.device.type for p in params)}:
                if device_type in ("cpu", "cuda"):
                    stack.enter_context(torch.autocast(device_type, enabled=False))
            stack.enter_context(torch.enable_grad())
            stack.enter_context(_forward_without_built_in_autocast(model))
            return _block(fn(), params)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:DETAIL_MAX]
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)


@contextlib.contextmanager
def _forward_without_built_in_autocast(model: torch.nn.Module) -> Iterator[None]:
    """accelerate's ``prepare`` builds autocast into the model's ``forward`` (an instance
    attribute over the saved ``_original_forward``), and an outer ``autocast(enabled=False)``
    cannot turn an inner one off: the re-check runs the saved forward instead (of the model,
    or of the module a DDP wrapper holds), and puts the prepared one back."""
    swapped = []
    for module in (model, getattr(model, "module", None)):
        own = vars(module) if isinstance(module, torch.nn.Module) else {}
        if "_original_forward" in own and "forward" in own:
            swapped.append((module, own["forward"]))
            module.forward = own["_original_forward"]  # type: ignore[union-attr]
    try:
        yield
    finally:
        for module, forward in swapped:
            module.forward = forward  # type: ignore[union-attr]


def _block(loss: Any, params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = type(loss).__name__ if not isinstance(loss, torch.Tensor) else (
            f"a tensor of shape {tuple(loss.shape)}")
        raise TypeError(f"the recheck closure must return a scalar loss tensor, got {got}")
    device = loss.device
    f64 = torch.float64
    codes = torch.zeros(len(params), dtype=f64, device=device)
    wanted = [i for i, p in enumerate(params) if p.requires_grad]
    if loss.requires_grad and wanted:
        grads = torch.autograd.grad(
            loss.reshape(()), [params[i] for i in wanted], allow_unused=True)
        for i, grad in zip(wanted, grads, strict=True):
            if grad is None:
                continue
            code = torch.where(
                torch.isnan(grad).any(), NAN_CODE, torch.where(torch.isinf(grad).any(), INF_CODE,
                                                               0.0))
            codes[i] = code.to(device=device, dtype=f64)
    head = torch.stack([torch.ones((), dtype=f64, device=device),
                        loss.detach().reshape(()).to(f64)])
    return torch.cat([head, codes])
