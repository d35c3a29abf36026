"""Small host values onto the gradients' device without a host sync.

``torch.tensor(values, device="cuda")`` and ``host.to("cuda")`` copy from pageable memory and then
wait for the copy (a stream synchronisation: on the training thread, a host sync, which
``torch.cuda.set_sync_debug_mode("error")`` refuses; found by ``bench/gpu_check.sh``). The
constants the hook builds on the training thread (reduction plans, thresholds, histogram layouts)
go through pinned memory and a ``non_blocking`` copy instead: the copy is queued on the stream
like a kernel, and torch's pinned-memory allocator keeps the host buffer until it has run.
On the CPU (and any device but CUDA) they are plain tensors and copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["device_tensor", "to_device"]


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (a CPU tensor) on ``device``, queued without waiting on a CUDA device; on the
    CPU, ``host`` itself."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def device_tensor(
    values: Sequence[float] | Sequence[int] | Sequence[bool], dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)`` without the host sync."""
    return to_device(torch.tensor(values, dtype=dtype), device)
