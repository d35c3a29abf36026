"""The sampled exponent histogram of the ``param`` gradients (DESIGN.md §3, contract "Wire v2").

Per layer, counts of |g| (true units) by power of two over ``[2^MIN_EXP, 2^(MAX_EXP+1))`` plus four
edge bins. Row layout, ``NUM_BINS = MAX_EXP - MIN_EXP + 5`` entries:

* ``[0]`` |g| = 0, ``[1]`` non-finite (NaN or ±inf), ``[2]`` 0 < |g| < 2^MIN_EXP,
* ``[3 + k]`` 2^(MIN_EXP+k) ≤ |g| < 2^(MIN_EXP+k+1) for k = 0 … MAX_EXP - MIN_EXP,
* ``[last]`` |g| ≥ 2^(MAX_EXP+1).

Exactness. True units are g = raw / s for a gradient captured before ``unscale_`` (raw = g·s).
The bin is computed from ``frexp`` of raw and of s without dividing: with raw = m·2^e and
s = ms·2^es (mantissas in [0.5, 1)), floor(log2 |g|) = e - es - (1 if |m| < ms else 0). This is
the exact floor of the mathematical quotient for any scale, so no value near a bin edge (or a
raw subnormal that the division would flush) lands in the wrong bin.

Cost. All layers of a group are copied once into one flat buffer (float32, or float64 when a
gradient is float64); the bin of every element is a handful of elementwise kernels, and the
per-layer counts are one ``index_add_`` over ``layer * NUM_BINS + bin``: a constant number of
launches per group of at most ``GROUP_ELEMS`` elements, never one per layer. No host sync
(``bincount`` is avoided on purpose: on CUDA it reads the maximum back to size its output).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["GROUP_ELEMS", "MAX_EXP", "MIN_EXP", "NUM_BINS", "exponent_histogram"]

MIN_EXP = -40
MAX_EXP = 20
NUM_BINS = MAX_EXP - MIN_EXP + 5

GROUP_ELEMS = 1 << 24
"""Elements per pass: bounds the transient buffers (flat values plus an int64 bin index)."""

Grads = Sequence["torch.Tensor | None"]


def _frexp_scale(scale: torch.Tensor | float, device: torch.device) -> tuple[torch.Tensor, ...]:
    s = (scale.detach().to(device=device, dtype=torch.float64).reshape(())
         if isinstance(scale, torch.Tensor)
         else torch.full((), float(scale), dtype=torch.float64, device=device))
    mant, exp = torch.frexp(s)
    return mant, exp.to(torch.int64)


def exponent_histogram(
    grads: Grads,
    scale: torch.Tensor | float,
    scaled: Sequence[bool] | bool,
    numels: Sequence[int] | None = None,
    min_exp: int = MIN_EXP,
    max_exp: int = MAX_EXP,
) -> torch.Tensor:
    """Counts as a float64 device tensor of shape ``(L, max_exp - min_exp + 5)`` (exact integers).

    ``scaled[i]``: gradient i is still multiplied by ``scale`` (divided out here, exactly). A
    ``None`` gradient counts as ``numels[i]`` zeros (PyTorch's meaning of a missing gradient).
    """
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
    ms, es = _frexp_scale(scale, device)
    one_m = torch.full((), 0.5, dtype=torch.float64, device=device)
    one_e = torch.ones((), dtype=torch.int64, device=device)
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
    for group in groups:
        parts = [grads[i].detach().reshape(-1).to(device=device, dtype=dtype)  # type: ignore[union-attr]
                 for i in group]
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)
        sizes = torch.tensor([grads[i].numel() for i in group],  # type: ignore[union-attr]
                             dtype=torch.int64, device=device)
        n = int(flat.numel())
        layer = torch.tensor(group, dtype=torch.int64, device=device)
        per_elem = torch.repeat_interleave(layer, sizes, output_size=n)
        if all(flags[i] for i in group):
            m_s, e_s = ms, es
        elif not any(flags[i] for i in group):
            m_s, e_s = one_m, one_e
        else:
            sel = torch.tensor([flags[i] for i in group], dtype=torch.bool, device=device)
            sel = torch.repeat_interleave(sel, sizes, output_size=n)
            m_s, e_s = torch.where(sel, ms, one_m), torch.where(sel, es, one_e)
        a = flat.abs()
        mant, exp = torch.frexp(a)
        floor_log2 = exp.to(torch.int64) - e_s - (mant.to(torch.float64) < m_s).to(torch.int64)
        b = (floor_log2 - min_exp).clamp_(-1, max_exp - min_exp + 1).add_(3)
        b = torch.where(a == 0, torch.zeros_like(b), b)
        b = torch.where(torch.isfinite(a), b, torch.ones_like(b))
        idx = per_elem.mul_(bins).add_(b)
        counts.index_add_(0, idx, torch.ones((), dtype=torch.int64, device=device).expand(n))
    out = counts.view(len(grads), bins).to(torch.float64)
    for i, n in absent:
        out[i, 0] = float(n)
    return out
