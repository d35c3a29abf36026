"""Mergeable per-layer partials: what one read of a gradient yields, and the stats they become.

A *partial* is a float64 row of ``NUM_COLUMNS`` values over some set of elements of one layer:

=================  ==================================================================  =========
column             over the elements                                                   merge
=================  ==================================================================  =========
``ZERO``           count of raw == 0                                                   sum
``NAN``            count of NaN                                                        sum
``INF``            count of ±inf                                                       sum
``LT_UNDER``       count of |raw|·m < fmt.underflow_threshold (zeros included)          sum
``LT_NORMAL``      count of |raw|·m < fmt.min_normal (zeros included)                   sum
``SUMSQ``          Σ raw² over finite elements, accumulated in float64                  sum
``AMAX``           max |raw| over finite elements (0 when none)                         max
``AMIN``           min |raw| over finite non-zero elements (+inf when none)             min
=================  ==================================================================  =========

``raw`` is the gradient as stored and ``m`` the factor that turns it into the value the target
format would hold at the step's scale: 1 for a gradient still scaled (captured before
``unscale_``), the scale for one already in true units. Partials of disjoint pieces of a layer
merge column by column (``merge``) into the partials of the whole, so a sharded run combines its
ranks' rows with one sum and one max/min collective (#9), provided every rank used the same scale
(``GradScaler`` keeps it identical across ranks) and the same scaled/unscaled state.
``finalize`` turns a layer table of partials into the wire's stats (true units, DESIGN.md §3);
``finalize_host`` is the same arithmetic on host floats, for the sender thread.

Why bit patterns (``tensor_partials``). For float32 x ≥ 0 the int32 bit pattern is monotonic in x,
+inf is ``INF_BITS`` and every NaN lies above it. So one integer view of |raw| answers every class
with integer compares (exact, and cheap in a vectorised loop): zero is ``b == 0``, NaN ``b > INF``,
the finite maximum an integer max, and the thresholds become bit patterns. The threshold of a
gradient judged at ``m`` is the smallest float32 ``x`` with ``x·m ≥ thr`` (``threshold_bits``), so
``b < t`` decides ``|raw|·m < thr`` as the exact real product would: the same answer as a float64
NumPy reference for float32/float16/bfloat16 gradients (all exact in float32) and any scale with at
most 29 significant bits (every ``GradScaler`` scale is a float32), including non-power-of-two
scales, where a float32 product would round.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from itertools import repeat
from operator import mul, sub, truediv

import torch

from ampscope.devices import device_tensor

__all__ = [
    "AMAX",
    "AMIN",
    "COLUMNS",
    "INF",
    "INF_BITS",
    "LT_NORMAL",
    "LT_UNDER",
    "NAN",
    "NUM_COLUMNS",
    "NUM_SUMS",
    "SUMSQ",
    "ZERO",
    "absent",
    "finalize",
    "finalize_host",
    "float32_bits",
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
_MAX_FINITE_BITS = 0x7F7FFFFF
_INT32_LIMIT = 2**31
_FLOAT32_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def float32_bits(value: float) -> int:
    """The int32 pattern of a positive float32 ``value``: ``threshold_bits`` at ``mult`` = 1."""
    packed = struct.pack("<f", value)
    if struct.unpack("<f", packed)[0] != value or not value > 0:  # finfo thresholds are exact
        raise ValueError(f"{value!r} is not a positive float32")
    bits: int = struct.unpack("<i", packed)[0]
    return bits


def threshold_bits(thr: torch.Tensor, mult: torch.Tensor) -> torch.Tensor:
    """Int32 bit patterns ``t``, one per threshold of the float64 ``(k,)`` device tensor ``thr``,
    with ``x·mult < thr ⇔ bits(x) < t`` for every float32 ``x ≥ 0``, the product taken exactly; a
    ``(k,)`` device tensor, no host sync (callers keep ``thr`` on the device).

    ``t`` is the smallest float32 ``x`` with ``x·mult ≥ thr``: float32(thr / mult) is that value
    or the one below it (rounding to nearest twice cannot land above it), and the float64 product
    of a float32 and a ≤29-bit ``mult`` is exact, so one compare decides. A ``mult`` that is 0,
    ±inf or NaN makes no element "0 < |x·mult| < thr": ``t`` is then 1 (only zero lies below it,
    and zeros are subtracted from these counts).
    """
    m = mult.detach().to(torch.float64).reshape(1)
    c = (thr / m).to(torch.float32)
    c = torch.where(c.to(torch.float64) * m >= thr, c, torch.nextafter(c, c.new_full((), math.inf)))
    bits = c.view(torch.int32).clamp(1, INF_BITS)
    return torch.where(torch.isfinite(m) & (m > 0), bits, 1)


def tensor_partials(
    grad: torch.Tensor, under_bits: torch.Tensor | int, normal_bits: torch.Tensor | int
) -> torch.Tensor:
    """The partials row of one non-empty float32/float16/bfloat16 tensor: float64 ``(8,)``.

    Written to be fused: ``torch.compile`` turns the body into one loop that reads each element
    once (``fused.py``); called eagerly it is the same arithmetic, one kernel per line. Counts
    accumulate in int32 below 2^31 elements (half the vector width of int64) and in int64 above;
    the choice depends on the static size only, so it is fixed when the kernel is traced.
    """
    if grad.dtype not in _FLOAT32_DTYPES:
        raise TypeError(f"tensor_partials takes float32/float16/bfloat16, not {grad.dtype}")
    count = torch.int32 if grad.numel() < _INT32_LIMIT else torch.int64
    b = grad.to(torch.float32).view(torch.int32) & 0x7FFFFFFF  # |raw| as bits
    finite = b < INF_BITS
    fb = torch.where(finite, b, 0)  # finite magnitudes; non-finite → 0
    f64 = torch.float64
    return torch.stack([
        (b == 0).sum(dtype=count).to(f64),
        (b > INF_BITS).sum(dtype=count).to(f64),
        (b == INF_BITS).sum(dtype=count).to(f64),
        (b < under_bits).sum(dtype=count).to(f64),
        (b < normal_bits).sum(dtype=count).to(f64),
        fb.view(torch.float32).to(f64).square().sum(),
        fb.amax().view(torch.float32).to(f64),
        # (b - 1) & 0x7fffffff sends 0 to the largest key and keeps every other magnitude in
        # order, so zeros never win; no finite non-zero element reads back as +inf.
        ((b - 1) & 0x7FFFFFFF).amin().clamp_max(_MAX_FINITE_BITS).add(1)
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
    """The stats of a layer table: float64 ``(1 + 8·L,)``, no host sync.

    ``partials``: ``(L, 8)``; ``numel``: float64 ``(L,)``; ``to_true``: float64 ``(L,)``, the
    factor from raw to true units (1/scale for scaled layers, 1 otherwise). ``out[0]`` is the
    global L2 norm in true units (NaN if any element is NaN, else +inf if any is ±inf);
    ``out[1:].view(8, L)`` holds the rows of ``reductions.STAT_NAMES``. ``amax``/``amin_nz`` are
    NaN when no element qualifies (sent as null); fractions are of ``numel`` (0 for an empty
    layer).
    """
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


def finalize_host(
    table: Sequence[float], numel: Sequence[float], to_true: Sequence[float]
) -> tuple[float, list[list[float]]]:
    """``finalize`` on host floats: (the global norm, the 8 rows of ``reductions.STAT_NAMES``
    of L values each), the same numbers bit for bit. ``table`` holds the ``(L, 8)`` partials
    flattened row by row, ``numel`` and ``to_true`` L floats each.

    Why a twin: the sender thread runs this for every per-layer record, holding the GIL and a
    core that training's own threads want; ``finalize``'s two dozen tensor ops on a 34-layer
    table cost it ~0.4 ms there. Every operation is one float64 IEEE operation, as each of
    ``finalize``'s elementwise ops is, so the values are identical; the one reduction, the
    global norm's sum over layers, is left to ``torch.sum`` on the same L squares, so its order
    of addition is the device's too. (Not ``finalize`` on CPU tensors: ATen's vectorised float64
    ``sqrt`` is not correctly rounded, ``math.sqrt`` is.)

    Column by column with ``map`` over C functions (``operator``, ``math.sqrt``): no Python
    frame per layer. Only a column with a case to tell apart (a layer without a finite element,
    one without a finite non-zero element) takes a per-value expression.
    """
    n = len(numel)
    if len(table) != NUM_COLUMNS * n or len(to_true) != n:
        raise ValueError(f"got {len(table)} partials and {len(to_true)} factors for {n} layers")
    col = [table[k::NUM_COLUMNS] for k in range(NUM_COLUMNS)]
    zero, nans, infs, lt_under, lt_normal = col[ZERO], col[NAN], col[INF], col[LT_UNDER], col[
        LT_NORMAL]
    denom = list(map(max, numel, repeat(1.0)))  # numel.clamp(min=1): max keeps numel at 1.0
    finite = list(map(sub, map(sub, numel, nans), infs))
    amax = list(map(mul, col[AMAX], to_true))
    if n and min(finite) <= 0:  # a layer without a finite element: no amax (NaN)
        amax = [a if f > 0 else math.nan for a, f in zip(amax, finite, strict=True)]
    amin_col = col[AMIN]
    if math.inf in amin_col:  # no finite non-zero element: NaN
        # ``== inf``, not ``math.isinf``: no call per value (amin is >= 0 or +inf, never -inf).
        amin_nz = [math.nan if a == math.inf else a * t
                   for a, t in zip(amin_col, to_true, strict=True)]
    else:
        amin_nz = list(map(mul, amin_col, to_true))
    zero_frac = list(map(truediv, zero, denom))
    sub_frac = list(map(truediv, map(sub, lt_normal, zero), denom))
    under_frac = list(map(truediv, map(sub, lt_under, zero), denom))
    l2 = list(map(mul, map(math.sqrt, col[SUMSQ]), to_true))
    if any(nans):
        norm = math.nan
    elif any(infs):
        norm = math.inf
    else:
        norm = torch.tensor(l2, dtype=torch.float64).square().sum().sqrt().item()
    return norm, [amax, amin_nz, zero_frac, sub_frac, under_frac, list(nans), list(infs), l2]
