"""The sampled FP32 shadow step (``watch(..., shadow_every=N)``; contract "Wire v6").

Every N-th applied step the re-check's closure runs again in FP32 from the step's weights and
batch, each layer's gradient compared with the AMP one as captured (true units, before any
clip): ``rel_err = ||g_amp - g_fp32|| / ||g_fp32||``, the cosine, ``||g_fp32||`` (rel_err is
judged only where it is not negligible) and the FP32 loss. It runs when torch calls the optimizer
inside ``scaler.step`` (the step is applied, known on the host), before a weight moves; never
for an optimizer applying ``found_inf`` itself (no host-side skip), nor where the re-check is
off. Errors are recorded, never raised. Cost: an int compare per step; on a shadow step a
gradient copy, an FP32 forward and backward, four device reductions per layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ampscope.recheck import RecheckFn, failure, fp32_grads, fp32_run

__all__ = ["Shadow", "block_size", "run_shadow", "snapshot"]

F64 = torch.float64


def block_size(num_layers: int) -> int:
    """The shadow block's size: the FP32 loss, then rel_err, cosine and FP32 norm per layer."""
    return 1 + 3 * num_layers


Shadow = tuple[torch.Tensor, frozenset[int]] | str
"""A shadow step's result: the float64 device block ``[loss, rel_err ... (L), cosine ... (L),
norm ... (L)]`` and the layers compared on neither side (no gradient: null on the wire), or the
closure's error."""


def snapshot(
    grads: Sequence[torch.Tensor | None],
    params: Sequence[torch.nn.Parameter],
    scaled: bool | Sequence[bool],
    scale: torch.Tensor | float,
    optimizers: Sequence[torch.optim.Optimizer],
    scaling: bool,
) -> list[torch.Tensor | None]:
    """The captured gradients in true units, as copies (at least float32): a scaled one times
    the inverse scale (``unscale_``'s arithmetic). ``scaling``: the scaler is on (a layer no
    optimizer owns is then still scaled)."""
    flags = [scaled] * len(grads) if isinstance(scaled, bool) else list(scaled)
    owned = {id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]}
    if isinstance(scale, torch.Tensor):
        inv = scale.detach().double().reciprocal().float().reshape(())
    else:
        inv = torch.tensor(1.0 / scale, dtype=torch.float32)
    out: list[torch.Tensor | None] = []
    for g, p, flag in zip(grads, params, flags, strict=True):
        if g is None:
            out.append(None)
            continue
        g = g.detach()
        dtype = torch.promote_types(g.dtype, torch.float32)
        if flag or (scaling and id(p) not in owned):
            out.append(g.to(dtype) * inv.to(device=g.device, dtype=dtype))
        else:
            out.append(g.to(dtype, copy=True))
    return out


def run_shadow(
    fn: RecheckFn, model: torch.nn.Module, params: Sequence[torch.nn.Parameter],
    amp: Sequence[torch.Tensor | None],
) -> Shadow:
    """Run ``fn`` in FP32 and compare its gradients with ``amp`` per layer, on the device."""
    try:
        with fp32_run(model, params):
            loss, grads = fp32_grads(fn(), params)
            return compare(loss, amp, grads)
    except Exception as exc:
        return failure(exc)


def compare(
    loss: torch.Tensor, amp: Sequence[torch.Tensor | None],
    fp32: Sequence[torch.Tensor | None],
) -> tuple[torch.Tensor, frozenset[int]]:
    """``[loss, rel_err ... (L), cosine ... (L), ||g_fp32|| ... (L)]`` in float64 on ``loss``'s
    device, and the layers missing a gradient on either side (0 in the block)."""
    device = loss.device
    absent: set[int] = set()
    rows: list[torch.Tensor] = []
    zero = torch.zeros(4, dtype=F64, device=device)
    for i, (a, b) in enumerate(zip(amp, fp32, strict=True)):
        if a is None or b is None:
            absent.add(i)
            rows.append(zero)
            continue
        a64 = a.detach().to(device=device, dtype=F64).reshape(-1)
        b64 = b.detach().to(device=device, dtype=F64).reshape(-1)
        rows.append(torch.stack([torch.linalg.vector_norm(a64 - b64),
                                 torch.linalg.vector_norm(b64),
                                 torch.linalg.vector_norm(a64),
                                 torch.dot(a64, b64)]))
    if rows:
        diff, norm32, norm_amp, dot = torch.stack(rows).unbind(1)
    else:
        diff = norm32 = norm_amp = dot = torch.zeros(0, dtype=F64, device=device)
    nan = torch.full_like(diff, float("nan"))
    # ``where`` on both sides: a 0/0 in the unchosen branch is computed and then discarded.
    rel = torch.where(norm32 > 0, diff / norm32, torch.where(diff == 0, 0.0, nan))
    both_zero = (norm32 == 0) & (norm_amp == 0)
    cosine = torch.where(both_zero, 1.0, (dot / (norm32 * norm_amp)).clamp(-1.0, 1.0))
    return torch.cat([loss.to(F64).reshape(1), rel, cosine, norm32]), frozenset(absent)
