"""AMP misuse on real CPU autocast + GradScaler loops: recorded, never raised (but torch's own)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import ampscope
from ampscope.misuse import ClipHeuristic
from ampscope.transport import MemorySender


class Loop:
    def __init__(self, init_scale: float = 2.0**8, growth_interval: int = 1, **watch: Any) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale,
                                           growth_interval=growth_interval)
        self.sink = MemorySender()
        watch.setdefault("optimizer", self.opt)
        self.mon = ampscope.watch(self.model, self.scaler, sender=self.sink,
                                  activation_every=0, histogram_every=0, **watch)
        gen = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)

    def backward(self) -> None:
        self.opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            out = self.model(self.x)
        self.scaler.scale(((out.float() - self.y) ** 2).mean()).backward()

    def misuse(self) -> list[list[str] | None]:
        self.mon.close()
        recs = [r for p in self.sink.payloads() for r in p["records"]]
        return [None if r["misuse"] is None else [m["kind"] for m in r["misuse"]] for r in recs]


def kinds(rows: list[list[str] | None]) -> list[str]:
    return [k for row in rows if row for k in row]


class TestCorrectLoopsNeverTrigger:
    def test_plain_loop(self) -> None:
        loop = Loop()
        for _ in range(20):
            loop.backward()
            loop.scaler.step(loop.opt)
            loop.scaler.update()
        assert loop.misuse() == [None] * 20

    def test_unscale_clip_step(self) -> None:
        loop = Loop()
        for _ in range(20):
            loop.backward()
            loop.scaler.unscale_(loop.opt)
            torch.nn.utils.clip_grad_norm_(loop.model.parameters(), 0.01)  # clips every step
            loop.scaler.step(loop.opt)
            loop.scaler.update()
        assert loop.misuse() == [None] * 20

    def test_lr_scheduler_created_after_watch_still_works(self) -> None:
        loop = Loop()
        sched = torch.optim.lr_scheduler.StepLR(loop.opt, step_size=1, gamma=0.5)
        for _ in range(3):
            loop.backward()
            loop.scaler.step(loop.opt)
            loop.scaler.update()
            sched.step()  # would warn (an error here) if it thought opt.step was never called
        assert loop.opt.param_groups[0]["lr"] == pytest.approx(0.01 / 8)
        assert loop.misuse() == [None] * 3
        assert "step" in vars(loop.opt)  # the scheduler's wrapper stays; ours is inert


class TestMisuse:
    def test_step_bypassing_the_scaler(self) -> None:
        loop = Loop()
        other = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.1)
        loop.mon.close()
        loop = Loop(optimizer=[loop.opt, other])
        for i in range(3):
            loop.backward()
            loop.scaler.step(loop.opt)
            if i == 1:
                other.step()  # scaled grads, no inf check: the misuse
            loop.scaler.update()
        rows = loop.misuse()
        assert rows == [None, ["step_bypassed_scaler"], None]
        assert "step" not in vars(other) and "step" not in vars(loop.opt)  # unwrapped at close

    def test_disabled_scaler_allows_direct_steps(self) -> None:
        loop = Loop()
        loop.mon.close()
        loop.scaler = torch.amp.GradScaler("cpu", enabled=False)
        loop.sink = MemorySender()
        loop.mon = ampscope.watch(loop.model, loop.scaler, loop.opt, sender=loop.sink)
        loop.backward()
        loop.opt.step()
        loop.scaler.update()
        assert loop.misuse() == [None]

    def test_unscale_twice_is_recorded_and_torch_raises(self) -> None:
        loop = Loop()
        loop.backward()
        loop.scaler.unscale_(loop.opt)
        with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called"):
            loop.scaler.unscale_(loop.opt)
        loop.scaler.step(loop.opt)
        loop.scaler.update()
        loop.backward()
        loop.scaler.unscale_(loop.opt)  # a new cycle: fine again
        loop.scaler.step(loop.opt)
        loop.scaler.update()
        assert loop.misuse() == [["unscale_twice"], None]

    def test_clip_before_unscale_is_counted_on_every_step(self) -> None:
        """Clipped while scaled on 12 of 15 steps, the default growth_interval (the scale
        never moves, which the norm heuristic needed): exactly those 12 (#30)."""
        loop = Loop(growth_interval=2000)
        clipped = [i for i in range(15) if i % 5 != 2]
        for i in range(15):
            loop.backward()
            if i in clipped:
                torch.nn.utils.clip_grad_norm_(loop.model.parameters(), 1.0)  # on SCALED grads
            loop.scaler.step(loop.opt)
            loop.scaler.update()
        rows = loop.misuse()
        assert [i for i, row in enumerate(rows) if row] == clipped
        assert all(row == ["clip_before_unscale"] for row in rows if row)
        recs = [r for p in loop.sink.payloads() for r in p["records"]]
        assert recs[0]["misuse"][0]["detail"].startswith(
            "4 of 4 gradients were modified between the end of backward() and "
            "scaler.unscale_() while still scaled")

    def test_clip_value_before_unscale_and_after_an_accumulation(self) -> None:
        loop = Loop(growth_interval=2000)
        for _ in range(3):
            loop.opt.zero_grad(set_to_none=False)  # zero_() writes the gradients: before backward
            for _ in range(2):  # two micro-batches: the second backward accumulates in place
                with torch.autocast("cpu", dtype=torch.float16):
                    out = loop.model(loop.x)
                loop.scaler.scale(((out.float() - loop.y) ** 2).mean() / 2).backward()
            torch.nn.utils.clip_grad_value_(loop.model.parameters(), 0.5)
            loop.scaler.step(loop.opt)
            loop.scaler.update()
        assert loop.misuse() == [["clip_before_unscale"]] * 3

    def test_accumulation_and_zeroing_alone_are_no_misuse(self) -> None:
        loop = Loop(growth_interval=2000)
        for _ in range(3):
            loop.opt.zero_grad(set_to_none=False)
            for _ in range(2):
                with torch.autocast("cpu", dtype=torch.float16):
                    out = loop.model(loop.x)
                loop.scaler.scale(((out.float() - loop.y) ** 2).mean() / 2).backward()
            loop.scaler.unscale_(loop.opt)
            torch.nn.utils.clip_grad_value_(loop.model.parameters(), 0.5)  # after: correct
            loop.scaler.step(loop.opt)
            loop.scaler.update()
        assert loop.misuse() == [None] * 3


class TestClipHeuristic:
    def test_needs_three_equal_scaled_norms_and_a_scale_change(self) -> None:
        h = ClipHeuristic()
        assert [h.observe(5.0, 8.0), h.observe(5.0, 8.0), h.observe(5.0, 8.0)] == [None] * 3
        hit = h.observe(5.0001, 16.0)
        assert hit is not None and hit["kind"] == "clip_before_unscale"
        assert h.observe(5.0, 32.0) is None  # once per streak
        assert h.observe(7.0, 32.0) is None  # streak broken
        assert [h.observe(7.0, s) for s in (64.0, 128.0)][-1] is not None

    def test_ignores_zero_and_nonfinite(self) -> None:
        h = ClipHeuristic()
        assert all(h.observe(x, s) is None for x, s in
                   [(0.0, 1.0), (0.0, 2.0), (0.0, 4.0), (float("inf"), 8.0), (None, 1.0)])
