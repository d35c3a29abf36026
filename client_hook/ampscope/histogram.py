"""The sampled exponent histogram of the ``param`` gradients (DESIGN.md §3, contract "Wire v2").

Per layer, counts of |g| (true units) by power of two, ``NUM_BINS`` entries: ``[0]`` |g| = 0,
``[1]`` NaN or ±inf, ``[2]`` 0 < |g| < 2^MIN_EXP, ``[3 + k]`` 2^(MIN_EXP+k) ≤ |g| < 2^(MIN_EXP+k+1)
for k = 0 … MAX_EXP - MIN_EXP, ``[last]`` |g| ≥ 2^(MAX_EXP+1).

Exact without dividing: with raw = g·s = m·2^e and s = ms·2^es (mantissas in [0.5, 1)),
floor(log2 |g|) = e - es - (1 if |m| < ms else 0) for any scale, so nothing near a bin edge (or a
subnormal a division would flush) is misbinned; ``ms`` rounded up to the gradients' precision
decides ``m < ms`` alike. Eager (``exponent_histogram``): per group of ``GROUP_ELEMS`` one copy,
~ten elementwise kernels and one ``index_add_`` (no ``bincount``: it syncs on CUDA), never a
launch per layer. Fused (``tensor_histogram``): the same bins from |raw|'s bit pattern, integer
ops inside the partials' kernel call (docs/hook-cost.md#the-histogram-in-the-fused-read).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ampscope.devices import device_tensor
from ampscope.partials import INF_BITS

__all__ = ["GROUP_ELEMS", "MAX_EXP", "MIN_EXP", "NUM_BINS", "exponent_histogram", "scale_bits",
           "tensor_histogram"]

MIN_EXP = -40
MAX_EXP = 20
NUM_BINS = MAX_EXP - MIN_EXP + 5

GROUP_ELEMS = 1 << 24
"""Elements per pass: bounds the transient buffers (flat values plus an int64 bin index)."""

Grads = Sequence["torch.Tensor | None"]


_LAYOUTS: dict[tuple[object, ...], torch.Tensor] = {}
"""Per-element ``layer * NUM_BINS`` offsets per layout (a handful; cleared past the cap)."""
_MAX_LAYOUTS = 8


def _offsets(device: torch.device, group: list[int], sizes: list[int], bins: int) -> torch.Tensor:
    key = (device, tuple(group), tuple(sizes), bins)
    base = _LAYOUTS.get(key)
    if base is None:
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            _LAYOUTS.clear()
        layer = device_tensor(group, torch.int64, device).mul_(bins)
        counts = device_tensor(sizes, torch.int64, device)
        base = _LAYOUTS[key] = torch.repeat_interleave(layer, counts, output_size=sum(sizes))
    return base


def _frexp_scale(
    scale: torch.Tensor | float, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mantissa bound in ``dtype``, exponent as int32) of the scale, 0-d device tensors."""
    s = (scale.detach().to(device=device, dtype=torch.float64).reshape(())
         if isinstance(scale, torch.Tensor)
         else torch.full((), float(scale), dtype=torch.float64, device=device))
    mant, exp = torch.frexp(s)
    bound = mant.to(dtype)
    if dtype != torch.float64:  # round up: m < ms ⇔ m < bound for every m of ``dtype``
        bound = torch.where(bound.to(torch.float64) < mant,
                            torch.nextafter(bound, torch.full_like(bound, 2.0)), bound)
    return bound, exp.to(torch.int32)


_MANT_BITS = 23
_HALF_BITS = 126 << _MANT_BITS  # float32 0.5: frexp's mantissas lie in [0.5, 1)
_SUBNORMAL_LIFT = 64  # 2^-149 · 2^64 is a normal float32: the multiplication is exact


def scale_bits(scale: torch.Tensor) -> torch.Tensor:
    """int32 ``[es, mb]`` of a 0-d float64 device scale: its ``frexp`` exponent and mantissa bound
    as bits (``m < ms ⇔ k < mb`` for ``m = 0.5·(1 + k/2^23)``, as ``_frexp_scale``). No sync."""
    bound, exp = _frexp_scale(scale, scale.device, torch.float32)
    bits = bound.view(torch.int32) - _HALF_BITS
    # bound > 1 (an infinite scale): every m is below it; < 0.5 (0, negative) or NaN: none is.
    mb = torch.where(bound > 1.0, 1 << _MANT_BITS, torch.where(bound >= 0.5, bits, 0))
    return torch.stack([exp, mb.to(torch.int32)])


