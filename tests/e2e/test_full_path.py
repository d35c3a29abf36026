"""The whole path: a real CPU AMP training with `ampscope.watch` → a real server → the read API.

The truth is read from the `GradScaler` itself and from the gradients themselves during the run
(an independent NumPy reference of DESIGN.md §3), then compared with what the API gives back, on
SQLite and on Postgres.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

import ampscope
from tests.support.distributed import run_job
from tests.support.servers import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo_model import make_training, train_step

pytestmark = pytest.mark.slow

STEPS = 40
FP16 = torch.finfo(torch.float16)
FP16_MIN_SUBNORMAL = FP16.smallest_normal * FP16.eps  # 2^-24


@pytest.fixture
def server(module_server: ServerProcess) -> ServerProcess:
    """One real server per dialect for the module; each test trains a run of its own and reads
    back the runs it added (``added_runs``)."""
    return module_server


def run_ids(server: ServerProcess) -> set[str]:
    return {r["id"] for r in strict_json(httpx.get(f"{server.url}/api/runs"))}


def added_runs(server: ServerProcess, before: set[str]) -> list[dict[str, Any]]:
    """The runs on the server that were not there in ``before``."""
    return [r for r in strict_json(httpx.get(f"{server.url}/api/runs")) if r["id"] not in before]


def reject_constant(token: str) -> float:
    raise AssertionError(f"bare {token} in a JSON body: browsers reject it")


def strict_json(resp: httpx.Response) -> Any:
    assert resp.status_code == 200, resp.text
    return json.loads(resp.text, parse_constant=reject_constant)


def tag(value: float | None) -> float | str | None:
    """What a float looks like on the wire and in the API (docs/contracts.md)."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def reference_stats(scaled: np.ndarray, scale: float) -> dict[str, float | int | None]:
    """DESIGN.md §3 for one gradient, in float64 NumPy; `scaled` is the gradient before unscale_."""
    g = np.abs(scaled.astype(np.float64)) / scale
    finite = g[np.isfinite(g)]
    nonzero = finite[finite > 0]
    at_scale = nonzero * scale
    n = g.size
    return {
        "amax": float(finite.max()) if finite.size else None,
        "amin_nz": float(nonzero.min()) if nonzero.size else None,
        "zero_frac": float((finite == 0).sum() / n),
        "subnormal_frac": float((at_scale < FP16.smallest_normal).sum() / n),
        "underflow_frac": float((at_scale < FP16_MIN_SUBNORMAL / 2).sum() / n),
        "nan_count": int(np.isnan(g).sum()),
        "inf_count": int(np.isinf(g).sum()),
        "l2": float(np.sqrt((finite**2).sum())),
    }


@dataclass
class Truth:
    scales_before: list[float] = field(default_factory=list)
    scales_after: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    layers: list[dict[str, list[Any]]] = field(default_factory=list)


def train_watched(server_url: str, poison_step: int | None = None) -> tuple[str, list[str], Truth]:
    """Train STEPS steps under ampscope.watch, reading the truth from the scaler and the grads.

    At `poison_step`, one gradient element becomes NaN and one +inf after backward, as a real
    overflow would leave them.
    """
    model, scaler, optimizer, gen = make_training(growth_interval=10)
    names = [name for name, _ in model.named_parameters()]
    truth = Truth()
    grads: dict[str, np.ndarray] = {}

    def keep(name: str) -> Any:
        def hook(param: torch.Tensor) -> None:
            assert param.grad is not None
            grads[name] = param.grad.detach().clone().numpy()
        return hook

    for name, param in model.named_parameters():
        param.register_post_accumulate_grad_hook(keep(name))

    if poison_step is not None:
        first = next(model.parameters())

        def poison(param: torch.Tensor) -> None:
            if len(truth.scales_before) == poison_step + 1:
                assert param.grad is not None
                param.grad.view(-1)[0] = float("nan")
                param.grad.view(-1)[1] = float("inf")
                grads[names[0]] = param.grad.detach().clone().numpy()
        first.register_post_accumulate_grad_hook(poison)

    mon = ampscope.watch(model, scaler, optimizer, run="full-path", server=server_url,
                         tags=["test"], layer_every=1)
    for _ in range(STEPS):
        scale = scaler.get_scale()
        truth.scales_before.append(scale)
        truth.losses.append(float(train_step(model, scaler, optimizer, gen)))
        truth.scales_after.append(scaler.get_scale())
        stats = [reference_stats(grads[name], scale) for name in names]
        truth.layers.append({key: [s[key] for s in stats] for key in stats[0]})
    mon.close()
    assert mon.stats().dropped == 0
    return mon.run_id, names, truth


