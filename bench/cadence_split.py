"""Where the hook's default cadence spends its time, by kind of step, in the sweep's CPU loop.

Two replicas of ``hook_sweep``'s model in one process (FP32 forward, ``GradScaler`` on, AdamW,
the same data, each step's dropout seeded with its number): one without the hook, one with it at
its defaults. Segments of 10 steps alternate between them (the order flips each round); the
first 10 steps are not counted. Each step k of the hooked replica is compared with step k of the
other, and the differences are grouped by what the hook's defaults do at that step: a plain step
(the norms), a per-layer step (``layer_every``), an activation-sampled step, and a step that
also samples the formats and the exponent histogram (every 100th). For each kind: the median
and mean added ms, and its share of the hooked run's added time per step (the mean times how
often it comes, and the median times how often: the machine's drift between segments moves
the means, a few slow segments the means of the rare kinds).

Inside each clock: one whole step (``zero_grad`` to ``update()``). Outside: the hook's sender
thread's work on the segment's records (``Monitor.flush`` after each segment). The machine's
speed drifts between segments; a kind that comes rarely is measured on few steps (their count
is printed), and the plain steps' mean carries that drift.

Usage: ``PYTHONPATH=client_hook:bench python bench/cadence_split.py [--size 4M] [--rounds 100]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

import torch
from hook_sweep import CLASSES, D_IN, SHAPES, make_model  # type: ignore[import-not-found]
from torch import nn

import ampscope
from ampscope import native_read
from ampscope.transport import MemorySender

SEGMENT = 10
FLUSH_TIMEOUT_S = 60.0


def kind(mon: ampscope.Monitor, step: int) -> str:
    """What the hook's defaults read at ``step`` (the cycle's own intervals)."""
    cycle = mon._cycle
    if cycle.formats_every and step % cycle.formats_every == 0:
        return "formats + histogram"
    if cycle.activation_every and step % cycle.activation_every == 0:
        return "activations"
    if any(step % n == 0 for n in cycle._cadence.distinct):
        return "per-layer"
    return "plain"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="4M", choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    native_read.library()  # built before the first step, as a run has it after a second
    replicas: list[tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler,
                         ampscope.Monitor | None, dict[int, float]]] = []
    for hook in (False, True):
        model = make_model(*SHAPES[args.size])
        adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
        amp = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        watched = ampscope.watch(model, amp, adamw, sender=MemorySender()) if hook else None
        replicas.append((model, adamw, amp, watched, {}))
    torch.manual_seed(1)
    x, y = torch.randn(4, 32, D_IN), torch.randint(0, CLASSES, (4,))
    before = os.getloadavg()
    for r in range(args.rounds):
        for model, opt, scaler, mon, times in replicas[::1 if r % 2 == 0 else -1]:
            for _ in range(SEGMENT):
                step = len(times)
                torch.manual_seed(step)
                start = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                scaler.scale(nn.functional.cross_entropy(model(x).mean(1), y)).backward()
                scaler.step(opt)
                scaler.update()
                times[step] = time.perf_counter() - start
            if mon is not None and not mon.flush(FLUSH_TIMEOUT_S):
                raise RuntimeError(f"the records were not sent within {FLUSH_TIMEOUT_S} s")
    after = os.getloadavg()
    base, hooked = replicas[0][4], replicas[1][4]
    mon = replicas[1][3]
    assert mon is not None
    steps = list(range(SEGMENT, len(base)))
    added: dict[str, list[float]] = defaultdict(list)
    for step in steps:
        added[kind(mon, step)].append(hooked[step] - base[step])
    mon.close()
    total = sum(hooked[s] for s in steps) / sum(base[s] for s in steps)
    median = statistics.median(hooked[s] for s in steps) / statistics.median(
        base[s] for s in steps)
    print(f"{args.size}: {len(steps)} steps each; no-hook median step "
          f"{statistics.median(base[s] for s in steps) * 1e3:.2f} ms; hooked / no hook: "
          f"{median:.4f} median, {total:.4f} total; load {before[0]:.2f} -> {after[0]:.2f} "
          f"({os.cpu_count()} cores)")
    print(f"  {'kind of step':<20} {'steps':>6} {'median added ms':>16} {'mean added ms':>14} "
          f"{'per step ms (mean, median)':>27}")
    for name in ("plain", "per-layer", "activations", "formats + histogram"):
        values = added.get(name, [])
        if not values:
            continue
        print(f"  {name:<20} {len(values):6d} {statistics.median(values) * 1e3:16.3f} "
              f"{statistics.mean(values) * 1e3:14.3f} {sum(values) / len(steps) * 1e3:13.3f} "
              f"{statistics.median(values) * len(values) / len(steps) * 1e3:13.3f}")


if __name__ == "__main__":
    main()
