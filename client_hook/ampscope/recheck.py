"""The optional FP32 re-check of an overflow step (``Monitor.recheck``; contract "Wire v3").

When the scaler skipped a step, the user's closure (the batch's scalar loss) runs again inside
``scaler.update()``, after the skipped ``step`` (the same parameters), with autocast and scaling
off: NaN/inf that **persist** in FP32 come from the data or the computation; ones that **vanish**
were the format's dynamic range (a model held in FP16 keeps its FP16 parameters). ``fp32_run``
leaves training's state as it was. During the re-run only, a forward hook on every submodule notes
on the device whether its output is non-finite or its output or inputs exceed the training format's
range; the first such module in forward order is the block's origin, its format fp32 when the FP32
run itself went non-finite (read by the server only for a non-finite loss). Cost: nothing until an
overflow step, then one FP32 forward and backward, on the device until the step's one host copy.
Closure errors are recorded (``"failed"``), never raised.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["INF_CODE", "NAN_CODE", "ORIGIN_FORMATS", "ORIGIN_SIZE", "RecheckFn", "failure",
           "fp32_grads", "fp32_run", "run_recheck"]

RecheckFn = Callable[[], Any]
INF_CODE = 1.0
NAN_CODE = 2.0
"""Per-layer codes in the result block: 0 finite (or no gradient), 1 inf, 2 NaN (NaN wins)."""
DETAIL_MAX = 1000
ORIGIN_SIZE = 4
"""The origin's values: found, call index, input finite, format (ORIGIN_FORMATS index)."""
ORIGIN_FORMATS = ("fp16", "bf16", "fp32")
_LOW_FORMATS: dict[torch.dtype | None, int] = {torch.float16: 0, torch.bfloat16: 1}


def run_recheck(
    fn: RecheckFn, model: torch.nn.Module, params: Sequence[torch.nn.Parameter],
    low: torch.dtype | None = None,
) -> tuple[torch.Tensor, tuple[str, ...]] | str:
    """Run ``fn`` in FP32: the float64 device block ``[loss given, loss, code per parameter,
    origin]`` and the hooked calls' names, or the error message. ``low``: the training's format
    (FP16/BF16; otherwise outputs are judged by finiteness alone). No sync."""
    trace = _Trace(model, low)
    try:
        with fp32_run(model, params):
            with trace.armed():
                loss = fn()
            block = _block(loss, params)
            return torch.cat([block, trace.origin(block.device)]), tuple(trace.names)
    except Exception as exc:
        return failure(exc)


def failure(exc: Exception) -> str:
    """What a recorded failure of the closure says (at most ``DETAIL_MAX`` characters)."""
    return f"{type(exc).__name__}: {exc}"[:DETAIL_MAX]


@contextlib.contextmanager
def fp32_run(model: torch.nn.Module, params: Sequence[torch.nn.Parameter]) -> Iterator[None]:
    """The closure as an FP32 re-run (re-check and shadow step): autocast off (accelerate's
    built-in too), gradients on, the RNG forked and the buffers put back, whatever happened."""
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
            yield
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)


class _Trace:
    """Forward hooks on every submodule, armed only inside ``run_recheck``: per call a name and
    three device bools (output non-finite, beyond ``low``'s range, input non-finite)."""

    def __init__(self, model: torch.nn.Module, low: torch.dtype | None) -> None:
        self.modules = [(name, m) for name, m in model.named_modules() if name]
        self.code = _LOW_FORMATS.get(low, len(ORIGIN_FORMATS) - 1)
        self.limit = torch.finfo(low).max if low is not None and low in _LOW_FORMATS else math.inf
        self.names: list[str] = []
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        handles = []
        try:
            for name, module in self.modules:
                handles.append(module.register_forward_hook(self._hook(name)))
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _flags(self, value: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(any NaN/inf, any finite |value| > limit) over ``value``'s float tensors, or None."""
        items = value if isinstance(value, tuple | list) else (value,)
        tensors = [t.detach() for t in items if isinstance(t, torch.Tensor)
                   and t.is_floating_point() and t.numel()]
        if not tensors:
            return None
        bad = torch.stack([~torch.isfinite(t).all() for t in tensors]).any()
        over = torch.stack([t.abs().nan_to_num(0.0, 0.0, 0.0).amax().float() > self.limit
                            for t in tensors]).any()
        return bad, over

    def _hook(self, name: str) -> Callable[[torch.nn.Module, Any, Any], None]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            try:
                out = self._flags(output)
                if out is None:
                    return
                into = self._flags(args)
                device = out[0].device
                in_bad, in_over = ((torch.zeros_like(out[0]),) * 2 if into is None
                                   else (into[0].to(device), into[1].to(device)))
                # An input beyond the range overflows at the module's own autocast cast.
                self.calls.append((out[0], out[1] | in_over, in_bad))
                self.names.append(name)
            except Exception:  # a hook never breaks the re-check
                return
        return hook

    def origin(self, device: torch.device) -> torch.Tensor:
        """``[found, index, input finite, format]`` of the first NaN/inf or out-of-range call."""
        f64 = torch.float64
        if not self.calls:
            return torch.zeros(ORIGIN_SIZE, dtype=f64, device=device)  # found 0: nothing read
        bad, over, in_bad = (torch.stack([c[k].to(device) for c in self.calls]).to(f64)
                             for k in range(3))
        hit = torch.maximum(bad, over)
        # gather, not ``bad[first]``: indexing by a 0-d tensor reads it on the host (a sync).
        first = torch.argmax(hit).reshape(1)
        code = torch.where(bad.gather(0, first) > 0, float(len(ORIGIN_FORMATS) - 1),
                           float(self.code))
        return torch.cat([hit.max().reshape(1), first.to(f64), 1.0 - in_bad.gather(0, first),
                          code])


@contextlib.contextmanager
def _forward_without_built_in_autocast(model: torch.nn.Module) -> Iterator[None]:
    """Run the saved ``_original_forward`` under accelerate's ``prepare`` (its built-in autocast
    defeats an outer ``autocast(enabled=False)``), also inside a DDP wrapper; then restore."""
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


def fp32_grads(loss: Any, params: Sequence[torch.nn.Parameter]
               ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """The detached 0-d loss and each parameter's ``autograd.grad`` (None: none reaches it)."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = type(loss).__name__ if not isinstance(loss, torch.Tensor) else (
            f"a tensor of shape {tuple(loss.shape)}")
        raise TypeError(f"the recheck closure must return a scalar loss tensor, got {got}")
    grads: list[torch.Tensor | None] = [None] * len(params)
    wanted = [i for i, p in enumerate(params) if p.requires_grad]
    if loss.requires_grad and wanted:
        found = torch.autograd.grad(
            loss.reshape(()), [params[i] for i in wanted], allow_unused=True)
        for i, grad in zip(wanted, found, strict=True):
            grads[i] = grad
    return loss.detach().reshape(()), grads


def _block(loss: Any, params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    value, grads = fp32_grads(loss, params)
    device = value.device
    f64 = torch.float64
    codes = torch.zeros(len(params), dtype=f64, device=device)
    for i, grad in enumerate(grads):
        if grad is None:
            continue
        code = torch.where(
            torch.isnan(grad).any(), NAN_CODE, torch.where(torch.isinf(grad).any(), INF_CODE,
                                                           0.0))
        codes[i] = code.to(device=device, dtype=f64)
    head = torch.stack([torch.ones((), dtype=f64, device=device), value.to(f64)])
    return torch.cat([head, codes])
