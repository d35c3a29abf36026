"""The activation source on a real fp16 autocast loop: where FP16 underflow actually happens."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
import torch
from torch import nn

import ampscope
from ampscope import activations
from ampscope.activations import ActivationProbe, grad_output_stats
from ampscope.formats import FORMATS
from ampscope.reductions import STAT_NAMES
from ampscope.transport import MemorySender

MODULES = [
    {"index": 0, "name": "0", "module_type": "Linear"},
    {"index": 1, "name": "1", "module_type": "ReLU"},
    {"index": 2, "name": "2", "module_type": "Linear"},
    {"index": 3, "name": "3", "module_type": "ReLU"},
    {"index": 4, "name": "4", "module_type": "Linear"},
]


def train(init_scale: float, steps: int, **watch: Any) -> tuple[nn.Module, ampscope.Monitor,
                                                                MemorySender, list[int]]:
    """A tiny loss (x 1e-6) under fp16 autocast; returns the probe's hook count seen between
    steps (and asserts that the modules themselves never hold a hook)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=10**6)
    sink = MemorySender()
    mon = ampscope.watch(model, scaler, opt, sender=sink, **watch)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)
    hooks = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        loss = ((out.float() - y) ** 2).mean() * 1e-6
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        assert sum(len(m._forward_hooks) for m in model.modules()) == 0
        hooks.append(0 if mon._probe is None else mon._probe.hook_count())
    mon.close()
    return model, mon, sink, hooks


def records(sink: MemorySender) -> list[dict[str, Any]]:
    return [r for p in sink.payloads() for r in p["records"]]


class TestActivationSource:
    def test_underflow_at_scale_1_disappears_at_2_16(self) -> None:
        _, _, low, _ = train(1.0, 1, activation_every=1)
        _, _, high, _ = train(2.0**16, 1, activation_every=1)
        at1 = records(low)[0]["activations"]
        at16 = records(high)[0]["activations"]
        # Module "3" (ReLU) passes the fp16 gradient of the last Linear's input: at scale 1 the
        # 1e-6 loss's gradient is below fp16's smallest subnormal and flushes to zero.
        assert at1["zero_frac"][3] >= 0.9 and at1["amax"][3] == 0.0
        assert at16["zero_frac"][3] <= 0.1 and at16["amax"][3] > 0.0
        assert sum(at1["zero_frac"]) > sum(at16["zero_frac"]) + 2.0
        # true units: at scale 1 the last module's largest gradient is quantised to fp16's
        # smallest subnormal; at 2^16 its real (smaller) magnitude shows.
        assert at1["amax"][4] == 2.0**-24 and 2.0**-26 < at16["amax"][4] < 2.0**-24

    def test_sampled_every_n_with_no_hooks_between_samples(self) -> None:
        _, mon, sink, hooks = train(2.0**10, 7, activation_every=3)
        recs = records(sink)
        assert [r["activations"] is not None for r in recs] == [
            True, False, False, True, False, False, True]
        # armed for the next sampled step right after the update before it, removed at capture
        assert hooks == [0, 0, 1, 0, 0, 1, 0]
        assert mon.modules == MODULES
        payloads = sink.payloads()
        assert payloads[0]["modules"] == MODULES

    def test_a_wrapped_models_module_table_is_canonical(self) -> None:
        """``torch.compile`` (``_orig_mod.``) and DataParallel-style ``module.`` wrappers leave
        the module names of the plain model, as the layer table does."""
        inner = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                              nn.Linear(64, 4))
        wrapper = nn.DataParallel(cast(nn.Module, torch.compile(inner, backend="eager")))
        raw = [n for n, m in wrapper.named_modules() if not list(m.children())]
        assert raw == [f"module._orig_mod.{i}" for i in range(5)]
        mon = ampscope.watch(wrapper, torch.amp.GradScaler("cpu"), server=None)
        assert mon.modules == MODULES
        mon.close()

    def test_off_sends_no_module_table_and_no_hooks(self) -> None:
        _, mon, sink, hooks = train(2.0**10, 2, activation_every=0)
        assert mon.modules is None and hooks == [0, 0]
        assert all(p["modules"] is None for p in sink.payloads())
        assert all(r["activations"] is None for r in records(sink))

    def test_close_removes_armed_hooks(self) -> None:
        _, mon, _, hooks = train(2.0**10, 1, activation_every=1)
        assert hooks == [1] and mon.state is ampscope.monitor.HookState.CLOSED
        assert mon._probe is not None and mon._probe.hook_count() == 0


