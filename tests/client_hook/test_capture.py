"""The one capture shape: ``take`` on the training thread, ``finish`` on the sender thread, and
the fused and eager reads giving the same records in a real training loop."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import ampscope
from ampscope.capture import Kind, finish, global_norm, take
from ampscope.fused import LayoutState
from ampscope.histogram import NUM_BINS, exponent_histogram
from ampscope.partials import NUM_COLUMNS
from ampscope.reductions import STAT_NAMES, GradStats
from ampscope.transport import MemorySender
from tests.client_hook.reference import FP16, assert_same, edge_tensor, reference, unpack

pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

COMPILE_TIMEOUT = 600.0


def host(parts: list[Any]) -> list[float]:
    out: list[float] = []
    for part in parts:
        out += ([t.item() for t in part] if isinstance(part, list)
                else part.reshape(-1).tolist())
    return out


def edge_grads(scale: float) -> list[torch.Tensor]:
    grads = [edge_tensor(scale, torch.float32, True, 700),
             edge_tensor(scale, torch.float16, True, 90),
             edge_tensor(scale, torch.bfloat16, True, 33), torch.zeros(5)]
    grads[0][:3] = torch.tensor([math.nan, math.inf, -math.inf])
    return grads


class TestTake:
    def test_a_plain_step_takes_the_raw_norms_in_one_op(self) -> None:
        grads = edge_grads(8.0)
        parts, taken = take(GradStats(FP16, fused=False), grads, torch.tensor(8.0), True,
                            per_layer=False, histogram=False)
        assert taken.kind is Kind.NORMS and taken.scaled == (True,) * 4 and taken.float32_norms
        assert len(parts) == 1 and parts[0].shape == (4,)
        raw = parts[0].tolist()
        assert math.isnan(raw[0])  # a NaN and infs: the NaN wins, as in a sum of squares
        assert raw[3] == 0.0
        assert raw[1] == pytest.approx(grads[1].float().norm().item(), rel=1e-6)
        done = finish(taken, raw, torch.zeros(4, dtype=torch.float64), 8.0)
        assert done.layers is None and done.norms == raw and done.grad_norm is not None
        assert math.isnan(done.grad_norm)

    def test_a_per_layer_step_takes_partials_and_the_histogram_when_sampled(self) -> None:
        grads = edge_grads(2.0**10)
        stats = GradStats(FP16, fused=False)
        parts, taken = take(stats, grads, torch.tensor(2.0**10), True, per_layer=False,
                            histogram=True)
        assert taken.kind is Kind.STATS and taken.histogram and taken.path == "eager"
        table, counts = parts
        assert isinstance(table, torch.Tensor) and isinstance(counts, torch.Tensor)
        assert table.shape == (4, NUM_COLUMNS) and counts.shape == (4, NUM_BINS)
        assert taken.size(4) == 4 * (NUM_COLUMNS + NUM_BINS)
        assert counts.tolist() == exponent_histogram(grads, 2.0**10, True).tolist()

    def test_absent_and_sparse_gradients_read_as_zero_and_dense(self) -> None:
        stats = GradStats(FP16, numels=[6, 4, 3], fused=False)
        grads: list[torch.Tensor | None] = [torch.full((6,), 2.0), None,
                                            torch.tensor([3.0, 0.0, 4.0]).to_sparse()]
        parts, taken = take(stats, grads, 2.0, [True, False, True], per_layer=False,
                            histogram=False)
        raw = host(parts)
        assert raw == [pytest.approx(math.sqrt(24.0)), 0.0, 5.0] and not taken.float32_norms
        done = finish(taken, raw, torch.tensor([6.0, 4.0, 3.0], dtype=torch.float64), 2.0)
        assert done.grad_norm == pytest.approx(math.sqrt(24.0 / 4 + 25.0 / 4), rel=1e-15)


class TestChecked:
    def test_an_overflowed_layer_is_finite_and_unknown_an_inf_one_is_inf(self) -> None:
        grads = [torch.full((4,), 1e20), torch.ones(4)]
        stats = GradStats("bf16", fused=False, exact_norms=True)
        parts, taken = take(stats, grads, 1.0, False, per_layer=False, histogram=False,
                            checked=True)
        assert taken.checked and len(parts) == 2 and taken.size(2) == 4
        done = finish(taken, host(parts), torch.zeros(2, dtype=torch.float64), None)
        assert (done.grad_norm, done.norms) == (None, [None, 2.0])
        grads[0][1] = -math.inf
        parts, taken = take(stats, grads, 1.0, False, per_layer=False, histogram=False,
                            checked=True)
        done = finish(taken, host(parts), torch.zeros(2, dtype=torch.float64), None)
        assert (done.grad_norm, done.norms) == (math.inf, [math.inf, 2.0])


class TestFinish:
    @pytest.mark.parametrize("scale", [1.0, 3.0, 2.0**10, 2.0**24, 0.5])
    @pytest.mark.parametrize("flags", [(True,) * 4, (False, True, False, True)])
    def test_the_host_finish_is_the_device_finalize(self, scale: float,
                                                    flags: tuple[bool, ...]) -> None:
        """The sender thread's numbers equal ``GradStats.layer_stats`` (the same pure
        ``partials.finalize``, run on the device) bit for bit, and NumPy's."""
        grads = edge_grads(scale)
        stats = GradStats(FP16, fused=False)
        parts, taken = take(stats, grads, torch.tensor(scale), list(flags), per_layer=True,
                            histogram=False)
        numels = torch.tensor([g.numel() for g in grads], dtype=torch.float64)
        done = finish(taken, host(parts), numels, scale)
        want_norm, want = unpack(stats.layer_stats(grads, scale, list(flags)).tolist(), 4)
        assert done.layers is not None
        layers = dict(zip(STAT_NAMES, done.layers.stats.tolist(), strict=True))
        assert repr(layers) == repr(want) and repr(done.grad_norm) == repr(want_norm)
        ref_norm, ref = reference(grads, [g.numel() for g in grads], scale, list(flags), FP16)
        for name in STAT_NAMES:
            for got, w in zip(layers[name], ref[name], strict=True):
                assert_same(got, w)
        assert done.grad_norm is not None
        assert_same(done.grad_norm, ref_norm)

    @pytest.mark.parametrize("raw,scale,want", [
        ([3.0, 4.0], 2.0, 2.5),
        ([3.0, math.inf, 1.0], 2.0, math.inf),
        ([math.nan, math.inf], 2.0, math.nan),
        ([0.0, 0.0], 0.0, math.nan),
        ([1.0], 0.0, math.inf),
        ([1.0], None, None),
    ])
    def test_the_global_norm_equals_the_device_computation(
        self, raw: list[float], scale: float | None, want: float | None
    ) -> None:
        got = global_norm(raw, scale, [True] * len(raw))
        if scale is not None:  # the device twin: reference.grad_norms' arithmetic
            v = torch.tensor(raw, dtype=torch.float64)
            device = (torch.dot(v, v).sqrt() / scale).item()
            assert repr(got) == repr(device)
        if want is None or math.isnan(want):
            assert got is want or (got is not None and math.isnan(got))
        else:
            assert got == want

    def test_the_global_norm_of_raw_norms(self) -> None:
        assert global_norm([3.0, 4.0], None, [False, False]) == 5.0
        assert global_norm([3.0, 4.0], None, [True, False]) is None
        assert global_norm([6.0, 4.0], 2.0, [True, False]) == 5.0
        assert math.isnan(global_norm([math.inf, math.nan], 2.0, [True, True]) or 0.0)
        assert global_norm([math.inf, 1.0], 2.0, [True, True]) == math.inf
        assert global_norm([1.0], 0.0, [True]) == math.inf  # a collapsed scale, as IEEE
        assert global_norm([], 2.0, []) == 0.0


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