def tensor_histogram(
    grad: torch.Tensor, es: torch.Tensor | int, mb: torch.Tensor | int,
    min_exp: int = MIN_EXP, max_exp: int = MAX_EXP,
) -> torch.Tensor:
    """One non-empty float32/float16/bfloat16 tensor's counts of |raw / s| by power of two
    (int32; int64 from 2^31 elements), ``es``/``mb`` from ``scale_bits`` (1, 0: true units).
    Written to be fused; eagerly a kernel per line."""
    bins = max_exp - min_exp + 5
    count = torch.int32 if grad.numel() < 2**31 else torch.int64
    y = grad.to(torch.float32).abs()
    b = y.view(torch.int32)
    sub = b < (1 << _MANT_BITS)  # zero or subnormal: lift into the normal range, exactly
    lifted = torch.where(sub, y * float(2**_SUBNORMAL_LIFT), y).view(torch.int32)
    exp = (lifted >> _MANT_BITS) - torch.where(sub, 126 + _SUBNORMAL_LIFT, 126)
    below = ((lifted & ((1 << _MANT_BITS) - 1)) < mb).to(torch.int32)
    k = (exp - es - below - (min_exp - 3)).clamp(2, bins - 1)
    k = torch.where(b == 0, 0, torch.where(b >= INF_BITS, 1, k))  # NaN's pattern is above inf
    idx = k.reshape(-1).to(torch.int64)
    return torch.zeros(bins, dtype=count, device=grad.device).scatter_add_(
        0, idx, torch.ones_like(idx, dtype=count))


def exponent_histogram(
    grads: Grads,
    scale: torch.Tensor | float,
    scaled: Sequence[bool] | bool,
    numels: Sequence[int] | None = None,
    min_exp: int = MIN_EXP,
    max_exp: int = MAX_EXP,
) -> torch.Tensor:
    """Float64 device counts ``(L, max_exp - min_exp + 5)``; ``scaled[i]``: gradient i is still
    scaled (divided out exactly); a ``None`` gradient counts as ``numels[i]`` zeros."""
    flags = [scaled] * len(grads) if isinstance(scaled, bool) else list(scaled)
    bins = max_exp - min_exp + 5
    device = next((g.device for g in grads if g is not None), None)
    if device is None:
        device = scale.device if isinstance(scale, torch.Tensor) else torch.device("cpu")
    counts = torch.zeros(len(grads) * bins, dtype=torch.int64, device=device)
    absent = [(i, (numels[i] if numels is not None else 0)) for i, g in enumerate(grads)
              if g is None]
    present = [i for i, g in enumerate(grads) if g is not None and g.numel() > 0]
    dtype = torch.float64 if any(
        grads[i].dtype == torch.float64 for i in present) else torch.float32  # type: ignore[union-attr]
    ms, es = _frexp_scale(scale, device, dtype)
    one_m = torch.full((), 0.5, dtype=dtype, device=device)  # scale 1 = 0.5 * 2^1
    one_e = torch.ones((), dtype=torch.int32, device=device)
    groups: list[list[int]] = []
    size = 0
    for i in present:
        n = grads[i].numel()  # type: ignore[union-attr]
        if groups and size + n > GROUP_ELEMS:
            groups.append([])
            size = 0
        if not groups:
            groups.append([])
        groups[-1].append(i)
        size += n
    ones = torch.ones((), dtype=torch.int64, device=device)
    for group in groups:
        parts = [grads[i].detach().reshape(-1).to(device=device, dtype=dtype)  # type: ignore[union-attr]
                 for i in group]
        a = (parts[0] if len(parts) == 1 else torch.cat(parts)).abs()
        sizes = [grads[i].numel() for i in group]  # type: ignore[union-attr]
        n = int(a.numel())
        if all(flags[i] for i in group):
            m_s, e_s = ms, es
        elif not any(flags[i] for i in group):
            m_s, e_s = one_m, one_e
        else:
            counts_t = device_tensor(sizes, torch.int64, device)
            sel = device_tensor([flags[i] for i in group], torch.bool, device)
            sel = torch.repeat_interleave(sel, counts_t, output_size=n)
            m_s, e_s = torch.where(sel, ms, one_m), torch.where(sel, es, one_e)
        mant, exp = torch.frexp(a)
        # bin = floor(log2 |g|) - MIN_EXP + 3, clamped to the two edge bins; 0 and non-finite
        # (whose frexp is meaningless here) are set apart afterwards.
        b = exp.sub_(e_s + (min_exp - 3)).sub_((mant < m_s).to(torch.int32))
        b.clamp_(2, bins - 1)
        b = torch.where(a == 0, 0, b)
        b = torch.where(torch.isfinite(a), b, 1)
        idx = _offsets(device, group, sizes, bins) + b
        counts.index_add_(0, idx, ones.expand(n))
    out = counts.view(len(grads), bins).to(torch.float64)
    for i, n in absent:
        out[i, 0] = float(n)
    return out
