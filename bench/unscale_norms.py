"""The every-step norms read in GradScaler's unscale (``step._UnscaleGrads``), end to end in the
sweep's CPU training loop: what a step costs without the hook, with the hook reading the norms
and then torch unscaling (two passes over the gradients), and with the C loop doing both in one
(docs/hook-cost.md#the-norms-in-the-unscale).

Configurations, one process, each its own replica of the model (``hook_sweep``'s: FP32 forward,
``GradScaler`` on, AdamW), the same data and dropout, segments interleaved in a rotating order:

- ``no hook``;
- ``plain, two passes`` / ``plain, one pass``: the hook with plain steps only (no per-layer
  statistics, no samplers), the norms read at the capture then torch's unscale
  (``StepCycle.unscale_reads`` off), or read in the unscale;
- ``default, two passes`` / ``default, one pass``: the same at the hook's defaults.

Inside the clock: each whole step (``zero_grad`` to ``update()``), and apart from it the
``scaler.step`` + ``update()`` part (the capture, the unscale, the optimizer, the record). Outside:
the hook's sender thread's work on the records, flushed after each segment (``Monitor.flush``),
which is the same for both ways. At the end every replica must hold the same weights to the bit:
the C loop's unscale is torch's.

Then the passes alone, on the model's gradients after a backward, each after a pass over 64 MiB
that pushes them out of the caches (as training's own work does between backward and the
unscale): torch's unscale (``_amp_foreach_non_finite_check_and_unscale_``), the C loop's norms
(``ampscope_norms``), and the two in one (``ampscope_unscale_norms``); inside each clock the one
call, outside it the eviction.

Usage: ``PYTHONPATH=client_hook:bench python bench/unscale_norms.py [--sizes 4M] [--rounds 15]
[--steps 20]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from hook_sweep import CLASSES, D_IN, SHAPES, make_model  # type: ignore[import-not-found]
from torch import nn

import ampscope
from ampscope import native_read
from ampscope.transport import MemorySender

FLUSH_TIMEOUT_S = 60.0


@dataclass
class Config:
    name: str
    model: nn.Module
    opt: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    mon: ampscope.Monitor | None
    taken: int = 0  # steps so far: each step's dropout is seeded with its number
    steps: list[float] = field(default_factory=list)  # per round: the median whole step
    seams: list[float] = field(default_factory=list)  # per round: the median step + update


def make(name: str, shape: tuple[int, int], hook: str | None, one_pass: bool) -> Config:
    """``hook``: None, "plain" (plain steps only) or "default"."""
    model = make_model(*shape)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    mon = None
    if hook == "plain":
        mon = ampscope.watch(model, scaler, opt, sender=MemorySender(), layer_every=0,
                             activation_every=0, histogram_every=0)
    elif hook == "default":
        mon = ampscope.watch(model, scaler, opt, sender=MemorySender())
    if mon is not None and not one_pass:
        mon._cycle.unscale_reads = False
    return Config(name, model, opt, scaler, mon)


def segment(c: Config, x: torch.Tensor, y: torch.Tensor, steps: int) -> None:
    """``steps`` steps; their median whole step and median ``step`` + ``update()``."""
    whole, seam = [], []
    for _ in range(steps):
        torch.manual_seed(c.taken)  # the same dropout in every replica at its k-th step
        c.taken += 1
        start = time.perf_counter()
        c.opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(c.model(x).mean(1), y)
        c.scaler.scale(loss).backward()
        middle = time.perf_counter()
        c.scaler.step(c.opt)
        c.scaler.update()
        end = time.perf_counter()
        whole.append(end - start)
        seam.append(end - middle)
    if c.mon is not None and not c.mon.flush(FLUSH_TIMEOUT_S):
        raise RuntimeError(f"the hook's records were not sent within {FLUSH_TIMEOUT_S} s")
    c.steps.append(statistics.median(whole))
    c.seams.append(statistics.median(seam))


def passes_alone(c: Config, x: torch.Tensor, y: torch.Tensor, rounds: int) -> str:
    """The median ms of torch's unscale, the C loop's norms, and both in one pass."""
    c.opt.zero_grad(set_to_none=True)
    c.scaler.scale(nn.functional.cross_entropy(c.model(x).mean(1), y)).backward()
    grads = [p.grad for p in c.model.parameters() if p.grad is not None]
    layout = native_read.NativeNorms.of(native_read.library(), grads)
    unscale = layout.unscale
    assert unscale is not None
    pointers = array("q", [g.data_ptr() for g in grads])
    args = (len(grads), pointers.buffer_info()[0], layout.numels.buffer_info()[0],
            layout.codes.buffer_info()[0])
    one, found = torch.ones(()), torch.zeros(())  # an inverse scale of 1: nothing changes
    out = torch.empty(len(grads), dtype=torch.float64)
    passes: dict[str, Callable[[], object]] = {
        "torch's unscale": lambda: torch._amp_foreach_non_finite_check_and_unscale_(
            grads, found, one),
        "the C loop's norms": lambda: layout.read(*args, layout.threads, out.data_ptr()),
        "both in one pass": lambda: unscale(*args, one.data_ptr(), found.data_ptr(),
                                            layout.threads, out.data_ptr()),
    }
    evict = torch.empty(16 << 20)
    times: dict[str, list[float]] = {name: [] for name in passes}
    for _ in range(rounds):
        for name, fn in passes.items():
            evict.add_(1.0)
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return ", ".join(f"{name} {statistics.median(t) * 1e3:.3f} ms" for name, t in times.items())


def run_size(size: str, rounds: int, steps: int) -> None:
    shape = SHAPES[size]
    configs = [make("no hook", shape, None, False),
               make("plain, two passes", shape, "plain", False),
               make("plain, one pass", shape, "plain", True),
               make("default, two passes", shape, "default", False),
               make("default, one pass", shape, "default", True)]
    torch.manual_seed(1)
    x, y = torch.randn(4, 32, D_IN), torch.randint(0, CLASSES, (4,))
    before = os.getloadavg()
    for c in configs:  # warm-up, untimed
        segment(c, x, y, 5)
    for c in configs:
        c.steps.clear()
        c.seams.clear()
    for r in range(rounds):
        for c in configs[r % len(configs):] + configs[:r % len(configs)]:
            segment(c, x, y, steps)
    after = os.getloadavg()
    unscaled = [c.mon._cycle.stats.unscaled for c in configs if c.mon is not None]
    base = configs[0]
    weights = [torch.cat([p.detach().reshape(-1) for p in c.model.parameters()])
               for c in configs]
    same = all(torch.equal(w.view(torch.int32), weights[0].view(torch.int32)) for w in weights)
    alone = passes_alone(base, x, y, 10 * rounds)
    for c in configs:
        if c.mon is not None:
            c.mon.close()
    print(f"\n{size}: {sum(p.numel() for p in base.model.parameters()) / 1e6:.2f} M parameters; "
          f"{rounds} rounds x {steps} steps; load {before[0]:.2f} -> {after[0]:.2f} "
          f"({os.cpu_count()} cores); the last step unscaled by the C loop: {unscaled}; the "
          f"same weights in every configuration: {'yes' if same else 'NO'}")
    print(f"  {'configuration':<22} {'step ms':>8} {'ratio (min-max)':>22} "
          f"{'step+update ms':>15} {'added ms':>9}")
    for c in configs:
        ratios = [s / b for s, b in zip(c.steps, base.steps, strict=True)]
        print(f"  {c.name:<22} {statistics.median(c.steps) * 1e3:8.2f} "
              f"{statistics.median(ratios):8.3f} ({min(ratios):.3f}-{max(ratios):.3f}) "
              f"{statistics.median(c.seams) * 1e3:15.3f} "
              f"{(statistics.median(c.seams) - statistics.median(base.seams)) * 1e3:9.3f}")
    print(f"  the passes alone (median of {10 * rounds}): {alone}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4M", help="comma-separated: " + ",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    native_read.library()  # built before the first step, as a run has it after a second
    for size in args.sizes.split(","):
        run_size(size, args.rounds, args.steps)


if __name__ == "__main__":
    main()
