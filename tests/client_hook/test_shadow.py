"""``watch(..., shadow_every=N)``: the sampled FP32 shadow step, on a real CPU fp16 AMP loop."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import ampscope
from ampscope.shadow import compare
from ampscope.transport import MemorySender
from tests.client_hook.amp_loop import AmpLoop

REL_TOL = 1e-12
"""The hook's rel_err, cosine and FP32 norm against the test's own: the same FP32 gradients,
the norms in float64 both ways (only the order of the float64 sums may differ)."""


class Loop(AmpLoop):
    """The shared loop (``amp_loop.AmpLoop``) with momentum, so a shadow step that moved a
    weight or a buffer would show in the next steps."""

    def __init__(self, model: nn.Module, *, opt_params: Any = None, **watch: Any) -> None:
        super().__init__(model, lr=1e-2, momentum=0.9, init_scale=2.0**10,
                         opt_params=opt_params, **watch)


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 1))


def batches(n: int, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(32, 4, generator=gen) * 3 for _ in range(n)]


def reference(loop: Loop, x: torch.Tensor) -> dict[str, Any]:
    """At the shadow step's point (the gradients final, no weight moved): the AMP gradients in
    true units, the model's FP32 gradients and loss (autocast off), and a float64 model's."""
    scale = loop.scaler.get_scale()
    params = list(loop.model.parameters())
    amp = [p.grad.double() / scale if p.grad is not None else None for p in params]
    with torch.autocast("cpu", enabled=False):
        loss32 = loop.loss_of(x)
        g32 = torch.autograd.grad(loss32, params, allow_unused=True)
        m64 = copy.deepcopy(loop.model).double()
        loss64 = m64(x.double()).pow(2).mean()
        g64 = torch.autograd.grad(loss64, list(m64.parameters()), allow_unused=True)
    return {"amp": amp, "g32": g32, "g64": g64, "loss32": loss32.item(),
            "loss64": loss64.item()}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b.double()).norm() / b.double().norm())


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    b = b.double()
    return float(a.reshape(-1) @ b.reshape(-1) / (a.norm() * b.norm()))


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    loss: torch.Tensor = model(x).float().pow(2).mean()
    return loss


class TestCadence:
    def test_every_nth_applied_step_and_never_a_skipped_one(self) -> None:
        loop = Loop(mlp(), shadow_every=3)
        xs = batches(11)
        xs[5][0, 0] = math.nan  # step 5 would be the 6th applied step: skipped, so step 6 is
        for x in xs:
            loop.step(x)
        records = loop.records()
        assert [r["skipped"] for r in records] == [i == 5 for i in range(11)]
        # Applied steps 1..10 are steps 0-4 and 6-10: the 3rd, 6th and 9th are 2, 6 and 9.
        assert [r["step"] for r in records if "shadow" in r] == [2, 6, 9]
        assert records[5]["recheck"]["status"] == "persisted"
        assert all(records[s]["shadow"]["status"] == "ok" for s in (2, 6, 9))
        # One FP32 re-run per shadow step and one for the overflow's re-check.
        assert loop.calls == 4

    def test_off_by_default(self) -> None:
        loop = Loop(mlp())
        for x in batches(4):
            loop.step(x)
        assert loop.calls == 0
        assert all("shadow" not in r for r in loop.records())

    def test_nothing_without_a_closure(self) -> None:
        loop = Loop(mlp(), shadow_every=1)
        xs = batches(4)
        for x in xs[:2]:
            loop.step(x, closure=False)
        for x in xs[2:]:
            loop.step(x)
        assert [r["step"] for r in loop.records() if "shadow" in r] == [2, 3]

    def test_the_bf16_path_without_a_scaler_is_shadowed_too(self) -> None:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        sink = MemorySender()
        mon = ampscope.watch(model, None, opt, server=None, sender=sink, shadow_every=2)
        for x in batches(4):
            mon.recheck(functools.partial(loss_of, model, x))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(model, x)
            mon.record_loss(loss).backward()
            opt.step()
            opt.zero_grad()
        mon.close()
        records = [r for body in sink.payloads() for r in body["records"]]
        assert [r["step"] for r in records if "shadow" in r] == [1, 3]
        # bf16's 8-bit significand: the gradients are ~0.1-1 % off FP32's, never 0.
        errs = [e for r in records if "shadow" in r for e in r["shadow"]["rel_err"]]
        assert all(1e-5 < e < 0.1 for e in errs)


class TwoAndUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.unused = nn.Linear(4, 8), nn.Linear(8, 1), nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(torch.tanh(self.a(x)))
        return out


class TestValues:
    def test_rel_err_cosine_norm_and_loss_equal_the_reference_at_the_same_point(self) -> None:
        loop = Loop(mlp(), shadow_every=2)
        xs = batches(4)
        refs: dict[int, dict[str, Any]] = {}
        loop.before_step = lambda x: refs.setdefault(len(refs), reference(loop, x))
        for x in xs:
            loop.step(x)
        records = loop.records()
        assert [r["step"] for r in records if "shadow" in r] == [1, 3]
        for s in (1, 3):
            shadow, ref = records[s]["shadow"], refs[s]
            assert shadow["loss"] == ref["loss32"]  # the same FP32 forward, bit for bit
            assert shadow["detail"] is None
            for i, (a, g32, g64) in enumerate(zip(ref["amp"], ref["g32"], ref["g64"],
                                                  strict=True)):
                assert shadow["rel_err"][i] == pytest.approx(rel_err(a, g32), rel=REL_TOL)
                assert shadow["cosine"][i] == pytest.approx(cosine(a, g32), rel=REL_TOL)
                # The FP32 gradient's own norm, in true units (no scale anywhere in FP32).
                assert shadow["norm"][i] == pytest.approx(float(g32.double().norm()),
                                                          rel=REL_TOL)
                assert shadow["norm"][i] > 0
                # What the shadow measures is fp16's error: FP32's own (against float64) is
                # four orders smaller, so the float64 model's rel_err is the same to 1e-6.
                assert 1e-5 < shadow["rel_err"][i] < 1e-1
                assert shadow["rel_err"][i] == pytest.approx(rel_err(a, g64), abs=1e-6)

    def test_a_layer_without_a_gradient_is_null_and_an_unowned_one_is_in_true_units(
        self
    ) -> None:
        torch.manual_seed(0)
        model = TwoAndUnused()
        # The scaler unscales only what the optimizer holds: layer b's gradient keeps its scale.
        loop = Loop(model, opt_params=model.a.parameters(), shadow_every=1)
        refs: list[dict[str, Any]] = []
        loop.before_step = lambda x: refs.append(reference(loop, x))
        loop.step(batches(1)[0])
        shadow, ref = loop.records()[0]["shadow"], refs[0]
        assert shadow["rel_err"][4:] == [None, None] and shadow["cosine"][4:] == [None, None]
        assert shadow["norm"][4:] == [None, None]
        for i in range(4):
            assert shadow["rel_err"][i] == pytest.approx(
                rel_err(ref["amp"][i], ref["g32"][i]), rel=REL_TOL)
            assert shadow["norm"][i] == pytest.approx(float(ref["g32"][i].double().norm()),
                                                      rel=REL_TOL)
            assert shadow["rel_err"][i] < 1e-1


class TestNoSideEffects:
    def test_a_shadowed_run_trains_exactly_as_one_without(self) -> None:
        """Dropout, BatchNorm, momentum: the weights, the optimizer's state, the buffers, the
        last step's gradients and the RNG equal those of the same run without shadow steps."""
        runs = []
        for every in (0, 1):
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.Dropout(0.3),
                                  nn.ReLU(), nn.Linear(16, 1))
            loop = Loop(model, shadow_every=every)
            grads: list[list[torch.Tensor]] = []
            loop.before_step = lambda x, loop=loop, grads=grads: grads.append(
                [p.grad.clone() for p in loop.model.parameters() if p.grad is not None])
            grad_ids: list[list[int]] = []
            original = loop.opt.step

            def step(*args: Any, grad_ids: list[list[int]] = grad_ids,
                     model: nn.Module = model, original: Any = original, **kwargs: Any) -> Any:
                grad_ids.append([id(p.grad) for p in model.parameters()])
                return original(*args, **kwargs)
            loop.opt.step = step  # type: ignore[method-assign]
            for x in batches(5):
                loop.step(x)
            records = loop.records()
            runs.append((model, loop, grads, grad_ids, torch.get_rng_state(), records))
        (m0, l0, g0, _, rng0, r0), (m1, l1, g1, i1, rng1, r1) = runs
        assert sum("shadow" in r for r in r1) == 5 and l1.calls == 5
        assert all("shadow" not in r for r in r0)
        assert torch.equal(rng0, rng1)
        for a, b in zip(m0.state_dict().values(), m1.state_dict().values(), strict=True):
            assert torch.equal(a, b)
        for a, b in zip(l0.opt.state.values(), l1.opt.state.values(), strict=True):
            assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
        for step0, step1 in zip(g0, g1, strict=True):
            for a, b in zip(step0, step1, strict=True):
                assert torch.equal(a, b)
        # The optimizer stepped the very .grad tensors backward wrote (none replaced).
        assert [len(set(ids)) for ids in i1] == [len(list(m1.parameters()))] * 5
        assert all(not m._forward_hooks and not m._backward_hooks for m in m1.modules())
        assert [r["loss"] for r in r0] == [r["loss"] for r in r1]


