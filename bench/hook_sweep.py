"""Hook overhead against model size (#12): the per-layer statistics must not cost more on a bigger
model than one read of its gradients.

Models: one family, ``Linear(32, d)``, a 2-layer ``nn.TransformerEncoder`` (d, 4 heads, ff 4d)
and a token-wise 4-layer MLP ``width`` wide, 34 parameter tensors; AdamW, ``GradScaler`` on,
**FP32 forward** (this CPU has no fast fp16/bf16 GEMM, so an autocast step would be made of the
slow fallback and hide the hook), batch 4 x 32 tokens by default (``--batch``, ``--tokens``).
``4M`` is the shape #12 measured (d=256, 4 x 1024 MLP: 3.96 M parameters).

Configurations, each its own model copy, monitor and scaler, kept across its segments:

- ``control``: a second no-hook model (the bench's own floor: noise and memory placement);
- ``default``: ampscope at the default cadence (scalars every step, per-layer stats every 10th);
- ``every``: per-layer stats every step (the fused kernel once compiled);
- ``every_eager``: per-layer stats every step, ``fused=False`` (the exact eager fallback).

Method, as ``hook_overhead.py``: per size, ``--rounds`` rounds of ``base X1 base X2 … base``, the
order rotated each round; a configuration's ratio in a round is its segment's median step over the
median of the two baseline segments beside it; printed: the median of those ratios (min-max) and
the total-time ratio (all its steps, sampled ones and the sender thread's batches included, plus
the segment's ``flush``, over the neighbouring baseline segments' mean total), the ratio of the
10th-percentile step times (``p10``: on a shared, loaded machine the least contended steps), and
the **CPU-time ratio** (``cpu``): the process's CPU time (``time.process_time``: every thread,
training's OpenMP team and ampscope's sender thread included) over a configuration's segments,
against the neighbouring baseline segments' mean, as for the total-time ratio. On a shared machine
it is the less noisy figure (a descheduled thread accrues no CPU time), though it also counts what
the hook's threads do off the training thread's critical path.

Each hooked segment ends with ``Monitor.flush`` (the sender thread's work on the records it has
not sent yet, to ``MemorySender``: ``to_wire`` and the JSON encode): on the configuration's
total-time and CPU clocks, not in any step's time. Until session 8 it was left queued and ran in
the next segment, a baseline's or another configuration's (a 0.5 s flush interval against
~0.4-1.2 s segments), which raised the baseline and the control (total 1.04-1.06 at 0.25M-1M).
The flush runs the sender with training paused, so the total-time ratio counts the sender's
work serially; concurrently, on cores training leaves idle, it would cost less.

Excluded from every clock: the models' construction and an untimed warm-up (``--warmup``
steps per model, then, once the fused kernel's background compile has finished, the same
again, so no timed step pays the compile or competes with it); the bench waits for the compile
and prints its duration. The kernels-alone figures are taken after it, before the timed rounds.

Passes over gradient memory: ``read`` is one read of every gradient byte (``torch.sum`` over a
flat float32 copy the size of the gradients), measured in the same run; the hook's added time per
step and the per-layer reduction alone are printed divided by it (the physical floor is one pass).
The machine's load average is printed beside every size: on a shared machine only ratios from the
same interleaved run are comparable.

CUDA (``--device cuda``): the same sweep with the hook's own training-thread code (capture,
record build, scaler reads) run under ``torch.cuda.set_sync_debug_mode("error")``: a sync there
raises inside the hook, which counts it as an internal error; the bench prints that count (must be
0; after 3 the hook disables itself, and its timings are then of no hook). The whole step cannot
run under "error": ``GradScaler.step`` itself reads ``found_inf``. The mode is process-wide, so a
fused configuration is checked only once its kernel has compiled: the background compile
(inductor's first run benchmarks its kernels: syncs, off the training thread) would fail under it.
``every_eager`` is checked from its first step, which builds the eager plan's constants.

Usage: ``python bench/hook_sweep.py [--sizes 0.25M,1M,4M,10M] [--rounds 5] [--steps 20]
[--device cpu|cuda] [--batch 4] [--tokens 32]``, or ``python bench/hook_overhead.py --sweep``
with the same options.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import ampscope
from ampscope.transport import MemorySender

SHAPES: dict[str, tuple[int, int]] = {
    "0.25M": (64, 256),
    "1M": (128, 512),
    "4M": (256, 1024),
    "10M": (384, 1700),
}
D_IN, CLASSES = 32, 10
COMPILE_TIMEOUT_S = 900.0
FLUSH_TIMEOUT_S = 60.0


def make_model(d: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True)
    return nn.Sequential(
        nn.Linear(D_IN, d),
        nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
        nn.Linear(d, width), nn.GELU(),
        nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, CLASSES),
    )


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} cores)"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def strict_sync(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` under ``set_sync_debug_mode("error")``: a host sync inside raises."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        torch.cuda.set_sync_debug_mode("error")
        try:
            return fn(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    return wrapped


@dataclass
class Live:
    """A configuration's model, optimizer, scaler and monitor (None: no hook)."""

    model: nn.Module
    opt: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    mon: ampscope.Monitor | None


