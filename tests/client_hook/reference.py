"""NumPy references for the per-layer statistics (DESIGN.md §3), shared by the reduction tests,
and the hook's test-only twins: conveniences over its production classes that only tests and
benchmarks call (``layer_stats``, ``grad_norms``, ``grad_norm``, ``unpack``, ``due_layers``,
``scaled_flags``; #32)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from ampscope.cycle import ScalerView
from ampscope.devices import device_tensor
from ampscope.formats import FORMATS, TargetFormat
from ampscope.reductions import STAT_NAMES, Grads, GradStats, _scale_tensor
from ampscope.selection import Cadence

FP16 = FORMATS["fp16"]

DEVICE = torch.device(os.environ.get("AMPSCOPE_TEST_DEVICE", "cpu"))
"""Where the fused-kernel tests put their gradients: the CPU here and in CI (inductor's C++);
``AMPSCOPE_TEST_DEVICE=cuda`` on a GPU machine runs the same tests on the Triton kernel
(``docs/hook-cost.md`` has the command)."""


def reference(
    raws: Sequence[torch.Tensor | None],
    numels: Sequence[int],
    scale: float,
    scaled: Sequence[bool],
    fmt: TargetFormat,
) -> tuple[float, dict[str, list[float]]]:
    """DESIGN.md §3 in float64 NumPy, one layer at a time."""
    out: dict[str, list[float]] = {name: [] for name in STAT_NAMES}
    any_nan = any_inf = False
    total = 0.0
    for raw, numel, is_scaled in zip(raws, numels, scaled, strict=True):
        r = np.zeros(numel) if raw is None else raw.detach().cpu().double().numpy().ravel()
        g = r / scale if is_scaled else r  # true units
        gs = r if is_scaled else r * scale  # as the target format would hold it
        a, finite = np.abs(g), np.isfinite(g)
        fin = a[finite]
        nz = fin[fin > 0]
        sa = np.abs(gs)
        n = max(len(r), 1)
        l2 = math.sqrt(float(np.sum(fin.astype(np.float64) ** 2)))
        out["amax"].append(float(fin.max()) if fin.size else math.nan)
        out["amin_nz"].append(float(nz.min()) if nz.size else math.nan)
        out["zero_frac"].append(float(np.sum(r == 0)) / n)
        out["subnormal_frac"].append(float(np.sum((sa > 0) & (sa < fmt.min_normal))) / n)
        out["underflow_frac"].append(
            float(np.sum((sa > 0) & (sa < fmt.min_subnormal / 2))) / n)
        out["nan_count"].append(float(np.sum(np.isnan(r))))
        out["inf_count"].append(float(np.sum(np.isinf(r))))
        out["l2"].append(l2)
        any_nan |= bool(np.isnan(r).any())
        any_inf |= bool(np.isinf(r).any())
        total += l2 * l2
    norm = math.nan if any_nan else math.inf if any_inf else math.sqrt(total)
    return norm, out


def assert_same(got: float, want: float) -> None:
    if math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(want, rel=1e-6, abs=0.0)


def edge_tensor(scale: float, dtype: torch.dtype, scaled: bool, n: int = 3000) -> torch.Tensor:
    """Normal values plus zeros, fp16-subnormal and underflowing magnitudes (at ``scale``)."""
    gen = torch.Generator().manual_seed(n)
    true = torch.randn(n, generator=gen, dtype=torch.float64) * 1e-3
    true[::7] = 0.0
    true[1::11] = FP16.min_normal / 8 / scale  # subnormal once scaled
    true[2::13] = FP16.min_subnormal / 4 / scale  # flushes to zero once scaled
    true[3::17] = -FP16.min_normal / 2 / scale
    raw = true * scale if scaled else true
    return raw.to(dtype)


def partials_reference(raw: torch.Tensor, mult: float, fmt: TargetFormat) -> list[float]:
    """``partials.COLUMNS`` of one tensor in float64 NumPy, the classes judged on |raw·mult|."""
    r = raw.detach().cpu().double().numpy().ravel()
    a = np.abs(r)
    finite = np.isfinite(r)
    fin = a[finite]
    nz = fin[fin > 0]
    sa = a * mult
    return [
        float(np.sum(r == 0)),
        float(np.sum(np.isnan(r))),
        float(np.sum(np.isinf(r))),
        float(np.sum(sa < fmt.underflow_threshold)),
        float(np.sum(sa < fmt.min_normal)),
        float(np.sum(fin**2)),
        float(fin.max()) if fin.size else 0.0,
        float(nz.min()) if nz.size else math.inf,
    ]


def layer_stats(
    grads: Grads,
    scale: torch.Tensor | float,
    scaled: Sequence[bool] | bool,
    fmt: TargetFormat | str = "fp16",
    numels: Sequence[int] | None = None,
) -> torch.Tensor:
    """``GradStats(fmt, numels).layer_stats(...)`` on a fresh instance (no caching)."""
    return GradStats(fmt, numels).layer_stats(grads, scale, scaled)


def grad_norms(
    stats: GradStats, grads: Grads, scale: torch.Tensor | float, scaled: Sequence[bool] | bool
) -> torch.Tensor:
    """The device twin of ``capture.finish``'s norms: float64 ``(1 + L,)``, the global first."""
    # ``stats.raw_norms`` divided by the scale where scaled, true units, on the device (see
    # ``raw_norms`` for the float32 range). The global norm is NaN if any layer's is, else inf
    # if any is. The monitor does this arithmetic on the host instead (``capture.finish``).
    flags = [scaled] * len(grads) if isinstance(scaled, bool) else list(scaled)
    if len(flags) != len(grads):
        raise ValueError(f"got {len(flags)} scaled flags for {len(grads)} gradients")
    raw = stats.raw_norms(grads)
    if not len(raw):
        device = scale.device if isinstance(scale, torch.Tensor) else torch.device("cpu")
        return torch.zeros(1, dtype=torch.float64, device=device)
    v = raw.to(torch.float64)
    s = _scale_tensor(scale, v.device)
    v = v * torch.where(device_tensor(flags, torch.bool, v.device),
                        s.reciprocal(), torch.ones((), dtype=torch.float64, device=v.device))
    # A plain sum of squares, not vector_norm: NaN, not inf, when a NaN and an inf layer meet.
    return torch.cat([torch.dot(v, v).sqrt_().reshape(1), v])


def grad_norm(
    stats: GradStats, grads: Grads, scale: torch.Tensor | float, scaled: Sequence[bool] | bool
) -> torch.Tensor:
    """Only ``grad_norms``' global norm (0-d float64, true units, NaN/inf as in ``layer_stats``)."""
    return grad_norms(stats, grads, scale, scaled)[0]


def unpack(values: Sequence[float], num_layers: int) -> tuple[float, dict[str, list[float]]]:
    """A host copy of ``layer_stats`` output split into (grad_norm, {stat: per-layer list})."""
    if len(values) != 1 + len(STAT_NAMES) * num_layers:
        raise ValueError(f"expected {1 + len(STAT_NAMES) * num_layers} values, got {len(values)}")
    rows = {
        name: list(values[1 + k * num_layers : 1 + (k + 1) * num_layers])
        for k, name in enumerate(STAT_NAMES)
    }
    return float(values[0]), rows


def due_layers(cadence: Cadence, step: int) -> list[int]:
    """The layers of ``cadence`` whose own interval divides ``step``."""
    return [i for i, n in enumerate(cadence.intervals) if n > 0 and step % n == 0]


def scaled_flags(
    view: ScalerView,
    optimizer: torch.optim.Optimizer,
    optimizers: Sequence[torch.optim.Optimizer],
    params: Sequence[torch.nn.Parameter],
) -> list[bool]:
    """``view.scaled_state`` as one flag per watched parameter, never one shared bool."""
    flags = view.scaled_state(optimizer, optimizers, params)
    return [flags] * len(params) if isinstance(flags, bool) else flags
