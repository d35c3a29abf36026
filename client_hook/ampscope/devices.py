"""Small host values onto the gradients' device without a host sync.

``torch.tensor(values, device="cuda")`` copies from pageable memory and waits for the copy: a host
sync on the training thread (``set_sync_debug_mode("error")`` refuses it). The hook's constants go
through pinned memory and a ``non_blocking`` copy instead, queued like a kernel, the allocator
keeping the host buffer alive until it ran. Elsewhere they are plain tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["device_tensor", "to_device"]


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (a CPU tensor) on ``device``, queued without waiting (on the CPU: ``host``)."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def device_tensor(
    values: Sequence[float] | Sequence[int] | Sequence[bool], dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)`` without the host sync."""
    return to_device(torch.tensor(values, dtype=dtype), device)
