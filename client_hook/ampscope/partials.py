"""Mergeable per-layer partials: what one read of a gradient yields, and the stats they become.

A *partial* is a float64 row over some elements of one layer: counts of raw == 0, NaN, ±inf, and
of |raw|·m below the format's underflow threshold and min normal (zeros included); Σ raw² over
finite elements; max |raw| over finite elements (0 if none) and min over finite non-zero ones
(+inf if none). ``m`` is 1 for a gradient still scaled, else the scale: |raw|·m is what the
format would hold. Pieces of a layer merge column by column (``merge``), so sharded ranks combine
with one sum and one max/min collective (#9). ``finalize`` gives the wire's stats. Why bit
patterns: for float32 x ≥ 0 the int32 pattern is monotonic (+inf is ``INF_BITS``, NaNs above),
so integer compares decide every class exactly, a threshold being the pattern of the smallest
float32 ``x`` with ``x·m ≥ thr`` (``threshold_bits``): exact at any scale.
"""

from __future__ import annotations

import ctypes
import math
import struct
from array import array
from types import ModuleType
from typing import NamedTuple

import torch

from ampscope.devices import device_tensor
from ampscope.formats import TargetFormat

_np: ModuleType | None
try:  # optional: torch itself imports it where it is installed
    import numpy

    _np = numpy
except ImportError:
    _np = None

__all__ = [
    "AMAX",
    "AMIN",
    "COLUMNS",
    "INF",
    "INF_BITS",
    "LT_NORMAL",
    "LT_UNDER",
    "MAX_FINITE_BITS",
    "NAN",
    "NUM_COLUMNS",
    "NUM_SUMS",
    "SUMSQ",
    "ZERO",
    "HostStats",
    "absent",
    "finalize",
    "finalize_host",
    "float32_bits",
    "format_bits",
    "merge",
    "tensor_partials",
    "threshold_bits",
]

COLUMNS = ("zero", "nan", "inf", "lt_under", "lt_normal", "sumsq", "amax", "amin")
ZERO, NAN, INF, LT_UNDER, LT_NORMAL, SUMSQ, AMAX, AMIN = range(len(COLUMNS))
NUM_COLUMNS = len(COLUMNS)
NUM_SUMS = 6
"""The first ``NUM_SUMS`` columns merge by addition; ``AMAX`` by max, ``AMIN`` by min."""

INF_BITS = 0x7F800000
"""float32 +inf as an int32 bit pattern; every NaN's magnitude pattern is larger."""
MAX_FINITE_BITS = 0x7F7FFFFF
_INT32_LIMIT = 2**31
_FLOAT32_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def float32_bits(value: float) -> int:
    """The int32 pattern of a positive float32 ``value``: ``threshold_bits`` at ``mult`` = 1."""
    packed = struct.pack("<f", value)
    if struct.unpack("<f", packed)[0] != value or not value > 0:  # finfo thresholds are exact
        raise ValueError(f"{value!r} is not a positive float32")
    bits: int = struct.unpack("<i", packed)[0]
    return bits


def format_bits(fmt: TargetFormat) -> tuple[int, int]:
    """The int32 patterns of ``fmt``'s underflow threshold and min normal: the bounds of the
    ``LT_UNDER`` and ``LT_NORMAL`` classes for a gradient still scaled (``threshold_bits`` at
    ``mult`` = 1)."""
    return float32_bits(fmt.underflow_threshold), float32_bits(fmt.min_normal)


def threshold_bits(thr: torch.Tensor, mult: torch.Tensor) -> torch.Tensor:
    """Int32 patterns ``t`` of the float64 ``(k,)`` device thresholds ``thr``, such that
    ``x·mult < thr ⇔ bits(x) < t`` for every float32 ``x ≥ 0`` (exact product), no host sync:
    float32(thr / mult) or the next one up, decided by an exact float64 product (``mult`` has at
    most 29 bits). A ``mult`` of 0, ±inf or NaN gives ``t`` = 1."""
    m = mult.detach().to(torch.float64).reshape(1)
    c = (thr / m).to(torch.float32)
    c = torch.where(c.to(torch.float64) * m >= thr, c, torch.nextafter(c, c.new_full((), math.inf)))
    bits = c.view(torch.int32).clamp(1, INF_BITS)
    return torch.where(torch.isfinite(m) & (m > 0), bits, 1)


