from __future__ import annotations

import copy
import io
import json
import math
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from torch import nn

import ampscope
import ampscope.cycle
from ampscope import fused, native_read
from ampscope.formats import FORMATS
from ampscope.monitor import HookState
from ampscope.reductions import STAT_NAMES
from ampscope.transport import MemorySender
from tests.client_hook.httpstub import StubServer
from tests.client_hook.reference import layer_stats, unpack


class Tiny(nn.Module):
    """An fp32 elementwise use of a parameter: its gradient is ~1e-15 of the output's, so at any
    realistic scale it would underflow in fp16."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gain * 1e-15


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4), Tiny())


Loop = Callable[[int], None]


class Run:
    """A real CPU AMP loop (fp16 autocast, GradScaler from 2^24 so the first steps overflow) that
    records the truth from the scaler itself around every update()."""

    def __init__(self, *, scaler_enabled: bool = True, **watch: Any) -> None:
        self.model = make_model()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, enabled=scaler_enabled)
        self.sender = MemorySender()
        watch.setdefault("sender", self.sender)
        self.mon = ampscope.watch(self.model, self.scaler, self.opt, run="t", **watch)
        gen = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
        self.truth: list[dict[str, Any]] = []
        self.pre_unscale: list[list[torch.Tensor | None]] = []

    def loss(self) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.float16):
            out = self.model(self.x)
        loss: torch.Tensor = ((out.float() - self.y) ** 2).mean()
        return loss

    def update(self, losses: list[float]) -> None:
        s = self.scaler
        truth: dict[str, Any] = {"loss": sum(losses)}
        if s.is_enabled():
            found = [t.item() for st in s._per_optimizer_states.values()
                     for t in st["found_inf_per_device"].values()]
            truth.update(scale_before=s.get_scale(), found_inf=sum(found) > 0)
        s.update()
        if s.is_enabled():
            truth.update(scale_after=s.get_scale(), growth_tracker=s._get_growth_tracker())
        self.truth.append(truth)

    def step(self, micro: int = 1, before_step: Callable[[], None] | None = None) -> None:
        self.opt.zero_grad()
        losses = []
        for _ in range(micro):
            loss = self.loss()
            losses.append(loss.item())
            self.scaler.scale(loss).backward()
        if before_step is not None:
            before_step()
        self.pre_unscale.append([None if p.grad is None else p.grad.clone()
                                 for p in self.model.parameters()])
        self.scaler.step(self.opt)
        self.update(losses)

    def records(self) -> list[dict[str, Any]]:
        return [r for p in self.sender.payloads() for r in p["records"]]


def decoded(values: list[Any]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def assert_stats_equal(rec_layers: dict[str, list[Any]], want: dict[str, list[float]]) -> None:
    for name in STAT_NAMES:
        for got, exp in zip(decoded(rec_layers[name]), want[name], strict=True):
            if math.isnan(exp):
                assert math.isnan(got), name
            else:
                assert got == pytest.approx(exp, rel=1e-6), name


class TestRealLoop:
    def test_records_equal_the_scaler_truth(self) -> None:
        run = Run(layer_every=4)
        for _ in range(14):
            run.step()
        run.mon.close()
        records = run.records()
        assert [r["seq"] for r in records] == [r["step"] for r in records] == list(range(14))
        for rec, truth in zip(records, run.truth, strict=True):
            assert rec["scale_before"] == truth["scale_before"]
            assert rec["scale_after"] == truth["scale_after"]
            assert rec["growth_tracker"] == truth["growth_tracker"]
            assert rec["found_inf"] is rec["skipped"] is truth["found_inf"]
            assert rec["loss"] == truth["loss"]
            assert rec["lr"] == 0.05
            assert (rec["layers"] is not None) == (rec["step"] % 4 == 0)
            if rec["found_inf"]:
                assert rec["grad_norm"] in ("nan", "inf")
            else:
                assert isinstance(rec["grad_norm"], float) and rec["grad_norm"] > 0
        assert records[0]["found_inf"] and not records[-1]["found_inf"]
        assert records[0]["duration"] is None and all(r["duration"] > 0 for r in records[1:])
        assert run.mon.stats() == ampscope.MonitorStats(14, 14, 0, 0, 0, 0)

    def test_layer_stats_are_true_units_of_the_grads_before_unscale(self) -> None:
        run = Run(layer_every=1)
        for _ in range(12):
            run.step()
        run.mon.close()
        records = run.records()
        numels = [p.numel() for p in run.model.parameters()]
        for rec, truth, grads in zip(records, run.truth, run.pre_unscale, strict=True):
            _, want = unpack(layer_stats(
                grads, truth["scale_before"], True, "fp16", numels).tolist(), len(numels))
            assert_stats_equal(rec["layers"], want)
        clean = [r for r in records if not r["found_inf"]]
        assert clean and all(r["layers"]["underflow_frac"][-1] == 1.0 for r in clean)
        assert all(r["layers"]["underflow_frac"][0] == 0.0 for r in clean)

    def test_injected_nan_and_inf(self) -> None:
        run = Run(layer_every=1)
        for _ in range(10):  # until the scale has settled
            run.step()
        params = list(run.model.parameters())

        def inject() -> None:
            assert params[0].grad is not None and params[2].grad is not None
            params[0].grad[0, 0] = math.nan
            params[2].grad[1, 1] = math.inf
            params[2].grad[1, 2] = -math.inf

        run.step(before_step=inject)
        run.mon.close()
        for body in run.sender.bodies:
            json.loads(body, parse_constant=lambda c: pytest.fail(f"bare {c} on the wire"))
        rec = run.records()[-1]
        assert rec["found_inf"] is True and rec["skipped"] is True and rec["grad_norm"] == "nan"
        assert rec["layers"]["nan_count"] == [1, 0, 0, 0, 0]
        assert rec["layers"]["inf_count"] == [0, 0, 2, 0, 0]
        assert all(v is not None for v in rec["layers"]["amax"])  # finite elements remain

    def test_gradient_accumulation_gives_one_record(self) -> None:
        run = Run(layer_every=1)
        for _ in range(3):
            run.step(micro=3)
        run.mon.close()
        records = run.records()
        assert len(records) == 3
        assert [r["loss"] for r in records] == pytest.approx([t["loss"] for t in run.truth])

    def test_unscale_clip_step_captures_once_in_true_units(self) -> None:
        run = Run(layer_every=1)
        captured = 0
        original = run.mon._cycle.capture

        def counting(opt: torch.optim.Optimizer) -> None:
            nonlocal captured
            captured += 1
            original(opt)

        run.mon._cycle.capture = counting  # type: ignore[method-assign, assignment]
        for _ in range(10):
            run.opt.zero_grad()
            loss = run.loss()
            run.scaler.scale(loss).backward()
            run.pre_unscale.append([p.grad.clone() for p in run.model.parameters()
                                    if p.grad is not None])
            run.scaler.unscale_(run.opt)
            torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
            run.scaler.step(run.opt)
            run.update([loss.item()])
        run.mon.close()
        assert captured == 10
        numels = [p.numel() for p in run.model.parameters()]
        for rec, truth, grads in zip(run.records(), run.truth, run.pre_unscale, strict=True):
            _, want = unpack(layer_stats(
                grads, truth["scale_before"], True, "fp16", numels).tolist(), len(numels))
            assert_stats_equal(rec["layers"], want)

    def test_already_unscaled_grads_are_captured_as_true_units(self) -> None:
        run = Run(layer_every=1)
        for _ in range(10):
            run.opt.zero_grad()
            loss = run.loss()
            run.scaler.scale(loss).backward()
            run.pre_unscale.append([p.grad.clone() for p in run.model.parameters()
                                    if p.grad is not None])
            # A framework that unscales through the class, past the instance wrapper.
            torch.amp.GradScaler.unscale_(run.scaler, run.opt)
            run.scaler.step(run.opt)
            run.update([loss.item()])
        run.mon.close()
        numels = [p.numel() for p in run.model.parameters()]
        clean = 0
        for rec, truth, grads in zip(run.records(), run.truth, run.pre_unscale, strict=True):
            if truth["found_inf"]:
                continue  # unscaled overflow: inf/NaN positions match, magnitudes do not matter
            clean += 1
            _, want = unpack(layer_stats(
                grads, truth["scale_before"], True, "fp16", numels).tolist(), len(numels))
            assert_stats_equal(rec["layers"], want)
        assert clean >= 2


class TestHostRecords:
    """On the CPU the training thread leaves a step's values unstacked (``record.Parts``) and
    the sender thread reads them later: they must be that step's values, whatever the loop
    changed in place since, and equal to the stacked record's."""

    @staticmethod
    def wire(run: Run) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in ("wall_time", "duration")}
                for r in run.records()]

    def test_unstacked_and_stacked_records_are_equal(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        runs = []
        for defer_max in (ampscope.cycle.DEFER_MAX, 0):
            monkeypatch.setattr(ampscope.cycle, "DEFER_MAX", defer_max)
            run = Run(layer_every=3, histogram_every=4, activation_every=5)
            kinds: list[type] = []
            put = run.mon._transport.put  # type: ignore[union-attr]

            def spy(item: Any, put: Any = put, kinds: list[type] = kinds) -> int:
                kinds.append(type(item.values))
                backlog: int = put(item)
                return backlog

            run.mon._transport.put = spy  # type: ignore[union-attr, method-assign]
            for _ in range(12):
                run.step()
            run.mon.close()
            assert kinds == [list] * 12 if defer_max else kinds == [torch.Tensor] * 12
            runs.append(self.wire(run))
        assert json.dumps(runs[0]) == json.dumps(runs[1])
        assert any(r["found_inf"] for r in runs[0]) and any(r["histogram"] for r in runs[0])

    def test_values_are_their_steps_when_read_after_the_loop(self) -> None:
        """A tensor lr a schedule writes in place, a float64 loss zeroed after backward, and
        the scale and growth tracker that update() writes in place: all read after training."""
        run = Run(layer_every=0)
        run.opt.param_groups[0]["lr"] = torch.tensor(0.05, dtype=torch.float64)
        losses = []
        for _ in range(8):
            run.opt.zero_grad()
            loss = run.loss().double()
            losses.append(loss.item())
            run.scaler.scale(loss).backward()
            loss.zero_()
            run.scaler.step(run.opt)
            run.update([losses[-1]])
            run.opt.param_groups[0]["lr"].mul_(0.5)
        run.mon.close()  # the sender thread reads them here, if it did not wake (every 0.2 s)
        records = run.records()
        assert [r["loss"] for r in records] == losses
        assert [r["lr"] for r in records] == [0.05 * 0.5**i for i in range(8)]
        for rec, truth in zip(records, run.truth, strict=True):
            assert (rec["scale_before"], rec["scale_after"], rec["growth_tracker"]) == (
                truth["scale_before"], truth["scale_after"], truth["growth_tracker"])

    @pytest.mark.parametrize("backlog,kind", [(0, list), (255, list), (256, torch.Tensor)])
    def test_a_backlog_stacks_on_the_training_thread(
            self, backlog: int, kind: type) -> None:
        """Unstacked records cost ~30x the memory: past DEFER_MAX queued records (the server
        stalls), the training thread stacks again, so the bounded queue stays small."""
        assert ampscope.cycle.DEFER_MAX == 256
        run = Run(layer_every=0)
        transport = run.mon._transport
        assert transport is not None
        items: list[Any] = []

        def put(item: Any) -> int:  # what the queue holds after it: the next record's choice
            items.append(item)
            return backlog

        transport.put = put  # type: ignore[method-assign]
        run.mon._cycle.backlog = backlog  # as if the queue already held that many
        for _ in range(3):
            run.step()
        run.mon.close()
        assert [type(i.values) for i in items] == [kind] * 3
        assert [i.to_wire()["scale_after"] for i in items] == [
            t["scale_after"] for t in run.truth]


class TestModes:
    def test_disabled_scaler_still_records_scalars(self) -> None:
        run = Run(scaler_enabled=False, layer_every=2)
        for _ in range(3):
            run.step()
        run.mon.close()
        records = run.records()
        assert [(r["scale_before"], r["scale_after"], r["found_inf"], r["growth_tracker"])
                for r in records] == [(1.0, 1.0, False, None)] * 3
        assert records[0]["layers"] is not None and records[1]["layers"] is None

    def test_enabled_false_is_a_pass_through(self) -> None:
        run = Run(enabled=False)
        assert not any(name in vars(run.scaler) for name in ("scale", "unscale_", "step", "update"))
        run.step()
        run.mon.close()
        assert run.sender.bodies == [] and run.mon.stats().produced == 0

    def test_hook_errors_never_reach_training(self, monkeypatch: pytest.MonkeyPatch) -> None:
        run = Run(layer_every=1)

        def broken(*args: object) -> torch.Tensor:
            raise RuntimeError("forced")

        monkeypatch.setattr(run.mon._stats, "partials", broken)
        before = [p.detach().clone() for p in run.model.parameters()]
        with pytest.warns(ampscope.AmpscopeWarning, match="disabled itself after 3 internal"):
            for _ in range(12):
                run.step()
        assert run.mon.state is HookState.DISABLED
        after = list(run.model.parameters())
        assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
        run.mon.close()
        assert run.mon.stats().internal_errors == 3

    def test_flush_interval_sets_when_the_sender_wakes(self) -> None:
        run = Run(layer_every=0, flush_interval=30.0)
        for _ in range(3):
            run.step()
        time.sleep(0.3)
        assert run.sender.payloads() == []  # 3 records, below a batch, 30 s before the flush
        run.mon.close()
        assert [r["step"] for r in run.records()] == [0, 1, 2]

    def test_flush_sends_every_step_so_far_and_training_goes_on(self) -> None:
        run = Run(layer_every=2, flush_interval=60.0)
        for _ in range(3):
            run.step()
        assert run.mon.flush(timeout=10.0)  # well before the 60 s flush interval
        assert [r["step"] for r in run.records()] == [0, 1, 2]
        assert run.mon.stats() == ampscope.MonitorStats(3, 3, 0, 0, 0, 0)
        run.step()
        run.mon.close()
        assert [r["step"] for r in run.records()] == [0, 1, 2, 3]

    def test_flush_of_a_closed_or_inert_monitor_is_false(self) -> None:
        closed = Run()
        closed.step()
        closed.mon.close()
        assert closed.mon.flush() is False
        assert Run(enabled=False).mon.flush() is False

    def test_close_unwraps_sends_final_and_balances(self) -> None:
        run = Run()
        run.step()
        run.mon.close()
        run.mon.close()  # idempotent
        assert not any(name in vars(run.scaler) for name in ("scale", "unscale_", "step", "update"))
        payloads = run.sender.payloads()
        assert payloads[-1]["final"] is True and payloads[0]["layers"] == run.mon.layers
        run.step()  # training goes on, unobserved
        stats = run.mon.stats()
        assert stats.produced == stats.acknowledged + stats.dropped + stats.pending == 1

    def test_no_server_spools(self, tmp_path: Path) -> None:
        run = Run(sender=None, server=None, spool_dir=tmp_path)
        run.step()
        run.mon.close()
        assert run.mon.stats() == ampscope.MonitorStats(1, 0, 0, 0, 0, 0, spooled=1)
        assert any(tmp_path.rglob("*"))

    def test_offline_mode_ignores_the_server(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("AMPSCOPE_MODE", "offline")
        run = Run(sender=None, server="http://127.0.0.1:9", spool_dir=tmp_path)
        run.step()
        run.mon.close(timeout=1.0)
        assert run.mon.stats() == ampscope.MonitorStats(1, 0, 0, 0, 0, 0, spooled=1)
        assert run.mon.show().url is None

    def test_no_server_and_no_spool_counts_drops(self) -> None:
        run = Run(sender=None, server=None, spool_max_bytes=0)
        run.step()
        run.mon.close()
        assert run.mon.stats() == ampscope.MonitorStats(1, 0, 1, 0, 0, 0)

    def test_over_http(self) -> None:
        with StubServer() as server:
            run = Run(sender=None, server=server.url, project="p", tags=("a",),
                      config={"lr": 0.05}, run_id="fixed-id")
            run.step()
            run.mon.close()
        assert run.mon.show().url == f"{server.url}/runs/fixed-id"
        payload = server.payloads()[0]
        assert payload["run"] == {
            "id": "fixed-id", "project": "p", "name": "t", "tags": ["a"], "config": {"lr": 0.05},
            "host": payload["run"]["host"], "rank": 0, "world_size": 1, "target_format": "fp16",
            "target_format_reason": "FP32 parameters with a loss scale: an FP16 autocast"}
        assert list(payload["attempt"]) == ["id", "pid", "started_at"]
        assert run.mon.run_id == "fixed-id"


class TestLayerTable:
    def test_names_shapes_types_tied_and_frozen(self) -> None:
        model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10), nn.LayerNorm(10))
        model[1].weight = model[0].weight  # tied: one layer
        model[2].bias.requires_grad_(False)
        mon = ampscope.watch(model, torch.amp.GradScaler("cpu"), server=None,
                             target_format=FORMATS["bf16"])
        mon.close()
        assert mon.layers == [
            {"index": 0, "name": "0.weight", "raw_name": "0.weight", "shape": [10, 4],
             "dtype": "float32", "numel": 40, "module_type": "Embedding"},
            {"index": 1, "name": "1.bias", "raw_name": "1.bias", "shape": [10],
             "dtype": "float32", "numel": 10, "module_type": "Linear"},
            {"index": 2, "name": "2.weight", "raw_name": "2.weight", "shape": [10],
             "dtype": "float32", "numel": 10, "module_type": "LayerNorm"},
        ]
        assert mon._run_info["target_format"] == "bf16"

    def test_a_compiled_model_gets_canonical_names_and_keeps_the_raw_ones(self) -> None:
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        compiled = cast(nn.Module, torch.compile(model, backend="eager"))
        wrapped = nn.DataParallel(compiled)
        mon = ampscope.watch(wrapped, torch.amp.GradScaler("cpu"), server=None,
                             exclude=["2.*"])  # patterns match the canonical names
        mon.close()
        assert [(layer["name"], layer["raw_name"]) for layer in mon.layers] == [
            ("0.weight", "module._orig_mod.0.weight"), ("0.bias", "module._orig_mod.0.bias")]


