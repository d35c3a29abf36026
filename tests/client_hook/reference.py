"""NumPy references for the per-layer statistics (DESIGN.md §3), shared by the reduction tests."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from ampscope.formats import FORMATS, TargetFormat
from ampscope.reductions import STAT_NAMES

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