class TestFailures:
    @pytest.mark.parametrize(("fn", "detail"), [
        (lambda: (_ for _ in ()).throw(ValueError("bad batch")), "ValueError: bad batch"),
        (lambda: 3.0, "TypeError: the recheck closure must return a scalar loss tensor, got "
                      "float"),
    ])
    def test_a_failing_closure_is_recorded_and_training_goes_on(
        self, fn: Callable[[], Any], detail: str
    ) -> None:
        loop = Loop(mlp(), shadow_every=2)
        loop.mon.recheck(fn)
        for x in batches(4):
            loop.step(x, closure=False)
        records = loop.records()
        assert len(records) == 4 and not any(r["skipped"] for r in records)
        assert [r["step"] for r in records if "shadow" in r] == [1, 3]
        assert records[1]["shadow"] == {"status": "failed", "loss": None, "rel_err": None,
                                        "cosine": None, "norm": None, "detail": detail}
        assert loop.mon.stats().internal_errors == 0


class TestCompare:
    """``shadow.compare``'s edge cases: rel_err is NaN where FP32's gradient is 0 and the AMP
    one is not, 0 where both are; the cosine is 1 where both are 0, NaN where one is."""

    def test_zero_and_non_finite_gradients(self) -> None:
        t = torch.tensor
        amp = [t([1.0, 0.0]), t([0.0, 0.0]), t([3.0, 4.0]), t([0.0, 0.0]), None, t([1.0, 2.0])]
        fp32 = [t([0.0, 0.0]), t([0.0, 0.0]), t([3.0, 4.0]), t([1.0, 0.0]), t([1.0]),
                t([math.nan, 2.0])]
        block, absent = compare(torch.tensor(2.5), amp, fp32)
        values = block.tolist()
        assert values[0] == 2.5
        rel, cos, norm = values[1:7], values[7:13], values[13:]
        assert absent == frozenset({4})
        assert norm[:5] == [0.0, 0.0, 5.0, 1.0, 0.0] and math.isnan(norm[5])
        assert math.isnan(rel[0]) and rel[1:4] == [0.0, 0.0, 1.0] and math.isnan(rel[5])
        assert math.isnan(cos[0]) and cos[1:3] == [1.0, 1.0] and math.isnan(cos[3])
        assert math.isnan(cos[5])

    def test_a_loss_is_kept_as_it_is(self) -> None:
        block, absent = compare(torch.tensor(math.inf), [], [])
        assert block.tolist() == [math.inf] and absent == frozenset()