def assert_layer_stats_equal(got: dict[str, list[Any]], want: dict[str, list[Any]]) -> None:
    assert set(got) == set(want)
    for key, values in want.items():
        for layer, (g, w) in enumerate(zip(got[key], values, strict=True)):
            if w is None or isinstance(w, int):
                assert g == w, (key, layer)
            else:
                # The hook reduces in float32 on the device; the reference is float64.
                assert g == pytest.approx(w, rel=1e-5, abs=1e-30), (key, layer)


class TestFullPath:
    def test_api_returns_what_the_scaler_and_gradients_produced(
        self, server: ServerProcess
    ) -> None:
        before = run_ids(server)
        run_id, names, truth = train_watched(server.url)
        skipped = [a < b for a, b in zip(truth.scales_after, truth.scales_before, strict=True)]
        assert any(skipped) and not all(skipped)  # the scenario really overflows, then trains

        runs = added_runs(server, before)
        assert [r["id"] for r in runs] == [run_id]
        assert runs[0]["num_steps"] == STEPS
        assert runs[0]["skipped_steps"] == sum(skipped)
        assert runs[0]["status"] == "finished"

        export = strict_json(httpx.get(f"{server.url}/api/runs/{run_id}/export",
                                       params={"format": "json"}))
        assert [layer["name"] for layer in export["layers"]] == names
        steps = export["steps"]
        assert [s["step"] for s in steps] == list(range(STEPS))
        assert [s["scale_before"] for s in steps] == truth.scales_before
        assert [s["scale_after"] for s in steps] == truth.scales_after
        assert [s["skipped"] for s in steps] == skipped
        assert [s["found_inf"] for s in steps] == skipped
        assert [s["loss"] for s in steps] == pytest.approx(truth.losses, rel=1e-6)
        for got, want in zip(steps, truth.layers, strict=True):
            assert_layer_stats_equal(got["layers"], want)

        events = strict_json(httpx.get(f"{server.url}/api/runs/{run_id}/events"))["events"]
        assert sorted({e["step"] for e in events if e["kind"] == "skipped"}) == [
            i for i, s in enumerate(skipped) if s
        ]

    def test_nan_and_inf_gradients_survive_as_data(self, server: ServerProcess) -> None:
        poison_step = 30  # well after the calibration overflows: the scale alone is not to blame
        run_id, _, truth = train_watched(server.url, poison_step=poison_step)
        export_body = httpx.get(f"{server.url}/api/runs/{run_id}/export",
                                params={"format": "json"})
        step = strict_json(export_body)["steps"][poison_step]
        assert step["found_inf"] is True and step["skipped"] is True
        assert step["grad_norm"] == "nan"
        assert step["layers"]["nan_count"][0] == 1
        assert step["layers"]["inf_count"][0] == 1
        assert sum(step["layers"]["nan_count"]) == 1 and sum(step["layers"]["inf_count"]) == 1
        assert_layer_stats_equal(step["layers"], truth.layers[poison_step])

        live = strict_json(httpx.get(f"{server.url}/api/runs/{run_id}/steps"))["steps"]
        assert live[poison_step]["grad_norm"] == "nan"
        assert tag(truth.scales_after[poison_step]) == live[poison_step]["scale_after"]


