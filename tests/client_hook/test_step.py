"""The step seam's training-thread cost, counted (never timed): which hook functions a plain
GradScaler step runs, and how many aten ops and Python calls the hook adds to a step.

Counted deterministically: the Python calls with ``sys.setprofile`` on the training thread, the
aten ops with a ``TorchDispatchMode`` (a foreach op is one), each on a step of its own (the mode's
own Python would count as calls), hook minus the same step without the hook, after warm-up
steps (the plans, caches and lazy registrations of a first step are not a step's cost).
"""

from __future__ import annotations

import collections
import math
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import ampscope
from ampscope import native_read
from ampscope.step import ScalerSource, StepSource
from ampscope.transport import MemorySender

HOOK = str(Path(ampscope.__file__).parent)


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class Loop:
    """A dispatch-bound loop: ``tensors`` tiny parameter tensors, SGD, a CPU GradScaler."""

    def __init__(self, tensors: int, layer_every: int | None, fused: bool | None = False) -> None:
        """``fused``: None reads the every-step norms through the C loop (built here first, as
        a long run has it), False through torch's ops."""
        torch.manual_seed(0)
        if fused is None:
            native_read.library()
        self.model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(tensors // 2)])
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        self.x = torch.randn(3, 4)
        # Every default but the samplers (activation, histogram), which have their own steps.
        self.mon = None if layer_every is None else ampscope.watch(
            self.model, self.scaler, self.opt, sender=MemorySender(), layer_every=layer_every,
            activation_every=0, histogram_every=0, fused=fused)
        for _ in range(12):
            self.step()

    def step(self, around: Callable[[Callable[[], None]], None] | None = None) -> None:
        """One step; ``around`` runs the hook's part of it (scale → step → update)."""
        self.opt.zero_grad(set_to_none=True)
        loss = self.model(self.x).square().mean()
        scaled = self.scaler.scale(loss)
        scaled.backward()

        def seam() -> None:
            self.scaler.step(self.opt)
            self.scaler.update()

        if around is None:
            seam()
        else:
            around(seam)

    def calls(self) -> collections.Counter[tuple[str, str, int]]:
        """(file, function, first line) of every Python call in the step's seam."""
        seen: collections.Counter[tuple[str, str, int]] = collections.Counter()

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            if event == "call":
                code = frame.f_code
                seen[(code.co_filename, code.co_name, code.co_firstlineno)] += 1

        def traced(seam: Callable[[], None]) -> None:
            sys.setprofile(profile)
            try:
                seam()
            finally:
                sys.setprofile(None)

        self.step(traced)
        return seen

    def ops(self) -> list[str]:
        counted = _Ops()

        def dispatched(seam: Callable[[], None]) -> None:
            with counted:
                seam()

        self.step(dispatched)
        return counted.ops

    def close(self) -> None:
        if self.mon is not None:
            self.mon.close()


def added(tensors: int, layer_every: int, fused: bool | None = False) -> tuple[int, int]:
    """(aten ops, Python calls) the hook adds to one step of a ``tensors``-tensor loop."""
    base, hooked = Loop(tensors, None), Loop(tensors, layer_every, fused)
    try:
        ops = len(hooked.ops()) - len(base.ops())
        calls = sum(hooked.calls().values()) - sum(base.calls().values())
    finally:
        hooked.close()
    return ops, calls


class TestSeam:
    def test_each_way_in_is_a_step_source(self) -> None:
        loop = Loop(4, 10)
        assert loop.mon is not None
        source: StepSource = loop.mon._source
        assert isinstance(source, ScalerSource) and source.cycle is loop.mon._cycle
        loop.close()
        assert "step" not in vars(loop.scaler) and "step" not in vars(loop.opt)

    @pytest.mark.parametrize("fused", [False, None], ids=["torch-norms", "c-loop-norms"])
    def test_a_plain_gradscaler_step_is_one_screen(self, fused: bool | None) -> None:
        """Scale, step, update at the default cadence on a step without per-layer statistics:
        the hook functions it runs (each code object once), in the seam's five modules."""
        loop = Loop(34, 10, fused)
        loop.step()  # step 13 of a layer_every=10 run: a plain step
        hook: set[tuple[str, str, int]] = set()

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            if event == "call" and frame.f_code.co_filename.startswith(HOOK):
                code = frame.f_code
                hook.add((code.co_filename, code.co_name, code.co_firstlineno))

        loop.opt.zero_grad(set_to_none=True)
        loss = loop.model(loop.x).square().mean()
        sys.setprofile(profile)  # the whole step from scale() on, backward included
        try:
            loop.scaler.scale(loss).backward()
            loop.scaler.step(loop.opt)
            loop.scaler.update()
        finally:
            sys.setprofile(None)
        loop.close()
        functions = hook
        modules = {Path(f).name for f, _, _ in functions}
        # The end of backward noted on the step's path (step._Scale.backward_end, a tensor
        # hook that queues itself as the engine's callback: clip before unscale_, #30).
        assert modules == {"step.py", "cycle.py", "reductions.py", "transport.py"}
        assert len(functions) <= 15, sorted((Path(f).name, n) for f, n, _ in functions)
        # The norms are read by ``raw_norms``: from the capture with torch's norms, from
        # ``_UnscaleGrads`` in the unscale's pass with the C loop's.
        assert sorted(n for _, n, _ in functions) == [
            "__call__", "__call__", "__call__", "__call__", "__call__", "_bypass", "after_update",
            "backward_end", "before_update", "build", "capture", "end", "put", "raw_norms",
            "reset"]


class TestHostWork:
    @pytest.mark.parametrize("tensors", [34, 500])
    def test_a_plain_step(self, tensors: int) -> None:
        ops, calls = added(tensors, layer_every=0)
        assert ops <= 8 and calls <= 60, (ops, calls)

    def test_a_plain_step_through_the_c_loop(self) -> None:
        """The norms in one ``empty`` (their output), read in the unscale's pass by one call
        from C, which unscales too: torch's ``_unscale_grads_`` is not run, so its three ops
        (the copies of ``found_inf`` and ``inv_scale``, the foreach unscale) and its Python calls
        are not either. The hook adds no op and 14 calls, at 34 and 500 tensors (torch's norms:
        4 ops, 27 calls)."""
        assert added(34, layer_every=0) == (4, 27)
        assert added(34, 0, fused=None) == added(500, 0, fused=None) == (0, 14)

    @pytest.mark.parametrize("tensors", [34, 500])
    def test_a_per_layer_step(self, tensors: int) -> None:
        """The eager read's ops (the padded buffer's pass: 12, the fold into layers: 6) and the
        scaler's copies (the scale before ``update()``, then the scale and the growth tracker
        after it in one foreach): 20, #29's budget (was 35, and 52 before)."""
        ops, calls = added(tensors, layer_every=1)
        assert ops <= 20 and calls <= 150, (ops, calls)

    @pytest.mark.parametrize("layer_every", [0, 1])
    def test_the_cost_does_not_grow_with_the_tensors(self, layer_every: int) -> None:
        assert added(34, layer_every) == added(500, layer_every)


class Trained:
    """``steps`` steps of a float32 GradScaler loop (AdamW, two layers of 33k elements: the C
    loop reads them on two threads where there are two), without the hook or with it at a plain
    step's cadence: the parameters, the scales, the true-unit gradient norms before each step
    (float64, from the scaled gradients), the records, and on how many steps the C loop did the
    unscale (``GradStats.unscaled``)."""

    def __init__(self, hook: bool, steps: int = 12, *, fused: bool | None = None,
                 clip_at: tuple[int, ...] = (), overflow_at: tuple[int, ...] = (),
                 reversed_params: bool = False) -> None:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128))
        params = list(model.parameters())
        opt = torch.optim.AdamW(params[::-1] if reversed_params else params, lr=1e-3)
        self.scaler = scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
        sink = MemorySender()
        self.mon = mon = ampscope.watch(
            model, scaler, opt, server=None, sender=sink, layer_every=0, activation_every=0,
            histogram_every=0, fused=fused) if hook else None
        x = torch.randn(32, 128)
        self.scales: list[float] = []
        self.norms: list[float] = []
        self.unscaled = 0
        for i in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = model(x).square().mean()
            scaler.scale(loss * math.inf if i in overflow_at else loss).backward()
            squares = [float(p.grad.double().square().sum()) for p in params
                       if p.grad is not None]
            self.norms.append(math.sqrt(sum(squares)) / scaler.get_scale())
            if i in clip_at:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, 1e-3)
            scaler.step(opt)
            scaler.update()
            self.scales.append(scaler.get_scale())
            self.unscaled += bool(mon is not None and mon._cycle.stats.unscaled)
        self.params = [p.detach().clone() for p in params]
        self.records: list[dict[str, Any]] = []
        if mon is not None:
            mon.close()
            self.records = [r for body in sink.payloads() for r in body["records"]]

    def same_training(self, other: Trained) -> bool:
        return self.scales == other.scales and all(
            torch.equal(a.view(torch.int32), b.view(torch.int32))
            for a, b in zip(self.params, other.params, strict=True))