def tensor_partials(
    grad: torch.Tensor, under_bits: torch.Tensor | int, normal_bits: torch.Tensor | int
) -> torch.Tensor:
    """The float64 ``(8,)`` partials row of one non-empty float32/float16/bfloat16 tensor.
    Written to be fused (one loop, one read, ``fused.py``); eagerly a kernel per line. Counts
    are int32 below 2^31 elements (half int64's vector width), fixed at trace time.

    Every count is of ``b < t`` for a bound ``t`` in [1, INF_BITS + 1] (zeros: ``b < 1``; inf:
    below INF_BITS + 1 and not below INF_BITS; NaN: the rest), summed as the sign bit of
    ``b - t`` spread by an arithmetic ``>> 31`` (-1 where ``b < t``: both lie in [0, 2^31), so
    the difference never overflows): a subtraction, a shift and an add per bound, which the
    compiled loop runs faster than a compare whose boolean is summed as int32; the same mask
    zeroes the non-finite magnitudes (docs/hook-cost.md#the-fused-loops-counts)."""
    if grad.dtype not in _FLOAT32_DTYPES:
        raise TypeError(f"tensor_partials takes float32/float16/bfloat16, not {grad.dtype}")
    count = torch.int32 if grad.numel() < _INT32_LIMIT else torch.int64
    b = grad.to(torch.float32).view(torch.int32) & 0x7FFFFFFF  # |raw| as bits
    f64 = torch.float64

    def sign(t: torch.Tensor | int) -> torch.Tensor:
        """-1 where ``b < t``, else 0."""
        return (b - t) >> 31

    def below(t: torch.Tensor | int) -> torch.Tensor:
        """-count(b < t)."""
        return sign(t).sum(dtype=count)

    fb = b & sign(INF_BITS)  # finite magnitudes; non-finite → 0
    zeros, finites, not_nan = below(1), below(INF_BITS), below(INF_BITS + 1)
    return torch.stack([
        zeros.neg().to(f64),
        (not_nan + b.numel()).to(f64),
        (finites - not_nan).to(f64),
        below(under_bits).neg().to(f64),
        below(normal_bits).neg().to(f64),
        fb.view(torch.float32).to(f64).square().sum(),
        fb.amax().view(torch.float32).to(f64),
        # (b - 1) & 0x7fffffff sends 0 to the largest key and keeps every other magnitude in
        # order, so zeros never win; no finite non-zero element reads back as +inf.
        ((b - 1) & 0x7FFFFFFF).amin().clamp_max(MAX_FINITE_BITS).add(1)
        .view(torch.float32).to(f64),
    ])


def absent(numel: int, device: torch.device) -> torch.Tensor:
    """The partials of a layer whose gradient is ``None`` (PyTorch: all zeros) or empty."""
    return device_tensor([numel, 0, 0, numel, numel, 0, 0, math.inf], torch.float64, device)


def merge(parts: torch.Tensor) -> torch.Tensor:
    """Merge partial rows ``(k, 8)`` of disjoint pieces of one layer into its row ``(8,)``."""
    return torch.cat([
        parts[:, :NUM_SUMS].sum(0),
        parts[:, AMAX].amax(0, keepdim=True),
        parts[:, AMIN].amin(0, keepdim=True),
    ])


def finalize(
    partials: torch.Tensor, numel: torch.Tensor, to_true: torch.Tensor
) -> torch.Tensor:
    """A layer table's stats, float64 ``(1 + 8·L,)``, no host sync: ``out[0]`` the global L2 norm
    (NaN, else +inf, if any element is), then the ``(8, L)`` rows of ``STAT_NAMES`` (amax/amin_nz
    NaN when nothing qualifies). ``to_true``: 1/scale for scaled layers, else 1."""
    zero, nans, infs = partials[:, ZERO], partials[:, NAN], partials[:, INF]
    nan = torch.full((), math.nan, dtype=torch.float64, device=partials.device)
    denom = numel.clamp(min=1.0)
    finite = numel - nans - infs
    amin = partials[:, AMIN]
    l2 = partials[:, SUMSQ].sqrt() * to_true
    stats = torch.stack([
        torch.where(finite > 0, partials[:, AMAX] * to_true, nan),
        torch.where(torch.isinf(amin), nan, amin * to_true),
        zero / denom,
        (partials[:, LT_NORMAL] - zero) / denom,
        (partials[:, LT_UNDER] - zero) / denom,
        nans,
        infs,
        l2,
    ])
    norm = l2.square().sum().sqrt()
    norm = torch.where(infs.sum() > 0, torch.full_like(norm, math.inf), norm)
    norm = torch.where(nans.sum() > 0, torch.full_like(norm, math.nan), norm)
    return torch.cat([norm.reshape(1), stats.reshape(-1)])


