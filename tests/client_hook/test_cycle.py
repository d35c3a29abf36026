from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from ampscope.capture import Kind
from ampscope.cycle import ScalerView, StepCycle
from ampscope.misuse import ClipHeuristic
from ampscope.record import StepRecord
from ampscope.reductions import STAT_NAMES, GradStats
from ampscope.selection import Cadence
from ampscope.wire import unpack_payload
from tests.support.dispatch import AtenOps


class Loop:
    """A tiny model, SGD and a CPU GradScaler driven by hand around one ``StepCycle``."""

    def __init__(self, layer_every: int = 1, histogram_every: int = 0) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
        self.params = list(self.model.parameters())
        self.opt = torch.optim.SGD(self.params, lr=0.5)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**6)
        self.view = ScalerView(self.scaler)
        numels = [p.numel() for p in self.params]
        self.cycle = StepCycle(self.params, GradStats("fp16", numels, fused=False),
                               Cadence(layer_every, [str(i) for i in range(4)]),
                               histogram_every, self.view, None, None)
        self.x = torch.randn(5, 4)

    def loss(self) -> torch.Tensor:
        out: torch.Tensor = self.model(self.x).square().mean()
        return out

    def step(self, step: int, *, unscale_first: bool = False, defer: bool = True,
             capture: bool = True, accumulate: int = 1) -> dict[str, Any]:
        """One cycle; returns the wire record ``to_wire`` makes of it."""
        self.opt.zero_grad(set_to_none=True)
        for _ in range(accumulate):
            loss = self.loss()
            self.cycle.on_scale(loss)  # what the monitor's scale() wrapper hands it
            self.scaler.scale(loss).backward()
        if unscale_first:
            self.scaler.unscale_(self.opt)
        if capture:
            self.cycle.capture(self.opt, [self.opt], step)
        self.scaler.step(self.opt)
        before = self.view.before_update()
        self.scaler.update()
        record = self.cycle.build(before, seq=step, step=step, lr=self.lr, misuse=None,
                                  clip=ClipHeuristic(), defer=defer)
        self.last = record
        wire: dict[str, Any] = unpack_payload({"records": [record.to_wire()]})["records"][0]
        self.cycle.reset()
        self.cycle.start(step + 1, 0)
        return wire

    def lr(self, device: torch.device) -> torch.Tensor:
        return torch.full((), 0.5, dtype=torch.float64, device=device)


class TestCapture:
    def test_a_plain_steps_capture_is_the_read_and_nothing_else(self) -> None:
        """The training thread only reads at a plain step's capture (this small model's float32
        gradients: one ``_foreach_norm`` and its stack); the division by the scale and the global
        norm are the sender thread's (``capture.finish``)."""
        loop = Loop(layer_every=0)
        loop.opt.zero_grad(set_to_none=True)
        loop.scaler.scale(loop.loss()).backward()
        with AtenOps() as mode:
            loop.cycle.capture(loop.opt, [loop.opt], 1)
        assert mode.ops == ["_foreach_norm", "stack"]

    def test_a_per_layer_capture_finalizes_nothing(self) -> None:
        """The eager read's own ops only: no reciprocal, division, sqrt or fraction (those of
        ``partials.finalize``) on the training thread."""
        loop = Loop(layer_every=1)
        loop.step(0)  # builds the eager plan
        loop.opt.zero_grad(set_to_none=True)
        loop.scaler.scale(loop.loss()).backward()
        with AtenOps() as mode:
            loop.cycle.capture(loop.opt, [loop.opt], 1)
        assert mode.ops and not {"reciprocal", "div", "sqrt", "where", "clamp"} & set(mode.ops)

    def test_a_stats_step_captures_scaled_grads_in_true_units(self) -> None:
        loop = Loop(layer_every=1)
        rec = loop.step(0)
        assert rec["captured"] == "before_unscale"
        layers = rec["layers"]
        assert layers is not None and set(layers) >= set(STAT_NAMES)
        # The scale was 64 during the step; true units are the unscaled gradient's.
        for p, l2 in zip(loop.params, layers["l2"], strict=True):
            assert p.grad is not None
            assert l2 == pytest.approx(p.grad.norm().item(), rel=1e-6)  # unscaled by step()

    def test_norms_only_between_stats_steps(self) -> None:
        loop = Loop(layer_every=2)
        first, second = loop.step(0), loop.step(1)
        assert first["layers"] is not None and second["layers"] is None
        taken = loop.last.sections.taken
        assert taken is not None and taken.kind is Kind.NORMS and not loop.last.sections.layers
        norm = math.sqrt(sum(p.grad.norm().item() ** 2 for p in loop.params
                             if p.grad is not None))
        assert second["grad_norm"] == pytest.approx(norm, rel=1e-6)

    def test_after_unscale_is_said_and_taken_as_true_units(self) -> None:
        loop = Loop(layer_every=1)
        rec = loop.step(0, unscale_first=True)
        assert rec["captured"] == "after_unscale"
        for p, amax in zip(loop.params, rec["layers"]["amax"], strict=True):
            assert p.grad is not None
            assert amax == pytest.approx(p.grad.abs().max().item(), rel=1e-6)

    def test_without_a_capture_the_norm_is_absent(self) -> None:
        loop = Loop()
        rec = loop.step(0, capture=False)
        assert rec["grad_norm"] is None and rec["layers"] is None and rec["captured"] is None

    def test_histogram_on_its_steps(self) -> None:
        loop = Loop(layer_every=0, histogram_every=2)
        assert loop.step(0)["histogram"] is not None
        assert loop.step(1)["histogram"] is None


class TestBuild:
    @pytest.mark.parametrize("layer_every", [1, 2])
    def test_deferred_parts_read_as_the_stacked_tensor(self, layer_every: int) -> None:
        a, b = Loop(layer_every), Loop(layer_every)
        for step in range(3):
            got, want = a.step(step, defer=True), b.step(step, defer=False)
            assert isinstance(a.last.values, list) and isinstance(b.last.values, torch.Tensor)
            got.pop("wall_time"), want.pop("wall_time")
            got.pop("duration"), want.pop("duration")
            assert repr(got) == repr(want)  # NaN and inf kept alike

    def test_the_loss_is_the_sum_over_accumulated_backwards(self) -> None:
        loop = Loop()
        first = loop.loss().item()
        rec = loop.step(0, accumulate=2)  # both backward passes see the same weights and batch
        assert rec["loss"] == pytest.approx(2 * first, rel=1e-6)
        assert rec["scale_before"] == 64.0 and rec["lr"] == 0.5

    def test_scalars_of_a_skipped_step(self) -> None:
        loop = Loop()
        with torch.no_grad():
            loop.params[0].fill_(math.inf)
        rec = loop.step(0)
        assert rec["found_inf"] is True and rec["skipped"] is True
        assert rec["scale_after"] == 32.0
        # An inf weight makes inf - inf in the backward: every layer's gradient holds NaN,
        # listed in layer order (no backward order is learned without the monitor's hooks).
        assert rec["nonfinite"] == [{"layer": i, "kind": "nan"} for i in range(4)]

    def test_reset_forgets_the_cycle(self) -> None:
        loop = Loop()
        loop.step(0)
        assert not loop.cycle.captured and not loop.cycle.has_block
        assert isinstance(loop.last, StepRecord)
