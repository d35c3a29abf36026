"""Host constants onto the gradients' device: the values of ``torch.tensor``, and on CUDA no host
sync (``AMPSCOPE_TEST_DEVICE=cuda``, run by ``bench/gpu_check.sh``; the CPU has no sync to make)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from ampscope.devices import device_tensor, to_device
from ampscope.formats import FORMATS
from ampscope.reductions import GradStats
from tests.client_hook.reference import DEVICE, FP16, edge_tensor, grad_norms, reference


@contextmanager
def no_host_sync() -> Iterator[None]:
    """On CUDA, any host sync inside raises (``set_sync_debug_mode("error")``)."""
    if DEVICE.type != "cuda":
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize(("values", "dtype"), [
    ([3, -1, 2**40], torch.int64),
    ([True, False, True], torch.bool),
    ([0.5, math.inf, -2.0**-149], torch.float32),
    ([math.nan, 1e300, -0.0], torch.float64),
    ([], torch.float64),
])
def test_device_tensor_holds_torch_tensors_values(values: list[float], dtype: torch.dtype) -> None:
    with no_host_sync():
        got = device_tensor(values, dtype, DEVICE)
    want = torch.tensor(values, dtype=dtype)
    assert got.device.type == DEVICE.type and got.dtype == dtype and got.shape == want.shape
    assert repr(got.cpu().tolist()) == repr(want.tolist())  # NaN, -0.0 and ints as they are


def test_to_device_holds_the_values_the_host_tensor_had() -> None:
    host = torch.arange(6, dtype=torch.float64).view(2, 3)
    with no_host_sync():
        got = to_device(host, DEVICE)
    if DEVICE.type == "cuda":  # a queued copy owns its pinned buffer (the CPU returns `host`)
        host.zero_()
    assert got.device.type == DEVICE.type
    assert got.cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


@pytest.mark.parametrize("histogram", [False, True])
def test_a_first_eager_read_builds_its_plan_without_a_host_sync(histogram: bool) -> None:
    """The first read of a layout builds the eager plan's constants (layer of each chunk, counts,
    thresholds) and, with the histogram, its layout's offsets: all queued, none waited on."""
    flags = [True, False, True]
    grads = [edge_tensor(2.0**10, dtype, scaled, n).to(DEVICE) for dtype, scaled, n in (
        (torch.float32, True, 3000), (torch.float16, False, 999), (torch.bfloat16, True, 77))]
    stats = GradStats(FORMATS["fp16"], fused=False)
    scale = torch.tensor(2.0**10, device=DEVICE)
    with no_host_sync():
        table, counts = stats.partials(grads, scale, flags, histogram=histogram)
        out = stats.layer_stats(grads, scale, flags)
        norms = grad_norms(stats, grads, scale, flags)
    assert (counts is not None) is histogram and table.shape == (3, 8)
    want_norm, _ = reference(grads, [g.numel() for g in grads], 2.0**10, flags, FP16)
    assert out[0].item() == pytest.approx(want_norm, rel=1e-12)
    assert norms[0].item() == pytest.approx(want_norm, rel=1e-6)