class HostStats(NamedTuple):
    """``finalize_host``'s answer: the global norm, the contiguous ``(8, L)`` stats (each row's
    bytes a wire column) and the rows' sums (5, 6: the NaN and inf totals)."""

    norm: float
    stats: torch.Tensor
    sums: list[float]


# The partials' columns in the order of ``STAT_NAMES`` (amax, amin_nz, zero_frac, subnormal_frac,
# underflow_frac, nan_count, inf_count, l2) before the arithmetic: one ``index_select``.
_ORDER = (AMAX, AMIN, ZERO, LT_NORMAL, LT_UNDER, NAN, INF, SUMSQ)
_ORDER_T = torch.tensor(_ORDER)
_IN_TRUE_UNITS = torch.tensor([[True], [True], [False], [False], [False], [False], [False],
                               [True]])
"""The rows multiplied by ``to_true``: amax, amin_nz, l2."""
_factors: dict[float, torch.Tensor] = {}
_denoms: tuple[torch.Tensor, int, torch.Tensor, bool] | None = None


def _row_factors(to_true: float) -> torch.Tensor:
    """The ``(8, 1)`` factors of one ``to_true``, kept (a dict: atomic for several senders)."""
    fac = _factors.get(to_true) if 0.0 < to_true < math.inf else None  # not -0.0 for 0.0
    if fac is None:
        if len(_factors) > 32:
            _factors.clear()
        fac = torch.where(_IN_TRUE_UNITS, torch.tensor(to_true, dtype=torch.float64), 1.0)
        _factors[to_true] = fac
    return fac


def _denominators(numel: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``numel.clamp(min=1)`` and whether a layer is empty, cached per shared ``numel``."""
    global _denoms
    kept = _denoms
    if kept is not None and kept[0] is numel and kept[1] == numel._version:
        return kept[2], kept[3]
    denom = numel.clamp(min=1.0)
    empty = bool((numel <= 0).any())
    _denoms = (numel, numel._version, denom, empty)
    return denom, empty


def _sqrt_(row: torch.Tensor) -> None:
    """The correctly rounded square root of a contiguous float64 CPU row, in place: ATen's CPU
    float64 ``sqrt`` (MKL's) is not correctly rounded; numpy's is, and without numpy
    ``math.sqrt`` through C loops. Cost: docs/hook-cost.md#the-sender-threads-arithmetic."""
    n = row.numel()
    if n and _np is not None:  # a sum of squares: never negative, so never numpy's warning
        values = row.numpy()
        _np.sqrt(values, out=values)
    elif n:
        cells = (ctypes.c_char * (8 * n)).from_address(row.data_ptr())
        view = memoryview(cells).cast("B").cast("d")
        view[:] = array("d", map(math.sqrt, view))


def finalize_host(
    table: torch.Tensor, numel: torch.Tensor, to_true: float | torch.Tensor
) -> HostStats:
    """``finalize`` on host floats for the sender thread, bit for bit (one IEEE operation per
    value): ATen's CPU ``sqrt`` is not correctly rounded, and a dozen ops whatever L hold the GIL
    training wants for less time. ``to_true``: one factor or ``(L,)``."""
    n = numel.shape[0]
    if table.shape != (n, NUM_COLUMNS) or (isinstance(to_true, torch.Tensor)
                                           and to_true.shape != (n,)):
        shape = to_true.shape if isinstance(to_true, torch.Tensor) else ()
        raise ValueError(f"got partials of shape {tuple(table.shape)} and factors of shape "
                         f"{tuple(shape)} for {n} layers")
    out = table.t().index_select(0, _ORDER_T)  # (8, L), contiguous: rows in STAT_NAMES order
    amin = out[1]
    amin.masked_fill_(amin == math.inf, math.nan)  # no finite non-zero element (NaN · t: NaN)
    out[3:5].sub_(table[:, ZERO])  # lt_normal - zero, lt_under - zero
    _sqrt_(out[7])
    if isinstance(to_true, torch.Tensor):
        out.mul_(torch.where(_IN_TRUE_UNITS, to_true, 1.0))
    elif to_true != 1.0:
        out.mul_(_row_factors(to_true))
    denom, empty = _denominators(numel)
    out[2:5].div_(denom)
    sums = out.sum(1).tolist()
    nans, infs = sums[5], sums[6]
    if nans or infs or empty:  # a layer may hold no finite element: no amax (NaN)
        out[0].masked_fill_(numel - out[5] - out[6] <= 0, math.nan)
    if nans:
        norm = math.nan
    elif infs:
        norm = math.inf
    else:
        norm = out[7].square().sum().sqrt().item()
    return HostStats(norm, out, sums)