@pytest.mark.compile
class TestFusedAgainstEager:
    def test_a_real_training_loop_sends_the_same_records(self) -> None:
        """Two copies of a model, each with its own real GradScaler and monitor, one on the
        compiled kernel (waited for, histogram variant included), one on the eager fallback:
        every record's per-layer stats and histogram agree to the last bit (the l2 and the norm
        to float64 rounding: the sums of squares are added in different orders). The gradients
        are real, plus zeros, fp16-subnormal and underflowing values at the scale, and one step
        with a NaN and an inf (skipped, the scale backs off)."""
        models = [tiny_model(), tiny_model()]
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
        scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**14) for _ in models]
        senders = [MemorySender(), MemorySender()]
        mons = [ampscope.watch(m, s, o, sender=snd, layer_every=1, histogram_every=2,
                               activation_every=0, fused=fused)
                for m, s, o, snd, fused in zip(models, scalers, opts, senders, (True, False),
                                               strict=True)]
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        nn.functional.cross_entropy(models[0](x), y).backward()
        grads = [p.grad for p in models[0].parameters()]
        for histogram in (False, True):
            state = mons[0]._stats.wait_fused(grads, True, COMPILE_TIMEOUT, histogram=histogram)
            assert state is LayoutState.READY
        paths = []
        for step in range(6):
            for model, opt, scaler, mon in zip(models, opts, scalers, mons, strict=True):
                opt.zero_grad(set_to_none=True)
                scaler.scale(nn.functional.cross_entropy(model(x), y)).backward()
                with torch.no_grad():
                    grad = model.get_submodule("2").weight.grad
                    assert isinstance(grad, torch.Tensor)
                    w = grad.view(-1)
                    w[:4] = torch.tensor([0.0, 2.0**-20, 2.0**-30, -(2.0**-26)])
                    if step == 3:
                        w[4:6] = torch.tensor([math.nan, math.inf])
                scaler.step(opt)
                scaler.update()
                paths.append(mon._stats.last_path)
        for mon in mons:
            mon.close()
        assert paths == ["fused", "eager"] * 6
        fused, eager = ([r for p in snd.payloads() for r in p["records"]] for snd in senders)
        assert len(fused) == len(eager) == 6
        assert [r["skipped"] for r in fused] == [False, False, False, True, False, False]
        assert fused[3]["nonfinite"] == eager[3]["nonfinite"] == [{"layer": 2, "kind": "nan"}]
        for got, want in zip(fused, eager, strict=True):
            assert (got["histogram"] is None) == (got["step"] % 2 == 1)
            assert got["histogram"] == want["histogram"]
            assert got["scale_before"] == want["scale_before"]
            for name in STAT_NAMES:
                if name == "l2":
                    assert got["layers"][name] == pytest.approx(want["layers"][name], rel=1e-12)
                else:
                    assert got["layers"][name] == want["layers"][name], name
            if got["grad_norm"] == "nan":
                assert want["grad_norm"] == "nan"
            else:
                assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-12)
        counts = fused[0]["histogram"]["counts"]
        assert [sum(row) for row in counts] == [p.numel() for p in models[0].parameters()]
        assert counts[2][0] >= 1  # the zero placed in layer 2