def test_a_bf16_run_without_a_scaler(server: ServerProcess) -> None:
    """``watch(model, None, optimizer)``: every step stored with a null scale, a NaN gradient as
    a found_inf step that was not skipped, the layers against bf16, and read back as sent."""
    torch.manual_seed(0)
    last = torch.nn.Linear(16, 4)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = ampscope.watch(model, None, opt, run="bf16", server=server.url, layer_every=1)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)
    losses = []
    for step in range(6):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        loss = ((out.float() - y) ** 2).mean()
        mon.record_loss(loss).backward()
        losses.append(loss.item())
        if step == 4:
            grad = last.weight.grad
            assert grad is not None
            grad.view(-1)[0] = float("nan")
        opt.step()
    mon.close()
    assert mon.stats().acknowledged == 6

    run = strict_json(httpx.get(f"{server.url}/api/runs/{mon.run_id}"))
    assert run["target_format"] == "bf16" and run["skipped_steps"] == 0
    steps = strict_json(httpx.get(f"{server.url}/api/runs/{mon.run_id}/export",
                                  params={"format": "json"}))["steps"]
    assert [(s["scale_before"], s["scale_after"], s["skipped"]) for s in steps] == [
        (None, None, False)] * 6
    assert [s["found_inf"] for s in steps] == [False] * 4 + [True, True]  # the NaN stepped in
    assert [s["loss"] for s in steps[:5]] == pytest.approx(losses[:5], rel=1e-12)
    assert steps[4]["grad_norm"] == "nan" and steps[4]["layers"]["nan_count"] == [0, 0, 1, 0]
    assert steps[4]["nonfinite"] == [{"layer": 2, "kind": "nan"}]
    events = strict_json(httpx.get(f"{server.url}/api/runs/{mon.run_id}/events"))["events"]
    assert [(e["step"], e["kind"], e["loss_finite"]) for e in events] == [
        (4, "nonfinite", True), (5, "nonfinite", False)]
    assert events[0]["layers"] == [{"index": 2, "kind": "nan", "name": "2.weight"}]
    # The NaN stepped into the weights: step 5's forward is NaN, and the findings say so.
    findings = strict_json(httpx.get(f"{server.url}/api/runs/{mon.run_id}/findings"))
    assert [(f["kind"], f["step_start"]) for f in findings["findings"]] == [
        ("forward_overflow", 5)]
    assert httpx.get(f"{server.url}/runs/{mon.run_id}").status_code == 200


def test_a_ddp_job_is_one_run_that_names_the_rank_that_went_nan(
        server: ServerProcess, tmp_path: Path) -> None:
    """Two real DDP ranks (gloo) into a real server: one run of world size 2, every step once
    with both ranks' losses, and rank 1's NaN loss at step 2 named by ``/ranks``."""
    before = run_ids(server)
    zero, one = run_job(tmp_path, f"ddp+nan+server={server.url}")
    assert (zero["produced"], zero["acknowledged"], one["produced"]) == (4, 4, 0)
    run_id = zero["run_id"]
    runs = added_runs(server, before)
    assert [(r["id"], r["world_size"]) for r in runs] == [(run_id, 2)]
    steps = strict_json(httpx.get(f"{server.url}/api/runs/{run_id}/export",
                                  params={"format": "json"}))["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert [s["ranks"]["loss"] for s in steps] == [
        [a, b] for a, b in zip(zero["losses"], one["losses"], strict=True)]
    assert steps[2]["ranks"]["nonfinite"] == [4, 4]
    assert all(s["optimizers"] is None for s in steps)  # one optimizer, one group: lr, skipped
    summary = strict_json(httpx.get(f"{server.url}/api/runs/{run_id}/ranks"))
    assert summary["world_size"] == 2
    first = summary["first_nonfinite"]
    # Both ranks' gradients went NaN through the all-reduce; the loss names where it started.
    assert (first["step"], first["ranks"], first["loss"], first["nonfinite"]) == (
        2, [1], [zero["losses"][2], "nan"], [4, 4])
    findings = strict_json(httpx.get(f"{server.url}/api/runs/{run_id}/findings"))["findings"]
    ranked = [f for f in findings if f["kind"] == "rank_nonfinite"]
    assert [(f["severity"], f["title"]) for f in ranked] == [
        ("error", "Rank 1 went non-finite first, at step 2, while the loss of rank 0 was finite")]
