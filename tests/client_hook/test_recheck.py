"""`Monitor.recheck`: the FP32 re-check of overflow steps, on a real CPU AMP loop."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import ampscope
from ampscope.transport import MemorySender
from tests.client_hook.amp_loop import AmpLoop

Loop = AmpLoop  # its defaults: SGD at 1e-3 without momentum, initial scale 2^8


def mlp(seed: int = 0, scale: float = 1.0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model


def batches(n: int, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(16, 4, generator=gen) for _ in range(n)]


class TestPersistsOrVanishes:
    def test_nan_in_the_data_persists_in_fp32(self) -> None:
        loop = Loop(mlp())
        xs = batches(4)
        xs[2][3, 1] = math.nan
        for x in xs:
            loop.step(x)
        records = loop.records()
        assert [r["found_inf"] for r in records] == [False, False, True, False]
        assert [r["recheck"] is None for r in records] == [True, True, False, True]
        recheck = records[2]["recheck"]
        assert recheck["status"] == "persisted" and recheck["loss"] == "nan"
        # Every parameter's FP32 gradient is NaN, listed in backward order like `nonfinite`.
        assert [e["layer"] for e in recheck["layers"]] == [
            e["layer"] for e in records[2]["nonfinite"]]
        assert {e["kind"] for e in recheck["layers"]} == {"nan"}
        assert loop.calls == 1  # only the overflow step ran the closure

    def test_an_overflow_only_fp16_causes_vanishes_in_fp32(self) -> None:
        # Large weights and inputs: the FP16 backward overflows (65504) even at scale 1; the
        # same batch in FP32 is ordinary arithmetic.
        loop = Loop(mlp(scale=30.0), init_scale=1.0)
        xs = [x * 100.0 for x in batches(3)]
        for x in xs:
            loop.step(x)
        records = loop.records()
        assert all(r["found_inf"] for r in records)
        for r in records:
            assert r["recheck"]["status"] == "vanished", r["recheck"]
            assert r["recheck"]["layers"] == [] and r["recheck"]["detail"] is None
            assert isinstance(r["recheck"]["loss"], float)
            assert r["nonfinite"]  # FP16 gradients overflowed

    def test_a_scale_too_high_vanishes(self) -> None:
        loop = Loop(mlp(), init_scale=2.0**40)
        for x in batches(3):
            loop.step(x)
        first = loop.records()[0]
        assert first["found_inf"] and first["recheck"]["status"] == "vanished"
        assert math.isfinite(first["recheck"]["loss"]) and first["nonfinite"]


class TestOffByDefault:
    def test_no_closure_no_recheck(self) -> None:
        loop = Loop(mlp())
        xs = batches(2)
        xs[1][0, 0] = math.nan
        for x in xs:
            loop.step(x, closure=False)
        assert [r["recheck"] for r in loop.records()] == [None, None]

    def test_none_turns_it_off(self) -> None:
        loop = Loop(mlp())
        x = batches(1)[0]
        x[0, 0] = math.nan
        loop.step(x)
        loop.mon.recheck(None)
        loop.step(x, closure=False)
        assert [r["recheck"] is None for r in loop.records()] == [False, True]

    def test_registered_adds_no_host_read_on_healthy_steps(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        reads: list[int] = []
        original: Callable[..., Any] = torch.Tensor.item

        def counting(self: torch.Tensor) -> Any:
            reads.append(1)
            return original(self)

        counts = []
        for registered in (False, True):
            loop = Loop(mlp())
            xs = batches(3)
            loop.step(xs[0], closure=registered)  # warm-up outside the count
            monkeypatch.setattr(torch.Tensor, "item", counting)
            reads.clear()
            for x in xs[1:]:
                loop.step(x, closure=registered)
            counts.append(len(reads))
            monkeypatch.setattr(torch.Tensor, "item", original)
            loop.records()
        assert counts[0] == counts[1]  # the scaler's own .item() calls only


class TestNoSideEffects:
    def test_grads_buffers_rng_and_weights_are_left_as_they_were(self) -> None:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5),
                              nn.Linear(8, 1))
        loop = Loop(model)
        x = batches(1)[0]
        x[0, 0] = math.nan
        seen: dict[str, Any] = {}

        def fn() -> torch.Tensor:
            seen["grads"] = [p.grad.clone() if p.grad is not None else None
                             for p in model.parameters()]
            seen["buffers"] = [b.clone() for b in model.buffers()]
            seen["rng"] = torch.get_rng_state()
            return loop.loss_of(x)

        loop.mon.recheck(fn)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = loop.loss_of(x)
        loop.scaler.scale(loss).backward()
        loop.scaler.step(loop.opt)
        weights = [p.detach().clone() for p in model.parameters()]
        loop.scaler.update()
        for p, grad in zip(model.parameters(), seen["grads"], strict=True):
            assert grad is not None and p.grad is not None
            assert torch.equal(p.grad.nan_to_num(), grad.nan_to_num())
        for b, saved in zip(model.buffers(), seen["buffers"], strict=True):
            assert torch.equal(b.nan_to_num(), saved.nan_to_num())
        assert torch.equal(torch.get_rng_state(), seen["rng"])
        for p, w in zip(model.parameters(), weights, strict=True):
            assert torch.equal(p.detach(), w)
        assert loop.records()[0]["recheck"]["status"] == "persisted"


class TestFailures:
    @pytest.mark.parametrize(("fn", "detail"), [
        (lambda: (_ for _ in ()).throw(ValueError("bad batch")), "ValueError: bad batch"),
        (lambda: 3.0, "TypeError: the recheck closure must return a scalar loss tensor, got "
                      "float"),
        (lambda: torch.ones(2), "TypeError: the recheck closure must return a scalar loss "
                                "tensor, got a tensor of shape (2,)"),
    ])
    def test_a_failing_closure_is_recorded_never_raised(
        self, fn: Callable[[], Any], detail: str
    ) -> None:
        loop = Loop(mlp())
        x = batches(1)[0]
        x[0, 0] = math.nan
        loop.mon.recheck(fn)
        loop.step(x, closure=False)
        loop.step(batches(1, seed=2)[0], closure=False)
        records = loop.records()
        assert records[0]["recheck"] == {
            "status": "failed", "loss": None, "layers": [], "detail": detail, "origin": None}
        assert records[1]["recheck"] is None
        assert loop.mon.stats().internal_errors == 0


class TestFusedOptimizer:
    def test_an_optimizer_that_applies_found_inf_itself_is_rechecked_on_the_cpu(self) -> None:
        """Fused Adam is always called by scaler.step (its kernel skips the update), so the
        hook cannot see the skip from the call; on the CPU it reads found_inf (no device)."""
        model = mlp()
        loop = Loop(model)
        loop.opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        assert getattr(loop.opt, "_step_supports_amp_scaling", False)
        loop.mon.close()
        loop.sink = MemorySender()
        loop.mon = ampscope.watch(model, loop.scaler, loop.opt, server=None, sender=loop.sink,
                                  layer_every=1)
        xs = batches(3)
        xs[1][0, 0] = math.nan
        for x in xs:
            loop.step(x)
        records = loop.records()
        assert [r["recheck"] and r["recheck"]["status"] for r in records] == [
            None, "persisted", None]
        assert loop.calls == 1


class TestTwoOptimizers:
    def test_an_unwatched_second_optimizer_is_judged_by_its_own_call(self) -> None:
        """Only the first optimizer is given to watch(); the second one's skip is still seen
        from its own call, so healthy steps run no re-check."""
        torch.manual_seed(0)
        first, second = nn.Linear(4, 8), nn.Linear(8, 1)
        model = nn.Sequential(first, nn.ReLU(), second)
        opt_a = torch.optim.SGD(first.parameters(), lr=1e-3)
        opt_b = torch.optim.SGD(second.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
        sink = MemorySender()
        mon = ampscope.watch(model, scaler, opt_a, server=None, sender=sink)
        calls: list[torch.Tensor] = []

        def closure(x: torch.Tensor) -> Callable[[], torch.Tensor]:
            def fn() -> torch.Tensor:
                calls.append(x)
                loss: torch.Tensor = model(x).float().pow(2).mean()
                return loss
            return fn

        xs = batches(4)
        xs[2][0, 0] = math.nan
        for x in xs:
            mon.recheck(closure(x))
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt_a)
            scaler.step(opt_b)
            scaler.update()
            opt_a.zero_grad()
            opt_b.zero_grad()
        mon.close()
        records = [r for body in sink.payloads() for r in body["records"]]
        assert [r["recheck"] and r["recheck"]["status"] for r in records] == [
            None, None, "persisted", None]
        assert len(calls) == 1


class TestAccelerate:
    def test_the_autocast_accelerate_builds_into_forward_is_off_too(self) -> None:
        """``Accelerator(mixed_precision="bf16").prepare`` wraps ``model.forward`` in autocast:
        the re-check still runs the model in FP32, and the prepared forward is back after."""
        from accelerate import Accelerator  # type: ignore[import-untyped]

        from ampscope.recheck import run_recheck

        accelerator = Accelerator(mixed_precision="bf16", cpu=True)
        model = accelerator.prepare(nn.Sequential(nn.Linear(8, 4)))
        prepared = model.forward
        x = torch.randn(2, 8)
        assert model(x).dtype == torch.float32  # converted back to FP32 at the output...
        seen: list[torch.dtype] = []
        model[0].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
        model(x)
        assert seen == [torch.bfloat16]  # ...but computed in BF16 inside

        def loss() -> torch.Tensor:
            out: torch.Tensor = model(x)
            return out.square().mean()

        result = run_recheck(loss, model, list(model.parameters()))
        assert not isinstance(result, str) and result[0][0].item() == 1.0
        assert seen == [torch.bfloat16, torch.float32]
        assert model.forward == prepared


class TestForwardOrigin:
    """Where a forward overflow began (#30): the first module in forward order whose output
    went non-finite (or beyond FP16's range, where the autocast forward overflowed), read by
    hooks armed only inside the re-check and removed after it."""

    @staticmethod
    def hooks(model: nn.Module) -> dict[str, int]:
        return {name: len(m._forward_hooks) for name, m in model.named_modules()}

    def test_the_first_layer_is_named_when_its_fp16_output_overflows(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        model = mlp()
        with torch.no_grad():
            first = model.get_submodule("0")
            assert isinstance(first, nn.Linear)
            first.weight.mul_(1e5)  # |x W| ~ 1e5 > 65504: inf in the first Linear
        before = self.hooks(model)
        armed: list[int] = []
        register = nn.Module.register_forward_hook

        def counting(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            armed.append(loop.calls)
            return register(module, *args, **kwargs)

        monkeypatch.setattr(nn.Module, "register_forward_hook", counting)
        loop = Loop(model, init_scale=1.0)
        loop.step(batches(1)[0])
        records = loop.records()
        assert records[0]["skipped"] and records[0]["loss"] in ("inf", "nan")
        assert records[0]["recheck"]["origin"] == {
            "module": "0", "input_finite": True, "format": "fp16"}
        assert self.hooks(model) == before  # every handle removed
        # Armed once per submodule, for the one re-check only.
        assert armed == [0] * len(list(model.children()))

    def test_nan_in_the_data_begins_in_the_first_module_with_a_non_finite_input(self) -> None:
        loop = Loop(mlp())
        x = batches(1)[0]
        x[0, 0] = math.nan
        loop.step(x)
        origin = loop.records()[0]["recheck"]["origin"]
        assert origin == {"module": "0", "input_finite": False, "format": "fp32"}

    def test_a_later_layer_is_named_when_only_it_overflows(self) -> None:
        model = mlp()
        with torch.no_grad():
            last = model.get_submodule("2")
            assert isinstance(last, nn.Linear)
            last.weight.mul_(1e6)
        loop = Loop(model, init_scale=1.0)
        loop.step(batches(1)[0])
        origin = loop.records()[0]["recheck"]["origin"]
        assert origin == {"module": "2", "input_finite": True, "format": "fp16"}

    def test_no_hook_on_healthy_steps_and_no_origin_for_a_backward_overflow(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        armed: list[nn.Module] = []
        register = nn.Module.register_forward_hook

        def counting(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            armed.append(module)
            return register(module, *args, **kwargs)

        monkeypatch.setattr(nn.Module, "register_forward_hook", counting)
        loop = Loop(mlp(), init_scale=2.0**40)  # the scaled gradients overflow, not the forward
        for x in batches(3):
            loop.step(x)
        records = loop.records()
        rechecked = [r for r in records if r["recheck"] is not None]
        assert rechecked and all(r["recheck"]["origin"] is None for r in rechecked)
        assert len(armed) == len(rechecked) * 3