class TestOverflowEvents:
    """``nonfinite``: the layers holding NaN/inf on a found_inf step, in backward order."""

    def test_backward_order_is_learned_then_hooks_removed(self) -> None:
        run = Run()
        assert run.mon._order is not None and run.mon._order.learning
        run.step()
        order = run.mon._order.order()
        run.mon.close()
        # layers: 0.weight 0.bias 2.weight 2.bias 3.gain; backward runs from the output side
        assert order[0] == 4 and set(order[1:3]) == {2, 3} and set(order[3:]) == {0, 1}
        assert not run.mon._order.learning
        assert all(not p._post_accumulate_grad_hooks for p in run.model.parameters())

    @pytest.mark.parametrize("layer_every", [1, 0])  # stats block, or per-layer norms only
    def test_injected_nan_and_inf_come_in_backward_order(self, layer_every: int) -> None:
        run = Run(layer_every=layer_every)
        for _ in range(10):
            run.step()
        params = list(run.model.parameters())

        def inject() -> None:
            assert params[0].grad is not None and params[2].grad is not None
            params[0].grad[0, 0] = math.nan
            params[2].grad[1, 1] = math.inf
            gain = params[4].grad
            assert gain is not None
            gain[0], gain[1] = math.inf, math.nan  # both: "nan" wins

        run.step(before_step=inject)
        run.mon.close()
        recs = run.records()
        assert recs[-1]["nonfinite"] == [
            {"layer": 4, "kind": "nan"}, {"layer": 2, "kind": "inf"}, {"layer": 0, "kind": "nan"}]
        assert all(r["nonfinite"] is None for r in recs if not r["found_inf"])
        assert isinstance(recs[-1]["loss"], float)  # the loss was finite: a backward overflow

    def test_real_overflow_names_the_layers_that_overflowed(self) -> None:
        run = Run(layer_every=1)  # init_scale 2^24: the first steps overflow in fp16
        for _ in range(3):
            run.step()
        run.mon.close()
        rec, order = run.records()[0], run.mon._order
        assert order is not None and rec["found_inf"] and isinstance(rec["loss"], float)
        bad = {i: ("nan" if n else "inf") for i, (n, f) in enumerate(
            zip(rec["layers"]["nan_count"], rec["layers"]["inf_count"], strict=True)) if n or f}
        assert bad and rec["nonfinite"] == [
            {"layer": i, "kind": bad[i]} for i in order.order() if i in bad]