def make_live(shape: tuple[int, int], device: torch.device, layer_every: int | None,
              fused: bool | None) -> Live:
    model = make_model(*shape).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
    mon = None
    if layer_every is not None:
        mon = ampscope.watch(model, scaler, opt, sender=MemorySender(), layer_every=layer_every,
                             fused=fused)
    return Live(model, opt, scaler, mon)


def check_syncs(live: Live) -> None:
    """From now on, the hook's training-thread code of ``live`` runs under "error" (CUDA)."""
    mon = live.mon
    if mon is None or next(live.model.parameters()).device.type != "cuda":
        return
    for name in ("capture", "end", "on_scale"):  # the step seam's calls (``step.py``)
        setattr(mon._cycle, name, strict_sync(getattr(mon._cycle, name)))
    mon._view.before_update = strict_sync(mon._view.before_update)  # type: ignore[method-assign]


def run_segment(live: Live, x: torch.Tensor, y: torch.Tensor, steps: int,
                cpu: list[float] | None = None,
                flushes: list[float] | None = None) -> list[float]:
    """Per-step wall times of ``steps`` steps. Then, with a hook, its flush (``Monitor.flush``:
    the sender thread's work on this segment's records that had not run yet), timed into
    ``flushes`` when given: left queued, it would run during the next segment, another
    configuration's or the baseline's. The segment's process CPU time (all threads, the flush
    included) is appended to ``cpu`` when given."""
    model, opt, scaler = live.model, live.opt, live.scaler
    times: list[float] = []
    cpu_start = time.process_time()
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x).mean(1), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sync(x.device)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    if live.mon is not None and not live.mon.flush(FLUSH_TIMEOUT_S):
        raise RuntimeError(f"the hook's records were not sent within {FLUSH_TIMEOUT_S} s")
    if flushes is not None:
        flushes.append(time.perf_counter() - start)
    if cpu is not None:
        cpu.append(time.process_time() - cpu_start)
    return times