class TestNormsInTheUnscale:
    """A plain step's norms read by the C loop in GradScaler's unscale, which it does
    (``_UnscaleGrads``): the training is the one without the hook, to the bit."""

    def test_the_c_loop_unscales_and_training_is_unchanged(self) -> None:
        """Overflow steps and a clip after ``unscale_`` included; every step after the first
        (which lays the norms out) is unscaled by the C loop, and each record's norm is the
        float64 norm of the gradients it had."""
        kw: dict[str, Any] = {"steps": 12, "clip_at": (3, 9), "overflow_at": (5,)}
        bare, hooked = Trained(False, **kw), Trained(True, **kw)
        assert hooked.same_training(bare)
        assert hooked.unscaled == 11
        assert [r["found_inf"] for r in hooked.records] == [i == 5 for i in range(12)]
        for i, (rec, truth) in enumerate(zip(hooked.records, hooked.norms, strict=True)):
            if i == 5:
                assert rec["grad_norm"] in ("nan", "inf")
            else:
                assert rec["grad_norm"] == pytest.approx(truth, rel=1e-12)

    def test_torch_unscales_what_it_does_not_read_in_order(self) -> None:
        """An optimizer whose parameters are not the watched ones in order: the norms are read
        first, then torch unscales; the same training and norms."""
        kw: dict[str, Any] = {"steps": 6, "reversed_params": True, "overflow_at": (2,)}
        bare, hooked = Trained(False, **kw), Trained(True, **kw)
        assert hooked.same_training(bare) and hooked.unscaled == 0
        assert [r["grad_norm"] == pytest.approx(truth, rel=1e-12)
                for r, truth in zip(hooked.records, hooked.norms, strict=True)] == [
            True, True, False, True, True, True]

    def test_torch_unscales_with_torch_norms(self) -> None:
        bare, hooked = Trained(False, steps=4), Trained(True, steps=4, fused=False)
        assert hooked.same_training(bare) and hooked.unscaled == 0
        assert hooked.mon is not None and not hooked.mon._cycle.unscale_reads

    def test_a_subclass_keeps_its_own_unscale(self) -> None:
        class Sharded(torch.amp.GradScaler):
            def _unscale_grads_(self, *args: Any) -> Any:  # e.g. FSDP's ShardedGradScaler
                return super()._unscale_grads_(*args)

        model = nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for scaler, wrapped in ((torch.amp.GradScaler("cpu"), True), (Sharded("cpu"), False)):
            mon = ampscope.watch(model, scaler, opt, server=None, sender=MemorySender())
            assert ("_unscale_grads_" in vars(scaler)) is wrapped
            assert mon._cycle.unscale_reads is wrapped
            mon.close()
            assert "_unscale_grads_" not in vars(scaler) and not mon._cycle.unscale_reads

    def test_norms_left_due_are_read_at_the_end(self) -> None:
        """Left due by a capture and never unscaled (``StepCycle.settle``): read at ``end``, as
        the gradients are."""
        model = nn.Linear(64, 64)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
        mon = ampscope.watch(model, scaler, opt, server=None, sender=MemorySender(),
                             layer_every=0, histogram_every=0)
        cycle = mon._cycle
        for _ in range(2):  # the first plain step lays the C loop's norms out
            opt.zero_grad()
            scaler.scale(model(torch.ones(2, 64)).sum()).backward()
            cycle.capture(opt)
        assert cycle.due is not None
        norms, grads = cycle.due
        cycle.settle()
        assert cycle.due is None
        assert norms.tolist() == pytest.approx([g.double().norm().item() for g in grads],
                                               rel=1e-13)
        mon.close()
