"""The sampled FP32 shadow step (``watch(..., shadow_every=N)``; contract "Wire v6").

Every N-th optimizer step that is applied (the scaler did not skip it), the re-check's closure
(``Monitor.recheck``) is run once more with autocast off and no loss scaling, from the same
weights and batch as the step's AMP forward, and each layer's FP32 gradient is compared with the
AMP step's:

* ``rel_err = ||g_amp - g_fp32||_2 / ||g_fp32||_2`` (NaN when the FP32 norm is 0 and the
  difference is not; 0 when both are 0): how far the low-precision step's gradient is from what
  FP32 computes, in the layer's own units;
* the cosine similarity of the two (1 when both are 0; NaN when one is);
* ``||g_fp32||_2`` itself: the server judges a layer's rel_err only where this norm is not
  negligible beside the other layers' (a layer whose true gradient is 0, a bias before a
  BatchNorm, has an FP32 norm of rounding noise, and any AMP difference is huge beside it);
* the FP32 loss, beside the step's AMP loss.

Which gradients. ``g_amp`` is the gradient the capture read (``StepCycle.capture``, at the
cycle's first ``unscale_``/``step``, before any clipping) in true units: the scaled gradient
times the scaler's inverse scale, exactly as ``unscale_`` computes it; a layer no watched
optimizer owns keeps its scale (the scaler never unscales it) and is divided too. It is copied
(``snapshot``) only on a capture whose step would be a shadow step if applied; a step the scaler
then skips drops the copy, and the next applied step is the shadow step.

When. The FP32 run happens inside ``scaler.step``, when torch calls the optimizer (it does so
only when ``found_inf`` was 0: the applied step, known on the host for free, ``step.py``) and
before that call updates a weight: the forward sees exactly the weights the AMP forward used.
Without a scaler (BF16, FP32 training), before the first watched optimizer steps. Not run for an
optimizer that applies ``found_inf`` itself (fused or capturable Adam: always called, its skip
unknown on the host without a sync) nor where the re-check is off (DeepSpeed, distributed).

Guarantees (``recheck.fp32_run``, shared with the re-check): gradients come from
``torch.autograd.grad`` (``.grad`` is untouched), the RNG is forked, the model's buffers are
restored, an exception raised by the closure or its backward is recorded (the wire's
``{"status": "failed", "detail": ...}``), never raised, and nothing is left on the user's
objects.

Cost: nothing on other steps (an int compare at the capture and in the optimizer's wrapper); on
a shadow step one copy of the gradients at the capture, one FP32 forward and backward, and per
layer four float64 reductions on the device (the FP32 norm sent is one of them). The block stays
on the device and joins the step's one host copy (``cycle.StepCycle.build``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ampscope.recheck import RecheckFn, failure, fp32_grads, fp32_run

__all__ = ["Shadow", "block_size", "run_shadow", "snapshot"]

F64 = torch.float64


def block_size(num_layers: int) -> int:
    """The shadow block's values: the FP32 loss, then rel_err, cosine and the FP32 norm per
    layer."""
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
    the inverse scale (``unscale_``'s own arithmetic), one the loop unscaled already copied.
    ``scaling``: the scaler is on (a layer no optimizer owns is then still scaled)."""
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
    """Run ``fn`` in FP32 and compare its gradients with ``amp`` (``snapshot``'s) per layer,
    on the device (no sync)."""
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
    device, and the layers missing a gradient on either side (their entries are 0 in the
    block)."""
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