class TestGradOutputStats:
    def test_fp16_edges_in_raw_units(self) -> None:
        fmt = FORMATS["fp16"]
        g = torch.tensor([0.0, 2.0**-24, 2.0**-15, 1.0, -4.0, math.nan, math.inf],
                         dtype=torch.float16)
        amax, amin, zero, sub, under, nans, infs, l2 = grad_output_stats(g, fmt).tolist()
        assert (amax, amin, nans, infs) == (4.0, 2.0**-24, 1.0, 1.0)
        assert (zero, sub, under) == (1 / 7, 2 / 7, 0.0)
        assert l2 == pytest.approx(math.sqrt(17 + 2.0**-48 + 2.0**-30))

    def test_all_nonfinite_has_no_amax(self) -> None:
        out = grad_output_stats(torch.tensor([math.nan, math.inf]), FORMATS["fp16"]).tolist()
        assert math.isnan(out[0]) and math.isnan(out[1]) and out[7] == 0.0


class TestFusedReduction:
    """The probe keeps the gradients and reduces them together; the result must be what
    ``grad_output_stats`` gives for each gradient alone, however the flushes split them."""

    # 1: every gradient reduced alone in its hook; 2048: the 32x64 ones alone, the 32x4 one kept;
    # 3000: all kept, flushed in several groups; the default: all kept, one flush at collect.
    @pytest.mark.parametrize("flush", [1, 2048, 3000, activations.FLUSH_ELEMS])
    @pytest.mark.parametrize("poison", [None, math.nan, math.inf])
    def test_equals_per_gradient_stats(self, monkeypatch: pytest.MonkeyPatch, flush: int,
                                       poison: float | None) -> None:
        monkeypatch.setattr(activations, "FLUSH_ELEMS", flush)
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.LayerNorm(64),
                              nn.Linear(64, 4))
        fmt = FORMATS["fp16"]

        def fail(exc: Exception) -> None:
            raise exc

        probe = ActivationProbe(model, fmt, on_error=fail)
        seen: dict[int, torch.Tensor] = {}
        for i, m in enumerate(model):
            def keep(mod: nn.Module, inp: Any, out: torch.Tensor, i: int = i) -> None:
                out.register_hook(lambda g: seen.__setitem__(i, g.clone()))
            m.register_forward_hook(keep)
        x = torch.randn(32, 8)
        if poison is not None:
            x[5, 2] = poison
        scale = 2.0**12
        probe.arm()
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        (out.float().square().mean() * 1e-3 * scale).backward()
        got = probe.collect(torch.tensor(scale), torch.device("cpu"))
        assert got is not None and probe.hook_count() == 0
        block = got.view(len(STAT_NAMES), len(model)).T.tolist()
        assert sorted(seen) == list(range(len(model)))
        for i, g in seen.items():
            want = grad_output_stats(g, fmt)
            want[[0, 1, 7]] /= scale
            for a, b in zip(block[i], want.tolist(), strict=True):
                assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12)
        if poison is not None:
            assert any(row[5] > 0 or row[6] > 0 for row in block)


class TestCompile:
    def test_sampling_goes_on_while_a_compile_runs_elsewhere(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        """``torch.compiler.is_compiling()`` answers True on every thread while any compile
        runs (the fused read's, on its background thread: 38,327 of 38,332 polls of the
        training thread, #29); the probe asks ``is_dynamo_compiling()``, True only in a trace,
        and keeps sampling."""
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        _, mon, sink, _ = train(2.0**16, 5, activation_every=2)
        got = [r["activations"] is not None for r in records(sink)]
        assert got == [True, False, True, False, True]
        assert mon._probe is not None and not mon._probe.off

    def test_a_compiled_model_trains_without_a_graph_break_or_a_warning(self) -> None:
        """The armed probe stays out of the compiled graph (one graph, no break) and torch's
        warning about global hooks and torch.compile(module) is not raised into the loop."""
        import warnings

        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        compiled = torch.compile(model, backend="eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu")
        sender = MemorySender()
        x, y = torch.randn(4, 8), torch.randn(4, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # as a process started with -W error
            mon = ampscope.watch(model, scaler, opt, sender=sender, activation_every=1,
                                 layer_every=1)
            for _ in range(6):
                opt.zero_grad()
                loss = ((compiled(x) - y) ** 2).mean()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
        mon.close()
        assert dict(counters["graph_break"]) == {}
        # one graph traced with the armed hook (step 0), one without: the probe arms no more
        assert counters["stats"]["unique_graphs"] == 2
        assert mon._probe is not None and mon._probe.off and not mon._probe.armed
        records = [r for p in sender.payloads() for r in p["records"]]
        assert [r["step"] for r in records] == list(range(6))
        assert all(r["layers"] is not None for r in records)
        assert [r["activations"] for r in records] == [None] * 6  # all inside the graph
