"""What every scenario shares: the training it describes, how it runs under the hook, its CLI."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import ampscope
from ampscope.monitor import Monitor
from ampscope.transport import MemorySender, Sender

StepFn = Callable[[int, Monitor], torch.Tensor | None]
"""One optimizer step of the loop; returns the step's loss (detached) where the scenario
reports it (`twin_losses`)."""


@dataclass
class Scenario:
    """A model, its scaler and optimizer, and ``step(i, mon)``: one optimizer step of the loop."""

    name: str
    model: nn.Module
    scaler: torch.amp.GradScaler
    optimizer: torch.optim.Optimizer
    step: StepFn
    steps: int
    watch: dict[str, Any] = field(default_factory=dict)
    """Options for ``ampscope.watch`` beyond the run name and the destination."""


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def amp_step(
    model: nn.Module, scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer,
    x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn = nn.functional.mse_loss,
    mon: Monitor | None = None,
) -> torch.Tensor:
    """One ordinary FP16 AMP step on the CPU: autocast forward, the loss (MSE unless
    ``loss_fn``) in FP32, scale, backward, step, update. With a disabled scaler the same step
    in FP32 (no autocast): the scenario's FP32 twin. ``mon`` with its FP32 shadow step on
    (``run_scenario(shadow_every=N)``): the step's closure is registered with it first
    (``mon.recheck``), so the shadow step re-runs this batch; without it none is, and the
    scenario's other runs keep no re-check."""
    if mon is not None and mon.shadow_every:
        mon.recheck(lambda: loss_fn(model(x).float(), y))
    with torch.autocast("cpu", dtype=torch.float16, enabled=scaler.is_enabled()):
        out = model(x)
    loss = loss_fn(out.float(), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def run_scenario(
    scenario: Scenario, *, server: str | None = None, sender: Sender | None = None,
    run_name: str | None = None, shadow_every: int | None = None, **watch: Any,
) -> Monitor:
    """Train ``scenario`` under a real hook sending to ``server`` (or ``sender``); closes the
    hook (every record flushed) and returns it. ``shadow_every=N``: every N-th applied step is
    an FP32 shadow step, on the batch whose closure ``amp_step(..., mon=mon)`` registers (a
    scenario whose step does not pass ``mon`` gets none); None: the scenario's own setting."""
    options = {**scenario.watch, **watch}
    if shadow_every is not None:
        options["shadow_every"] = shadow_every
    mon = ampscope.watch(scenario.model, scenario.scaler, scenario.optimizer,
                         run=run_name or scenario.name, server=server, sender=sender,
                         tags=["scenario", scenario.name], **options)
    try:
        for i in range(scenario.steps):
            scenario.step(i, mon)
    finally:
        mon.close()
    return mon


def twin_losses(build: Callable[..., Scenario], **options: Any) -> list[float]:
    """The losses of ``build(fp32=True, **options)``, the scenario's FP32 twin (the same model,
    data and optimizer without autocast or loss scaling), trained without a hook: the truth a
    diagnosis of the AMP run is checked against."""
    scenario = build(fp32=True, **options)
    mon = ampscope.watch(scenario.model, scenario.scaler, scenario.optimizer, enabled=False)
    losses = []
    for i in range(scenario.steps):
        loss = scenario.step(i, mon)
        losses.append(math.nan if loss is None else float(loss))
    return losses


def _summary(records: list[dict[str, Any]]) -> str:
    skipped = [r["step"] for r in records if r["skipped"]]
    scales = [r["scale_after"] for r in records]
    rechecks = [f"step {r['step']}: {r['recheck']['status']}" for r in records
                if r.get("recheck")]
    misuse = sorted({m["kind"] for r in records for m in (r.get("misuse") or [])})
    losses = [r["loss"] for r in records if isinstance(r["loss"], float)]
    lines = [
        f"{len(records)} steps, {len(skipped)} skipped"
        + (f" (first {skipped[:8]})" if skipped else ""),
        f"scale: first {scales[0]}, last {scales[-1]}" if scales else "no steps",
        f"last finite loss: {losses[-1]:.6g}" if losses else "no finite loss",
    ]
    if rechecks:
        lines.append("FP32 re-checks: " + ", ".join(rechecks[:5]))
    if misuse:
        lines.append("AMP misuse: " + ", ".join(misuse))
    swallowed = [f for r in records for f in (r.get("swallowed") or []) if f is not None]
    if swallowed:
        lines.append(f"swallowed updates: mean {sum(swallowed) / len(swallowed):.3f}")
    underflow = [max(r["layers"]["zero_frac"]) for r in records if r.get("layers")]
    if underflow:
        lines.append(f"max zero_frac per layer-stat step: last {underflow[-1]:.3f}")
    return "\n".join(lines)


def main(build: Callable[..., Scenario], doc: str | None) -> None:
    """The scenario CLI: ``--server URL`` streams to a server, without it the run is offline
    and a summary of what the hook recorded is printed."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--server", default=None, help="e.g. http://127.0.0.1:8765")
    parser.add_argument("--run", default=None, help="run name (default: the scenario's)")
    parser.add_argument("--project", default="default", help="the run's project (default: default)")
    parser.add_argument("--token", default=None,
                        help="an ingest token for a server with auth (default: $AMPSCOPE_TOKEN; "
                             "the variable keeps it out of your shell history)")
    args = parser.parse_args()
    scenario = build()
    if args.server:
        mon = run_scenario(scenario, server=args.server, run_name=args.run, project=args.project,
                           **({"token": args.token} if args.token else {}))
        print(f"{scenario.name}: run {mon.run_id} -> {args.server}/runs/{mon.run_id}")
        return
    sink = MemorySender()
    run_scenario(scenario, sender=sink, run_name=args.run)
    records = [r for body in sink.payloads() for r in body["records"]]
    print(f"{scenario.name} (offline)\n{_summary(records)}")


def mlp(seed: int = 0, width: int = 32, inputs: int = 8) -> nn.Module:
    """A small regression MLP (Tanh: no exact-zero gradients from dead units)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(inputs, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                         nn.Linear(width, 1))


def regression_batch(
    gen: torch.Generator, batch: int = 32, inputs: int = 8
) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard-normal inputs, a smooth bounded target."""
    x = torch.randn(batch, inputs, generator=gen)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True))
    return x, y