class TestCapture:
    def test_captured_kind_per_record(self) -> None:
        run = Run(layer_every=2)
        run.step()
        run.opt.zero_grad()
        run.scaler.scale(run.loss()).backward()
        torch.amp.GradScaler.unscale_(run.scaler, run.opt)  # unscaled past the wrapper
        run.scaler.step(run.opt)
        run.update([0.0])
        run.mon.close()
        disabled = Run(scaler_enabled=False)
        disabled.step()
        disabled.mon.close()
        assert [r["captured"] for r in run.records()] == ["before_unscale", "after_unscale"]
        assert disabled.records()[0]["captured"] == "after_unscale"

    def test_multiple_optimizers_on_one_scaler(self) -> None:
        model = make_model()
        params = list(model.parameters())
        opt_a = torch.optim.SGD(params[:2], lr=0.1)
        opt_b = torch.optim.Adam(params[2:], lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
        sink = MemorySender()
        mon = ampscope.watch(model, scaler, [opt_a, opt_b], sender=sink, layer_every=1)
        x = torch.randn(16, 8)
        pre: list[list[torch.Tensor | None]] = []
        scales = []
        for _ in range(4):
            opt_a.zero_grad()
            opt_b.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            pre.append([None if p.grad is None else p.grad.clone() for p in params])
            scales.append(scaler.get_scale())
            scaler.unscale_(opt_a)
            torch.nn.utils.clip_grad_norm_(params[:2], 1.0)
            scaler.step(opt_a)
            scaler.step(opt_b)
            scaler.update()
        mon.close()
        recs = [r for p in sink.payloads() for r in p["records"]]
        assert [r["step"] for r in recs] == [0, 1, 2, 3] and all(r["misuse"] is None for r in recs)
        assert all(r["captured"] == "before_unscale" and r["lr"] == 0.1 for r in recs)
        numels = [p.numel() for p in params]
        for rec, grads, scale in zip(recs, pre, scales, strict=True):
            _, want = unpack(layer_stats(grads, scale, True, "fp16", numels).tolist(), 5)
            assert_stats_equal(rec["layers"], want)

    def test_each_optimizer_says_whether_its_step_was_skipped(self) -> None:
        """opt_b's gradients overflow at step 1: opt_b skips, opt_a steps (the scaler checks each
        optimizer's own found_inf); every parameter group's lr, a tensor lr too."""
        model = make_model()
        params = list(model.parameters())
        groups: list[dict[str, Any]] = [{"params": params[:1]}, {"params": params[1:2], "lr": 0.2}]
        opt_a = torch.optim.SGD(groups, lr=0.1)
        opt_b = torch.optim.Adam(params[2:], lr=torch.tensor(0.01))
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
        sink = MemorySender()
        mon = ampscope.watch(model, scaler, [opt_a, opt_b], sender=sink, layer_every=0)
        x = torch.randn(16, 8)
        before = [p.detach().clone() for p in params]
        for step in range(3):
            opt_a.zero_grad()
            opt_b.zero_grad()
            scaler.scale(model(x).float().pow(2).mean()).backward()
            if step == 1:
                before = [p.detach().clone() for p in params]
                params[2].grad[0, 0] = math.inf  # type: ignore[index]
            scaler.step(opt_a)
            scaler.step(opt_b)
            scaler.update()
            if step == 1:  # the truth: opt_a's parameters moved, opt_b's did not
                assert not torch.equal(params[0], before[0])
                assert all(torch.equal(p, b) for p, b in zip(params[2:], before[2:], strict=True))
        mon.close()
        recs = [r for p in sink.payloads() for r in p["records"]]
        assert [(r["found_inf"], r["skipped"]) for r in recs] == [
            (False, False), (True, True), (False, False)]
        assert [[o["skipped"] for o in r["optimizers"]] for r in recs] == [
            [False, False], [False, True], [False, False]]
        assert all([o["lr"] for o in r["optimizers"]] == [[0.1, 0.2], [pytest.approx(0.01)]]
                   for r in recs)

    def test_accumulated_gradient_stats(self) -> None:
        run = Run(layer_every=1)
        for _ in range(4):
            run.step(micro=3)
        run.mon.close()
        numels = [p.numel() for p in run.model.parameters()]
        for rec, truth, grads in zip(run.records(), run.truth, run.pre_unscale, strict=True):
            _, want = unpack(layer_stats(
                grads, truth["scale_before"], True, "fp16", numels).tolist(), len(numels))
            assert_stats_equal(rec["layers"], want)

    def test_histogram_every_n_in_true_units(self) -> None:
        from ampscope.histogram import exponent_histogram

        run = Run(histogram_every=2, layer_every=0)
        for _ in range(4):
            run.step()
        run.mon.close()
        recs = run.records()
        assert [r["histogram"] is not None for r in recs] == [True, False, True, False]
        numels = [p.numel() for p in run.model.parameters()]
        for rec, truth, grads in zip(recs[::2], run.truth[::2], run.pre_unscale[::2],
                                     strict=True):
            hist = rec["histogram"]
            assert (hist["min_exp"], hist["max_exp"]) == (-40, 20)
            assert [sum(c) for c in hist["counts"]] == numels
            want = exponent_histogram(grads, truth["scale_before"], True, numels)
            assert hist["counts"] == [[round(c) for c in row] for row in want.tolist()]

    def test_layer_selection_and_mapping_cadence(self) -> None:
        run = Run(include=["0.*", "2.*"], exclude=["*.bias"],
                  layer_every={"2.*": 3, "0.*": 2})
        for _ in range(7):
            run.step()
        run.mon.close()
        assert [layer["name"] for layer in run.mon.layers] == ["0.weight", "2.weight"]
        recs = run.records()
        assert [r["layers"] is not None for r in recs] == [
            True, False, True, True, True, False, True]
        assert all(len(r["layers"]["amax"]) == 2 for r in recs if r["layers"])
        assert run.sender.payloads()[0]["layers"] == run.mon.layers

    def test_client_accounting_rides_along(self) -> None:
        run = Run()
        for _ in range(3):
            run.step()
        run.mon.close()
        client = run.sender.payloads()[-1]["client"]
        assert set(client) == {"produced", "acknowledged", "spooled", "dropped", "replayed"}
        assert client["produced"] == 3 and client["dropped"] == 0
        assert client["produced"] >= client["acknowledged"] + client["spooled"]


class TestEveryStepNormRange:
    """torch's every-step norms accumulate in float32 (the C loop off, where no compiler builds
    it): a finite gradient whose sum of squares overflows it reads +inf there, and must reach
    the wire as unknown, never as "inf". The C loop's sum is float64's."""

    def records(self, enabled: bool | None, grad: float | list[float]) -> list[dict[str, Any]]:
        """Two steps whose gradient is ``grad`` (every element, or these 8); ``enabled``: the
        scaler's, None for no scaler at all (the optimizer's own step)."""
        w = nn.Parameter(torch.ones(8))
        model = nn.Module()
        model.register_parameter("w", w)
        opt = torch.optim.SGD([w], lr=0.0)
        scaler = None if enabled is None else torch.amp.GradScaler(
            "cpu", init_scale=1.0, growth_interval=10**6, enabled=enabled)
        sink = MemorySender()
        mon = ampscope.watch(model, scaler, opt, sender=sink, run="range", layer_every=10**6,
                             activation_every=0, histogram_every=0)
        x = torch.tensor(grad) if isinstance(grad, list) else torch.full((8,), grad)
        for _ in range(2):
            opt.zero_grad()
            loss = (w * x).sum()
            if scaler is None:
                mon.record_loss(loss).backward()
                opt.step()
                continue
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        mon.close()
        return [r for p in sink.payloads() for r in p["records"]]

    def test_overflowed_sum_of_squares_is_unknown_not_inf(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(fused, "NATIVE", False)
        recs = self.records(True, 1e20)  # each raw element finite, their squares are not
        # step 0 is a per-layer stats step (float64 throughout), step 1 takes the norms path
        assert [(r["found_inf"], r["grad_norm"]) for r in recs] == [
            (False, pytest.approx(1e20 * math.sqrt(8))), (False, None)]

    def test_the_c_loop_reads_such_a_norm(self) -> None:
        native_read.library()
        recs = self.records(True, 1e20)
        assert [(r["found_inf"], r["grad_norm"]) for r in recs] == [
            (False, pytest.approx(1e20 * math.sqrt(8)))] * 2

    def test_a_real_inf_stays_inf(self) -> None:
        recs = self.records(True, math.inf)
        assert [(r["found_inf"], r["grad_norm"]) for r in recs] == [(True, "inf")] * 2

    def test_in_range_norms_are_sent(self) -> None:
        recs = self.records(True, 3.0)
        assert [r["grad_norm"] for r in recs] == [pytest.approx(3.0 * math.sqrt(8))] * 2

    @pytest.mark.parametrize("native", [False, True], ids=["torch-norms", "c-loop-norms"])
    @pytest.mark.parametrize("enabled", [False, None])
    def test_without_found_inf_an_overflow_is_told_from_an_inf(
            self, enabled: bool | None, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
        """A disabled scaler or none: no found_inf to ask, so torch's float32 read checks each
        layer's bounds (``GradStats.checked_norms``): an overflow is unknown and finite, an
        inf element (either sign) is an inf, step 1's norms as step 0's exact stats say. The C
        loop's float64 read has no overflow to tell."""
        if native:
            native_read.library()
        monkeypatch.setattr(fused, "NATIVE", native)
        recs = self.records(enabled, 1e20)
        step1 = pytest.approx(1e20 * math.sqrt(8)) if native else None
        assert [(r["grad_norm"], r["found_inf"], r["nonfinite"]) for r in recs] == [
            (pytest.approx(1e20 * math.sqrt(8)), False, None), (step1, False, None)]
        recs = self.records(enabled, [1.0] * 7 + [-math.inf])
        found = enabled is None  # a disabled scaler reports no found_inf at all
        assert [(r["grad_norm"], r["found_inf"]) for r in recs] == [("inf", found)] * 2
        if found:
            assert [r["nonfinite"] for r in recs] == [[{"layer": 0, "kind": "inf"}]] * 2


class TestCopies:
    """Checkpoints taken mid-run: nothing the hook leaves on the user's objects may break
    ``pickle``, ``copy.deepcopy`` or ``torch.save``, and a copy is a plain, unwatched object."""

    @pytest.mark.parametrize("steps", [0, 1, 3])  # 0: before any step; 3: the probe is armed
    def test_model_optimizer_and_scaler_copy_at_any_step(self, steps: int) -> None:
        run = Run(activation_every=3, layer_every=1)
        for _ in range(steps):
            run.step()
        if steps == 3:
            assert run.mon._probe is not None and run.mon._probe.armed
        for obj in (run.model, run.opt, run.scaler):
            pickle.loads(pickle.dumps(obj))
            copy.deepcopy(obj)
            buf = io.BytesIO()
            torch.save(obj, buf)
            buf.seek(0)
            torch.load(buf, weights_only=False)
        produced = run.mon.stats().produced
        twin = copy.deepcopy(run.scaler)
        assert all(not isinstance(v, type(vars(run.scaler)["update"]))
                   for v in vars(twin).values())  # the copy holds none of the hook's wrappers
        opt = torch.optim.SGD(run.model.parameters(), lr=0.0)
        twin.scale(run.loss()).backward()
        twin.step(opt)
        twin.update()
        run.mon.close()
        assert run.mon.stats().produced == produced  # the copy's step was not recorded


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.compile
def test_fused_records_equal_the_eager_ones() -> None:
    """The same loop with the compiled kernel and without: the same records (the first steps
    overflow from 2^24, so NaN/inf layers are among them)."""
    fused, eager = Run(layer_every=1, fused=True), Run(layer_every=1, fused=False)
    grads = [torch.zeros_like(p) for p in fused.model.parameters()]
    assert fused.mon._stats.wait_fused(grads, True, 600.0) is not None
    for _ in range(12):
        fused.step()
        eager.step()
    assert fused.mon._stats.last_path == "fused" and eager.mon._stats.last_path == "eager"
    fused.mon.close()
    eager.mon.close()
    got, want = fused.records(), eager.records()
    assert len(got) == len(want) == 12
    assert any(r["found_inf"] for r in want) and not all(r["found_inf"] for r in want)
    for a, b in zip(got, want, strict=True):
        for name in STAT_NAMES:
            for x, y in zip(decoded(a["layers"][name]), decoded(b["layers"][name]),
                            strict=True):
                if math.isnan(y):
                    assert math.isnan(x)
                else:
                    assert x == pytest.approx(y, rel=1e-12 if name == "l2" else 0.0), name
        assert a["nonfinite"] == b["nonfinite"]


class Bf16Run:
    """A real BF16 CPU loop without a GradScaler (``watch(model, None, opt)``), keeping the
    truth of each step: the loss handed to ``record_loss`` and the gradients ``opt.step`` got."""

    def __init__(self, optimizers: int = 1, **watch: Any) -> None:
        self.model = make_model()
        params = list(self.model.parameters())
        groups = [params] if optimizers == 1 else [params[:2], params[2:]]
        self.opts = [torch.optim.SGD(g, lr=0.05) for g in groups]
        self.sender = MemorySender()
        watch.setdefault("sender", self.sender)
        watch.setdefault("activation_every", 0)
        self.mon = ampscope.watch(self.model, None, self.opts if optimizers > 1 else self.opts[0],
                                  run="bf16", **watch)
        gen = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
        self.losses: list[float] = []
        self.grads: list[list[torch.Tensor]] = []

    def step(self, poison: dict[int, float] | None = None, stepping: tuple[int, ...] = ()) -> None:
        for opt in self.opts:
            opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self.model(self.x)
        loss = ((out.float() - self.y) ** 2).mean()
        self.mon.record_loss(loss).backward()
        self.losses.append(loss.item())
        params = list(self.model.parameters())
        for index, value in (poison or {}).items():
            grad = params[index].grad
            assert grad is not None
            grad.view(-1)[0] = value
        self.grads.append([p.grad.detach().clone() for p in params if p.grad is not None])
        for k in stepping or range(len(self.opts)):
            self.opts[k].step()

    def records(self) -> list[dict[str, Any]]:
        return [r for p in self.sender.payloads() for r in p["records"]]


class TestWithoutAScaler:
    def test_bf16_steps_are_recorded_without_a_scale(self) -> None:
        run = Bf16Run(layer_every=2)
        for _ in range(4):
            run.step()
        run.mon.close()
        records = run.records()
        assert [r["step"] for r in records] == [0, 1, 2, 3]
        assert [(r["scale_before"], r["scale_after"], r["growth_tracker"], r["found_inf"],
                 r["skipped"], r["nonfinite"], r["captured"]) for r in records] == [
            (None, None, None, False, False, None, "after_unscale")] * 4
        assert [r["loss"] for r in records] == pytest.approx(run.losses, rel=1e-12)
        want_norms = [math.sqrt(sum(float(g.double().square().sum()) for g in grads))
                      for grads in run.grads]
        # Per-layer steps (0, 2): float64 partials; the others the every-step float32 read
        # (checked for overflow: GradStats.checked_norms), to float32 rounding.
        got = [r["grad_norm"] for r in records]
        assert got[::2] == pytest.approx(want_norms[::2], rel=1e-12)
        assert got[1::2] == pytest.approx(want_norms[1::2], rel=1e-6)
        assert [r["layers"] is not None for r in records] == [True, False, True, False]
        l2 = [float(g.double().norm()) for g in run.grads[2]]
        assert records[2]["layers"]["l2"] == pytest.approx(l2, rel=1e-12)
        assert run.sender.payloads()[0]["run"]["target_format"] == "bf16"
        assert run.mon.stats() == ampscope.MonitorStats(4, 4, 0, 0, 0, 0)

    def test_fp16_parameters_without_a_scaler_are_judged_as_fp16(self) -> None:
        """``model.half()`` and no scaler (#30): stored and judged as bf16 before (headroom
        130.8 bits); FP16 parameters are FP16, said with the reason."""
        model = make_model().half()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        sender = MemorySender()
        mon = ampscope.watch(model, None, opt, sender=sender, activation_every=0)
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1)).half()
        mon.record_loss(model(x).float().square().mean()).backward()
        opt.step()
        mon.close()
        assert mon.fmt.name == "fp16"
        n = len(list(model.parameters()))
        run = sender.payloads()[0]["run"]
        assert (run["target_format"], run["target_format_reason"]) == (
            "fp16", f"{n} of {n} parameter tensors are FP16")

    @pytest.mark.parametrize("layer_every", [0, 1])  # the every-step norms, the partials
    def test_a_nonfinite_gradient_is_found_and_the_step_not_skipped(
            self, layer_every: int) -> None:
        run = Bf16Run(layer_every=layer_every)
        run.step()
        run.step(poison={0: math.nan, 2: math.inf})
        run.step()
        run.mon.close()
        records = run.records()
        assert [(r["found_inf"], r["skipped"]) for r in records] == [
            (False, False), (True, False), (True, False)]  # the NaN reached the weights
        # backward order: the second Linear's weight (index 2) before the first's (index 0)
        assert records[1]["nonfinite"] == [{"layer": 2, "kind": "inf"},
                                           {"layer": 0, "kind": "nan"}]
        assert records[1]["grad_norm"] == "nan"

    def test_one_record_per_cycle_of_two_optimizers(self) -> None:
        run = Bf16Run(optimizers=2, layer_every=0)
        run.step()  # both step: one record
        run.step(stepping=(0,))  # only the first: its cycle stays open...
        run.step()  # ...until the first steps again, which ends it; then both step
        run.mon.close()
        records = run.records()
        assert [r["step"] for r in records] == [0, 1, 2]
        assert [r["loss"] for r in records] == pytest.approx(
            [run.losses[0], run.losses[1], run.losses[2]], rel=1e-12)

    def test_an_optimizer_that_did_not_step_is_not_called_skipped(self) -> None:
        run = Bf16Run(optimizers=2, layer_every=0)
        run.step()
        run.step(stepping=(0,))
        run.step()
        run.mon.close()
        assert [[o["skipped"] for o in r["optimizers"]] for r in run.records()] == [
            [False, False], [False, None], [False, False]]

    @pytest.mark.parametrize("keyword", [False, True])
    def test_a_closure_step_is_captured_after_its_backward(self, keyword: bool) -> None:
        run = Bf16Run(layer_every=1)
        opt = run.opts[0]

        def closure() -> torch.Tensor:  # the backward runs inside step(), as LBFGS's does
            opt.zero_grad()
            loss: torch.Tensor = ((run.model(run.x) - run.y) ** 2).mean()
            run.mon.record_loss(loss).backward()
            run.losses.append(loss.item())
            run.grads.append([p.grad.detach().clone() for p in run.model.parameters()
                              if p.grad is not None])
            return loss

        for _ in range(3):
            opt.step(closure=closure) if keyword else opt.step(closure)
        run.mon.close()
        records = run.records()
        want = [math.sqrt(sum(float(g.double().square().sum()) for g in grads))
                for grads in run.grads]
        assert [r["grad_norm"] for r in records] == pytest.approx(want, rel=1e-12)
        assert [r["loss"] for r in records] == pytest.approx(run.losses, rel=1e-12)
        assert [r["layers"]["l2"] for r in records] == [
            pytest.approx([float(g.double().norm()) for g in grads], rel=1e-12)
            for grads in run.grads]

    def test_gradient_accumulation_sums_the_recorded_losses(self) -> None:
        run = Bf16Run(layer_every=0)
        opt = run.opts[0]
        opt.zero_grad()
        losses = []
        for _ in range(2):
            loss = ((run.model(run.x) - run.y) ** 2).mean() / 2  # divided by k, as the docs do
            run.mon.record_loss(loss).backward()
            losses.append(loss.item())
        opt.step()
        run.mon.close()
        assert [r["loss"] for r in run.records()] == [pytest.approx(sum(losses), rel=1e-12)]

    def test_an_optimizer_is_required(self) -> None:
        with pytest.raises(ValueError, match=r"pass it, ampscope\.watch"):
            ampscope.watch(make_model(), None, sender=MemorySender())

    def test_what_is_no_optimizer_is_refused_by_name(self) -> None:
        with pytest.raises(ValueError, match=r"^ampscope: dict is not a torch optimizer and "
                                             r"holds none as \.optimizer$"):
            ampscope.watch(make_model(), None, {"lr": 0.1},  # type: ignore[arg-type]
                           sender=MemorySender())

    def test_close_removes_the_step_hooks(self) -> None:
        run = Bf16Run()
        opt = run.opts[0]
        assert len(opt._optimizer_step_pre_hooks) == len(opt._optimizer_step_post_hooks) == 1
        run.step()
        run.mon.close()
        assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
        run.step()  # training goes on, unobserved
        assert run.mon.stats().produced == 1

    def test_the_optimizer_copies_without_the_hooks(self) -> None:
        run = Bf16Run(activation_every=2, layer_every=1)
        run.step()
        run.step()  # the probe is armed for step 2
        for obj in (run.model, run.opts[0]):
            pickle.loads(pickle.dumps(obj))
            buf = io.BytesIO()
            torch.save(obj, buf)
            buf.seek(0)
            torch.load(buf, weights_only=False)
        twin = copy.deepcopy(run.opts[0])
        assert not twin._optimizer_step_pre_hooks and not twin._optimizer_step_post_hooks
        run.mon.close()

    def test_record_loss_is_ignored_with_a_scaler(self, caplog: pytest.LogCaptureFixture) -> None:
        run = Run(layer_every=0)
        for _ in range(2):
            run.mon.record_loss(torch.tensor(123.0))
            run.step()
        run.mon.close()
        assert [r["loss"] for r in run.records()] == pytest.approx(
            [t["loss"] for t in run.truth], rel=1e-6)
        assert sum("record_loss() is ignored" in r.message for r in caplog.records) == 1



class TestWatchSignature:
    def test_watch_takes_monitors_keywords_typed_and_no_catch_all(self) -> None:
        """``watch`` spells out every keyword of ``Monitor`` (same names, defaults and
        annotations), so a typo is a TypeError and mypy checks each option."""
        import inspect

        watch = inspect.signature(ampscope.watch).parameters
        monitor = inspect.signature(ampscope.Monitor.__init__).parameters
        assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in watch.values())
        keywords = {n: (p.default, p.annotation) for n, p in monitor.items()
                    if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert {n: (p.default, p.annotation) for n, p in watch.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY} == keywords
        assert len(keywords) == 26
        with pytest.raises(TypeError, match="unexpected keyword argument 'layer_evry'"):
            ampscope.watch(nn.Linear(2, 2), None, None, layer_evry=3)  # type: ignore[call-arg]
