"""The ``activation`` source (DESIGN.md §3): sampled statistics of each module's ``grad_output``.

Under autocast FP16 underflow happens in the activation gradients, not in the FP32 ``.grad``. On
a sampled step ONE process-wide forward hook answers for the watched leaf modules and hooks each
one's first output, which sees the gradient as it flowed (its dtype, still scaled). ``collect``
removes it: nothing stays registered or is stored on a module (a model pickled mid-sample
carries no closure); while armed each module call pays a dict lookup. The hook returns at once
under dynamo (compiled modules are not sampled); since compiled graphs guard on global hooks, a
sample that saw no module stops the probe, and torch's warning about global hooks is filtered.
Magnitudes in true units, fractions at the scale; a module without a gradient reports PyTorch's zero
gradient. No host sync. Per-hook reductions would be launch-bound
(docs/hook-cost.md#the-activation-probes-cost): small gradients are kept by reference and reduced
together (autograd writes in place only into a buffer it holds the last reference to, so a kept one
never changes).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch

from ampscope.devices import device_tensor
from ampscope.formats import TargetFormat
from ampscope.names import canonical_names
from ampscope.reductions import STAT_NAMES, GradStats
from ampscope.sampled_hook import SampledHook

__all__ = ["FLUSH_ELEMS", "ActivationProbe", "grad_output_stats"]

logger = logging.getLogger("ampscope")

_AMAX, _AMIN, _L2 = 0, 1, 7

FLUSH_ELEMS = 1 << 20
"""Kept gradient elements that trigger a reduction during backward, and the size from which a
gradient is reduced alone: bounds what a sample holds (4 MiB of references' worth in float32,
16 MiB of scratch kept between samples)."""


def grad_output_stats(grad: torch.Tensor, fmt: TargetFormat) -> torch.Tensor:
    """The eight stats of one flowing gradient in raw units, float64 ``(8,)`` on its device."""
    a = grad.detach().reshape(-1).abs().to(torch.float32)
    f64 = torch.float64
    n = max(a.numel(), 1)
    zero = (a == 0).sum(dtype=f64)
    nans = torch.isnan(a).sum(dtype=f64)
    infs = torch.isinf(a).sum(dtype=f64)
    finite = torch.nan_to_num(a, nan=0.0, posinf=0.0)
    nan = torch.full((), math.nan, dtype=f64, device=a.device)
    amax = finite.amax().to(f64) if a.numel() else nan
    amax = torch.where(a.numel() - nans - infs > 0, amax, nan)
    inf = torch.full((), math.inf, dtype=torch.float32, device=a.device)
    amin = torch.where(finite > 0, finite, inf).amin().to(f64) if a.numel() else nan
    amin = torch.where(torch.isinf(amin), nan, amin)
    # NaN compares False, so the "<" counts hold finite and zero elements only.
    lt_normal = (a < fmt.min_normal).sum(dtype=f64) - zero
    lt_under = (a < fmt.underflow_threshold).sum(dtype=f64) - zero
    l2 = torch.linalg.vector_norm(finite, dtype=f64)
    return torch.stack([amax, amin, zero / n, lt_normal / n, lt_under / n, nans, infs, l2])


def _leaf_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    leaves = [(name, m) for name, m in model.named_modules() if not any(True for _ in m.children())]
    return leaves


class ActivationProbe:
    """Arms hooks for one sampled backward and turns what they saw into an ``(8·M,)`` block."""

    def __init__(
        self, model: torch.nn.Module, fmt: TargetFormat, on_error: Callable[[Exception], None]
    ) -> None:
        self.fmt = fmt
        self._on_error = on_error
        leaves = _leaf_modules(model)
        # Canonical, as the layer table's (``names.py``): no ``module.``/``_orig_mod.`` of a
        # wrapper, so a wrapped run's activations line up with a plain run's.
        names = canonical_names([name for name, _ in leaves])
        self.table: list[dict[str, Any]] = [
            {"index": i, "name": name or type(m).__name__, "module_type": type(m).__name__}
            for i, (name, (_, m)) in enumerate(zip(names, leaves, strict=True))
        ]
        self._modules = [m for _, m in leaves]
        self._index = {id(m): i for i, m in enumerate(self._modules)}  # kept alive by _modules
        self._hook = SampledHook(self._forward_hook)
        # A plain attribute, not a property: the step cycle reads it on every capture, and a
        # property is one more Python call on the training thread's path.
        self.armed = False
        self.off = False  # the model runs compiled: never armed again (``collect``)
        self._hooked: set[int] = set()  # modules whose output got a tensor hook this sample
        self._taken: set[int] = set()  # modules whose gradient was kept this sample
        self._results: dict[int, torch.Tensor] = {}
        self._pending: list[tuple[int, torch.Tensor]] = []
        self._pending_elems = 0
        # Its own GradStats: the plan cache then holds the activation layouts, which repeat from
        # sample to sample, and never evicts the parameter layout of the monitor's instance.
        # Never fused: activation shapes may change from sample to sample (sequence lengths),
        # and each new layout would be a compile for one sampled step.
        self._stats = GradStats(fmt, fused=False)

    def hook_count(self) -> int:
        """Forward hooks of ours still registered (1 while armed, 0 between samples)."""
        return int(self._hook.registered)

    def arm(self) -> None:
        if self._hook.registered or self.off:
            return
        self._hooked.clear()
        self._taken.clear()
        self._results = {}
        self._pending = []
        self._pending_elems = 0
        if self._modules:
            self._hook.arm()
            self.armed = True

    def disarm(self) -> None:
        self._hook.disarm()  # tensor hooks still attached to a live graph go quiet
        self.armed = False
        self._pending = []
        self._pending_elems = 0

    def _forward_hook(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        """The process-wide forward hook of a sampled step (module docstring)."""
        # Traced by dynamo: a constant there, no side effect, no graph break. Not
        # ``is_compiling()``: that one answers True on *every* thread while any compile runs (the
        # fused read's, in the background), and the probe would then see no module and turn
        # itself off for good; ``is_dynamo_compiling()`` is True only inside the trace.
        if torch.compiler.is_dynamo_compiling():
            return
        try:
            index = self._index.get(id(module))
            if index is None or index in self._hooked:
                return
            out = output
            if isinstance(out, (tuple, list)):
                out = next((t for t in out
                            if isinstance(t, torch.Tensor) and t.requires_grad), None)
            if not isinstance(out, torch.Tensor) or not out.requires_grad:
                return
            if not out.is_floating_point() or out.numel() == 0:
                return
            self._hooked.add(index)
            out.register_hook(self._grad_hook(index, self._hook.generation))
        except Exception as exc:
            self._on_error(exc)

    def _grad_hook(self, index: int, gen: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            try:
                if gen != self._hook.generation or index in self._taken:
                    return
                self._taken.add(index)
                if grad.numel() >= FLUSH_ELEMS:
                    self._results[index] = grad_output_stats(grad, self.fmt)
                    return
                self._pending.append((index, grad.detach()))
                self._pending_elems += grad.numel()
                if self._pending_elems >= FLUSH_ELEMS:
                    self._flush()
            except Exception as exc:
                self._on_error(exc)
        return hook

    def _flush(self) -> None:
        """Reduce the kept gradients together: raw units (scale 1, all "scaled", so the classes
        are judged on the flowing values); ``collect`` divides the magnitudes by the scale."""
        pending, self._pending, self._pending_elems = self._pending, [], 0
        if not pending:
            return
        grads = [g for _, g in pending]
        stats = self._stats.layer_stats(grads, 1.0, True)[1:].view(len(STAT_NAMES), len(grads))
        for (index, _), column in zip(pending, stats.unbind(1), strict=True):
            self._results[index] = column

    def collect(self, scale: torch.Tensor | float, device: torch.device) -> torch.Tensor | None:
        """Remove the hooks; the sampled ``(8·M,)`` stats in true units (None: no gradient seen)."""
        self._flush()
        results = self._results
        self._results = {}
        if not self._hooked and self._modules:
            # No watched module's forward reached the hook during a whole sampled step: they
            # run inside a compiled graph, where the hook returns at once. Arming again would
            # only recompile that graph (it guards on the global hooks' keys), so stop here.
            self.off = True
            logger.info("ampscope: the model runs compiled; activation statistics are off")
        self.disarm()
        if not results:
            return None
        f64 = torch.float64
        zero_grad = device_tensor([0.0, math.nan, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], f64, device)
        cols = [results[i].to(device) if i in results else zero_grad
                for i in range(len(self._modules))]
        block = torch.stack(cols, dim=1)  # (8, M)
        s = (scale.detach().to(device=device, dtype=f64).reshape(())
             if isinstance(scale, torch.Tensor) else torch.full((), float(scale), dtype=f64,
                                                                 device=device))
        inv = s.reciprocal()
        for row in (_AMAX, _AMIN, _L2):
            block[row] *= inv
        assert block.shape[0] == len(STAT_NAMES)
        return block.reshape(-1)
