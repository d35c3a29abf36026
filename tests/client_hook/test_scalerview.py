from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ampscope.cycle import ScalerView
from tests.client_hook.reference import scaled_flags


def setup(
    enabled: bool = True, optimizers: int = 1
) -> tuple[torch.amp.GradScaler, list[torch.optim.Optimizer], list[nn.Parameter]]:
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(3)) for _ in range(2)]
    opts: list[torch.optim.Optimizer] = (
        [torch.optim.SGD(params, lr=0.1)] if optimizers == 1
        else [torch.optim.SGD([p], lr=0.1) for p in params])
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=1, enabled=enabled)
    return scaler, opts, params


def backward(scaler: torch.amp.GradScaler, params: list[nn.Parameter], bad: bool = False) -> None:
    loss = sum((p * p).sum() for p in params)
    assert isinstance(loss, torch.Tensor)
    if bad:
        loss = loss * math.inf
    scaler.scale(loss).backward()


class TestScale:
    def test_the_scale_is_the_scalers_own_tensor(self) -> None:
        scaler, _, params = setup()
        view = ScalerView(scaler)
        assert view.scale_in_effect() == 256.0  # before the first scale(): init_scale, no tensor
        backward(scaler, params)
        scale = view.scale_in_effect()
        assert isinstance(scale, torch.Tensor) and scale is scaler._scale

    def test_a_disabled_scaler_reads_as_scale_one(self) -> None:
        scaler, opts, params = setup(enabled=False)
        view = ScalerView(scaler)
        assert not view.enabled()
        assert view.scale_in_effect() == 1.0
        assert view.scaled_state(opts[0], opts, params) is False
        assert view.before_update() == {}
        values, absent, from_scale = view.after_update({}, torch.device("cpu"))
        assert [v.item() for v in values] == [1.0, 1.0, 0.0, 0.0]
        assert absent == {"growth_tracker"} and from_scale is False

    def test_without_private_state_the_public_fallback(self) -> None:
        scaler, opts, params = setup()
        backward(scaler, params)
        view = ScalerView(scaler)
        for attr in ("_scale", "_per_optimizer_states", "_growth_tracker"):
            object.__setattr__(scaler, attr, None)
        scaler.get_scale = lambda: 512.0  # type: ignore[method-assign]
        assert view.scale_in_effect() == 512.0
        assert view.stage(opts[0]) is None
        assert view.scaled_state(opts[0], opts, params) is True  # before the first unscale_
        before = view.before_update()
        assert before == {"scale_host": 512.0}
        values, absent, from_scale = view.after_update(before, torch.device("cpu"))
        assert [v.item() for v in values] == [512.0, 512.0, 0.0, 0.0]
        assert absent == {"growth_tracker"} and from_scale is True


class TestStages:
    def test_stage_names_through_a_step(self) -> None:
        scaler, opts, params = setup()
        view = ScalerView(scaler)
        assert view.stage(opts[0]) == "READY"  # untouched: no state yet
        assert id(opts[0]) not in scaler._per_optimizer_states  # .get never grew the dict
        backward(scaler, params)
        assert view.scaled_state(opts[0], opts, params) is True
        scaler.unscale_(opts[0])
        assert view.stage(opts[0]) == "UNSCALED"
        assert view.scaled_state(opts[0], opts, params) is False
        scaler.step(opts[0])
        assert view.stage(opts[0]) == "STEPPED"

    def test_two_optimizers_at_different_stages_give_per_parameter_flags(self) -> None:
        scaler, opts, params = setup(optimizers=2)
        view = ScalerView(scaler)
        backward(scaler, params)
        assert view.scaled_state(opts[0], opts, params) is True  # both READY: one bool
        scaler.unscale_(opts[1])
        assert view.scaled_state(opts[0], opts, params) == [True, False]
        assert scaled_flags(view, opts[1], opts, params) == [True, False]
        assert view.scaled_state(opts[0], opts, []) == []


class TestUpdate:
    @pytest.mark.parametrize("bad", [False, True])
    def test_before_and_after_update_read_the_cycle(self, bad: bool) -> None:
        scaler, opts, params = setup()
        view = ScalerView(scaler)
        backward(scaler, params, bad=bad)
        scaler.step(opts[0])
        before = view.before_update()
        assert before["found_inf"] is scaler._per_optimizer_states[id(opts[0])][
            "found_inf_per_device"][torch.device("cpu")]  # a lone found_inf: no op at all
        assert before["scale"] is not scaler._scale  # a copy: update() writes in place
        scaler.update()
        values, absent, from_scale = view.after_update(before, torch.device("cpu"))
        got = [v.item() for v in values]
        # growth_interval=1: a good step doubles the scale, an overflow halves it.
        assert got == ([256.0, 128.0, 0.0, 1.0] if bad else [256.0, 512.0, 0.0, 0.0])
        assert absent == set() and from_scale is False

    def test_snapshot_copies_survive_the_next_update(self) -> None:
        scaler, opts, params = setup()
        view = ScalerView(scaler)
        backward(scaler, params)
        scaler.step(opts[0])
        before = view.before_update()
        scaler.update()
        values, _, _ = view.after_update(before, torch.device("cpu"), snapshot=True)
        backward(scaler, params)
        scaler.step(opts[0])
        scaler.update()  # writes the scaler's scale and growth tracker in place again
        assert [v.item() for v in values] == [256.0, 512.0, 0.0, 0.0]

    def test_found_inf_of_several_optimizers_is_summed_and_clamped(self) -> None:
        scaler, opts, params = setup(optimizers=2)
        view = ScalerView(scaler)
        backward(scaler, params, bad=True)
        for opt in opts:
            scaler.step(opt)
        before = view.before_update()
        assert before["found_inf"].dtype == torch.float64
        assert before["found_inf"].item() == 1.0  # two overflowing optimizers: still 1

    def test_each_optimizers_found_inf_only_when_asked_and_as_copies(self) -> None:
        scaler, opts, params = setup(optimizers=2)
        view = ScalerView(scaler)
        backward(scaler, params)
        params[1].grad[0] = math.inf  # type: ignore[index]  # only the second optimizer's
        for opt in opts:
            scaler.step(opt)
        assert "found_inf_each" not in view.before_update()
        each = view.before_update(each=True)["found_inf_each"]
        assert sorted(each) == sorted(id(o) for o in opts)
        scaler.update()  # adds the second's found_inf into the first's, in place
        assert [each[id(o)].item() for o in opts] == [0.0, 1.0]
