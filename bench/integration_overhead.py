"""What ``AmpscopeCallback`` costs a real Lightning fit: step time with / without it, interleaved.

Inside the clock: every optimizer step of ``trainer.fit`` after ``--warmup`` untimed ones, from
one ``on_train_batch_end`` to the next (forward, backward, the optimizer, Lightning's own loop and
callbacks, and with ampscope the hook's capture, its record and whatever its sender thread takes
from the training thread's cores). Outside it: building the trainer and the fit's start-up and
tear-down (``watch()``, ``close()``), and the background compile of the fused per-layer kernel
(``ampscope.fused``, models of 2^17 gradient elements and more): each segment is a new fit, so a
new run, and would pay once per segment what a real run pays once. The warm-up (12 steps: the
histogram layout is met at step 0, the plain one at step 10) ends by waiting for those compiles;
their time is printed apart.

Method (as ``hook_overhead.py``): rounds of ``base hook base``; a round's ratio is the hook
segment's median step over the median of the two baseline segments beside it; the report gives
the median of the rounds' ratios and their range, with the machine's load average. ``control``
is a second baseline segment timed like the hook's: the bench's own noise floor. Records go to
``MemorySender`` (the real sender thread and encoding, no network).

``raw``: the same model, batch and precision in a plain loop (``zero_grad``, forward,
``backward``, ``step``; no Lightning) with ``ampscope.watch(model, None, optimizer)`` and
``record_loss``, against the same loop without it, in the same rounds: what the hook costs
without the integration, so the difference is what the callback adds.

Model: an MLP of ``--width`` (1M parameters at the default 768: 8 → 768 → 768 → 768 → 4
``Linear``s with ReLUs), batches of 64, SGD; ``--precision`` 32-true (FP32: no scaler, the
optimizer-hook path; the demanding case on this CPU, where bf16 matmuls run a slow fallback
that inflates the step) or bf16-mixed. The callback at its defaults (per-layer statistics
every 10th step, activations every 50th, histograms every 100th), or ``--layer-every``.

    .venv/bin/python bench/integration_overhead.py --rounds 8 --steps 60
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
import warnings
from typing import Any

import lightning
import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ampscope
from ampscope.integrations.lightning import AmpscopeCallback
from ampscope.transport import MemorySender


class Mlp(pl.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, width),
                                 nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, 4))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> Any:
        x, y = batch
        return ((self.net(x).float() - y) ** 2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class StepClock(pl.Callback):
    """Wall time between consecutive ``on_train_batch_end`` calls, after the warm-up."""

    def __init__(self, warmup: int, hook: AmpscopeCallback | None) -> None:
        self.warmup = warmup
        self.hook = hook
        self.last: float | None = None
        self.seen = 0
        self.steps: list[float] = []
        self.compile_s: list[float] = []

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.seen += 1
        if self.seen == self.warmup and self.hook is not None and self.hook.monitor is not None:
            for _, seconds, _ in self.hook.monitor._stats.compiles(timeout=900):
                self.compile_s.append(seconds or 0.0)
        now = time.perf_counter()
        if self.last is not None and self.seen > self.warmup:
            self.steps.append(now - self.last)
        self.last = now


COMPILES: list[float] = []


def raw_segment(width: int, precision: str, steps: int, warmup: int, hooked: bool) -> float:
    """The plain loop's median timed step (seconds); ``hooked``: under ``ampscope.watch``."""
    module = Mlp(width)
    net, opt = module.net, module.configure_optimizers()
    mon = ampscope.watch(net, None, opt, sender=MemorySender()) if hooked else None
    total = warmup + steps + 1
    x, y = torch.randn(64 * total, 8), torch.randn(64 * total, 4)
    times, last = [], None
    for i in range(total):
        if i == warmup and mon is not None:
            mon._stats.compiles(timeout=900)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            out = net(x[64 * i : 64 * (i + 1)])
        loss = ((out.float() - y[64 * i : 64 * (i + 1)]) ** 2).mean()
        (loss if mon is None else mon.record_loss(loss)).backward()
        opt.step()
        now = time.perf_counter()
        if last is not None and i >= warmup:
            times.append(now - last)
        last = now
    if mon is not None:
        mon.close()
    return statistics.median(times)


def segment(width: int, precision: str, steps: int, warmup: int,
            hook: dict[str, Any] | None) -> float:
    """One fit of ``warmup + steps`` steps; the median timed step in seconds."""
    callback = None if hook is None else AmpscopeCallback(sender=MemorySender(), **hook)
    clock = StepClock(warmup, callback)
    callbacks: list[pl.Callback] = [clock] if callback is None else [callback, clock]
    total = warmup + steps + 1
    data = TensorDataset(torch.randn(64 * total, 8), torch.randn(64 * total, 4))
    trainer = pl.Trainer(accelerator="cpu", devices=1, precision=precision,  # type: ignore[arg-type]
                         max_steps=total, callbacks=callbacks, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Mlp(width), DataLoader(data, batch_size=64))
    COMPILES.extend(clock.compile_s)
    return statistics.median(clock.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--layer-every", type=int, default=None)
    args = parser.parse_args()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    hook: dict[str, Any] = {}
    if args.layer_every is not None:
        hook["layer_every"] = args.layer_every
    params = sum(p.numel() for p in Mlp(args.width).parameters())
    print(f"Lightning {lightning.__version__}, torch {torch.__version__}, {params / 1e6:.2f}M "
          f"parameters, precision {args.precision}, hook {hook or 'defaults'}, "
          f"{args.rounds} rounds x {args.steps} steps (+{args.warmup} warm-up)")
    ratios: dict[str, list[float]] = {"ampscope": [], "control": [], "raw": []}
    base_ms: list[float] = []
    raw_ms: list[float] = []
    for r in range(args.rounds):
        order = ["ampscope", "control"] if r % 2 == 0 else ["control", "ampscope"]
        before = segment(args.width, args.precision, args.steps, args.warmup, None)
        for name in order:
            got = segment(args.width, args.precision, args.steps, args.warmup,
                          hook if name == "ampscope" else None)
            after = segment(args.width, args.precision, args.steps, args.warmup, None)
            ratios[name].append(got / statistics.median([before, after]))
            base_ms.append(1e3 * statistics.median([before, after]))
            before = after
        plain = [raw_segment(args.width, args.precision, args.steps, args.warmup, False)]
        hooked = raw_segment(args.width, args.precision, args.steps, args.warmup, True)
        plain.append(raw_segment(args.width, args.precision, args.steps, args.warmup, False))
        ratios["raw"].append(hooked / statistics.median(plain))
        raw_ms.append(1e3 * statistics.median(plain))
        print(f"round {r + 1}: ampscope {ratios['ampscope'][-1]:.3f}, control "
              f"{ratios['control'][-1]:.3f}, raw loop {ratios['raw'][-1]:.3f}, "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\nno-hook step: Lightning {statistics.median(base_ms):.2f} ms, plain loop "
          f"{statistics.median(raw_ms):.2f} ms; fused-kernel compiles "
          f"(per new run, background): {len(COMPILES)}, "
          f"{' '.join(f'{c:.1f}' for c in COMPILES[:6])} s")
    for name, values in ratios.items():
        print(f"{name:9s} median {statistics.median(values):.3f}  "
              f"(min {min(values):.3f}, max {max(values):.3f})")


if __name__ == "__main__":
    main()