def timed_s(fn: Callable[[], Any], device: torch.device, reps: int = 30) -> tuple[float, float]:
    """(median, min) seconds of ``fn``: on a loaded machine the min is the uncontended cost."""
    for _ in range(3):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def p10(times: list[float]) -> float:
    return sorted(times)[len(times) // 10]


def grads_after_backward(live: Live, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """The model's gradients of one (scaled) backward, left in place."""
    live.opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(live.model(x).mean(1), y)
    live.scaler.scale(loss).backward()
    return [p.grad for p in live.model.parameters() if p.grad is not None]


CONFIGS: list[tuple[str, int | None, bool | None]] = [
    ("control", None, None),
    ("default", 10, None),
    ("every", 1, None),
    ("every_eager", 1, False),
]


def sweep_size(name: str, args: argparse.Namespace, device: torch.device) -> None:
    shape = SHAPES[name]
    torch.manual_seed(1)
    x = torch.randn(args.batch, args.tokens, D_IN, device=device)
    y = torch.randint(0, CLASSES, (args.batch,), device=device)
    load_before = load()
    baseline = make_live(shape, device, None, None)
    lives = {c: make_live(shape, device, every, fused) for c, every, fused in CONFIGS}
    check_syncs(lives["every_eager"])  # no compile thread: checked from its first step
    params = [p for p in baseline.model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    grad_bytes = sum(p.numel() * p.element_size() for p in params)

    # Untimed warm-up; the monitors' first per-layer step starts the fused compile.
    start = time.perf_counter()
    # every_eager first: its first steps (checked for syncs) run before any compile thread exists.
    for live in [lives["every_eager"], baseline, lives["control"], lives["default"],
                 lives["every"]]:
        run_segment(live, x, y, args.warmup)
    compiles: dict[str, list[tuple[Any, float | None, str | None]]] = {}
    for c, live in lives.items():
        if live.mon is not None:
            compiles[c] = live.mon._stats.compiles(COMPILE_TIMEOUT_S)
    check_syncs(lives["default"])  # compiled (or failed): checked from here on
    check_syncs(lives["every"])
    for live in [baseline, *lives.values()]:  # steady state again after the compile's load
        run_segment(live, x, y, args.warmup)
    warm_s = time.perf_counter() - start

    # One read of the gradient bytes, and the per-layer reduction alone, on real gradients.
    probe = lives["every"]
    grads = grads_after_backward(probe, x, y)
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    read_s, read_min = timed_s(lambda: flat.sum(), device)
    scale = probe.scaler._scale
    assert probe.mon is not None and scale is not None and lives["every_eager"].mon is not None
    # What the training thread runs at a capture (``capture.take``): the raw partials, the
    # partials with the sampled histogram, the every-step raw norms; the eager ones beside.
    stats, eager_stats = probe.mon._stats, lives["every_eager"].mon._stats
    fused_s, fused_min = timed_s(lambda: stats.partials(grads, scale, True), device)
    fused_path = stats.last_path
    hist_s, hist_min = timed_s(lambda: stats.partials(grads, scale, True, histogram=True), device)
    hist_path = stats.last_path
    eager_s, eager_min = timed_s(lambda: eager_stats.partials(grads, scale, True), device)
    eager_hist_s, eager_hist_min = timed_s(
        lambda: eager_stats.partials(grads, scale, True, histogram=True), device, reps=10)
    norms_s, norms_min = timed_s(lambda: stats.raw_norms(grads), device)
    probe.opt.zero_grad(set_to_none=True)

    names = [c for c, _, _ in CONFIGS]
    base_times: list[float] = []
    seg: dict[str, list[float]] = {c: [] for c in names}
    ratios: dict[str, list[float]] = {c: [] for c in names}
    total_cfg: dict[str, float] = dict.fromkeys(names, 0.0)
    total_base: dict[str, float] = dict.fromkeys(names, 0.0)
    cpu_cfg: dict[str, float] = dict.fromkeys(names, 0.0)
    cpu_base: dict[str, float] = dict.fromkeys(names, 0.0)
    flush_cfg: dict[str, float] = dict.fromkeys(names, 0.0)
    started = time.perf_counter()
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        cpu: list[float] = []  # process CPU seconds of each segment, in run order
        prev = run_segment(baseline, x, y, args.steps, cpu)
        base_times += prev
        for c in order:
            flushed: list[float] = []
            times = run_segment(lives[c], x, y, args.steps, cpu, flushed)
            nxt = run_segment(baseline, x, y, args.steps, cpu)
            base_times += nxt
            seg[c] += times
            ratios[c].append(statistics.median(times) / statistics.median(prev + nxt))
            total_cfg[c] += sum(times) + sum(flushed)
            flush_cfg[c] += sum(flushed)
            total_base[c] += (sum(prev) + sum(nxt)) / 2
            cpu_cfg[c] += cpu[-2]
            cpu_base[c] += (cpu[-3] + cpu[-1]) / 2
            prev = nxt
        print(f"  {name} round {r + 1}/{args.rounds}: " + ", ".join(
            f"{c} {ratios[c][-1]:.3f}" for c in names), file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    base = statistics.median(base_times)

    print(f"\n== {name}: d={shape[0]}, MLP width {shape[1]}; {len(params)} tensors, {numel:,} "
          f"parameters, {grad_bytes / 2**20:.1f} MiB of gradients; batch {args.batch} x "
          f"{args.tokens} tokens; {device.type}, fp32 forward, GradScaler on; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"   {load_before} before, {load()} after; {args.rounds} rounds x {args.steps} steps "
          f"per segment, {elapsed:.0f} s timed, {warm_s:.0f} s warm-up")
    for c, states in compiles.items():
        described = ", ".join(
            f"{state.value} in {secs:.1f} s" + (f" ({err})" if err else "")
            for state, secs, err in states) or "not compiled (eager)"
        print(f"   fused kernel ({c}): {described}")
    print(f"   one read of the gradients (median / min): {read_s * 1e3:.3f} / "
          f"{read_min * 1e3:.3f} ms ({grad_bytes / read_min / 1e9:.1f} GB/s at the min)")
    for label, med, low in (("per-layer " + str(fused_path), fused_s, fused_min),
                            ("+ histogram " + str(hist_path), hist_s, hist_min),
                            ("per-layer eager", eager_s, eager_min),
                            ("+ histogram eager", eager_hist_s, eager_hist_min),
                            ("every-step norms", norms_s, norms_min)):
        print(f"   {label + ' alone:':<28} {med * 1e3:8.3f} / {low * 1e3:8.3f} ms = "
              f"{med / read_s:6.1f} / {low / read_min:6.1f} reads (median / min)")
    print(f"   median step, no hook: {base * 1e3:.2f} ms")
    print("   ratios to the no-hook baseline: median of per-round median-step ratios (min-max), "
          "total wall time, 10th-percentile step, process CPU time (all threads)")
    print(f"   {'configuration':<14} {'median':>9} {'ratio (min-max)':>22} {'total':>7} "
          f"{'p10':>7} {'cpu':>7} {'added/step':>11} {'= reads':>8} {'flush/step':>11}")
    for c in names:
        med = statistics.median(seg[c])
        rs = ratios[c]
        total = total_cfg[c] / total_base[c]
        added = total_cfg[c] / len(seg[c]) - total_base[c] / len(seg[c])
        print(f"   {c:<14} {med * 1e3:7.2f}ms {statistics.median(rs):8.3f}x "
              f"({min(rs):.3f}-{max(rs):.3f}) {total:6.3f}x {p10(seg[c]) / p10(base_times):6.3f}x"
              f" {cpu_cfg[c] / cpu_base[c]:6.3f}x {added * 1e3:8.3f}ms {added / read_s:8.1f}"
              f" {flush_cfg[c] / len(seg[c]) * 1e3:8.3f}ms")
    for c, live in lives.items():
        if live.mon is not None:
            errors = live.mon.stats().internal_errors
            if errors or device.type == "cuda":
                print(f"   {c}: hook internal errors {errors}"
                      + (" (syncs under set_sync_debug_mode('error'))"
                         if device.type == "cuda" else ""))
            live.mon.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=",".join(SHAPES), help="comma-separated: "
                        + ", ".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per segment")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--batch", type=int, default=4, help="sequences per step")
    parser.add_argument("--tokens", type=int, default=32,
                        help="tokens per sequence (on a GPU, 4 x 32 is launch-bound: the step is "
                        "the host's kernel launches, so a larger batch shows a GPU-bound step)")


def run(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    print(f"hook size sweep; {load()}; command: {' '.join(sys.argv)}")
    for name in args.sizes.split(","):
        if name not in SHAPES:
            raise SystemExit(f"unknown size {name!r}; expected one of: {', '.join(SHAPES)}")
        sweep_size(name, args, device)
    print("\nbudgets (DESIGN.md §8, #12): default cadence <= 1.02x, per-layer every step <= 1.10x "
          "(CPU), <= 1.01x and 0 added syncs (GPU); the physical floor of the per-layer "
          "statistics is one read of the gradients")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
