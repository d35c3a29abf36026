"""The step seam's training-thread cost, counted (never timed): which hook functions a plain
GradScaler step runs, and how many aten ops and Python calls the hook adds to a step.

Counted deterministically: the Python calls with ``sys.setprofile`` on the training thread, the
aten ops with a ``TorchDispatchMode`` (a foreach op is one), each on a step of its own (the mode's
own Python would count as calls), hook minus the same step without the hook, after warm-up
steps (the plans, caches and lazy registrations of a first step are not a step's cost).
"""

from __future__ import annotations

import collections
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
        assert sorted(n for _, n, _ in functions) == [
            "__call__", "__call__", "__call__", "__call__", "_bypass", "after_update",
            "backward_end", "before_update", "build", "capture", "capture_state", "end", "put",
            "raw_norms", "reset"]


class TestHostWork:
    @pytest.mark.parametrize("tensors", [34, 500])
    def test_a_plain_step(self, tensors: int) -> None:
        ops, calls = added(tensors, layer_every=0)
        assert ops <= 8 and calls <= 60, (ops, calls)

    def test_a_plain_step_through_the_c_loop(self) -> None:
        """The norms in one ``empty`` (its output) and one call from C: an op fewer than torch's
        ``_foreach_norm`` and ``stack``, the same Python calls, at 34 and 500 tensors."""
        torch_ops, torch_calls = added(34, layer_every=0)
        assert added(34, 0, fused=None) == added(500, 0, fused=None) == (torch_ops - 1,
                                                                          torch_calls)

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
