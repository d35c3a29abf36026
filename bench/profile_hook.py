"""Where the hook's time goes on the CPU reference loop of ``hook_overhead.py``.

Three views, all on the reference model's real gradients (after a fp16-autocast backward):

1. ``parts``: each piece of the hook timed alone, steady state (median of ``--reps`` calls): the
   per-layer reduction, the grad-norm-only path of the non-layer steps, the capture and update
   wrappers' own code, and the sender thread's ``to_wire`` + encode (which competes for the GIL and
   the 2 cores with training).
2. ``ops``: ``torch.profiler`` of the per-layer reduction and the grad-norm path, top ops by self
   CPU time.
3. ``cprofile``: cProfile of ``--steps`` training steps with the hook (``layer_every`` 1 and 10),
   ampscope functions and the torch calls they make, by total time per step.
4. ``sender``: the sender thread's CPU time (``time.thread_time``, which a loaded machine
   inflates far less than wall time) per record: ``to_wire`` and the encode of one record, for a
   plain step's record and a per-layer step's (eager capture, no histogram, no activations).
5. ``inloop``: the training thread's time in ampscope's own code inside the real loop, per
   wrapped scaler method: the wrapper's time minus the original's it calls (``unscale_`` runs
   inside ``step``; its own time is counted under ``unscale_`` only), once the fused kernel a
   per-layer read takes has compiled (its path is printed). Right after ``backward()``
   the code runs cold, ~3x its steady-state cost: these are the figures that add to a step,
   though the first code after backward pays some warm-up the scaler would otherwise pay. The
   C loop's pass that unscales and reads a plain step's norms in torch's place
   (docs/hook-cost.md#the-norms-in-the-unscale) runs inside ``unscale_``'s original, so it
   counts as torch's here; ``bench/unscale_norms.py`` times the step end to end.

6. ``kernels`` (CUDA): the kernels and copies the hook adds to a step, and their GPU time
   (``torch.profiler``).

Usage: ``python bench/profile_hook.py [--only parts,ops,cprofile,sender,inloop,launches,kernels]
[--size 4M] [--device cpu|cuda]``; with ``--size`` (a shape of ``hook_sweep.py``: 0.25M, 1M, 4M,
10M) the model and loop are the sweep's (FP32 forward, ``GradScaler`` on, batch 4 x 32 tokens)
instead of the fp16-autocast reference.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests' twins

import torch
from hook_overhead import make_model  # type: ignore[import-not-found]
from hook_sweep import SHAPES  # type: ignore[import-not-found]
from hook_sweep import make_model as sweep_model
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import ampscope
from ampscope.transport import MemorySender
from tests.client_hook.reference import scaled_flags


def med_us(fn: Callable[[], Any], reps: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


AUTOCAST = True  # False with --size: the sweep's FP32 forward
DEVICE = torch.device("cpu")  # --device


def setup(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer,
                                             torch.Tensor, torch.Tensor]:
    model = sweep_model(*SHAPES[args.size]) if args.size else make_model(args.d, args.blocks)
    model = model.to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1)
    return (model, opt, torch.randn(args.batch, args.seq, 32, device=DEVICE),
            torch.randint(0, 10, (args.batch,), device=DEVICE))


def step(model: nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
         x: torch.Tensor, y: torch.Tensor, finish: bool = True) -> None:
    opt.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE.type, dtype=torch.float16, enabled=AUTOCAST):
        out = model(x).float().mean(1)
    loss = nn.functional.cross_entropy(out, y)
    scaler.scale(loss).backward()
    if finish:
        scaler.step(opt)
        scaler.update()


def step_update(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer) -> None:
    scaler.step(opt)
    scaler.update()


def parts(args: argparse.Namespace) -> None:
    """Each piece timed alone. Reaches into the Monitor's private parts: keep in step with it."""
    model, opt, x, y = setup(args)
    scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**10)
    mon: Any = ampscope.watch(model, scaler, opt, sender=MemorySender(), layer_every=1,
                              activation_every=0, histogram_every=0)
    for _ in range(3):
        step(model, opt, scaler, x, y)
    base = med_us(lambda: step(model, opt, scaler, x, y), 30)
    step(model, opt, scaler, x, y, finish=False)  # grads present, stage READY
    params = mon._params
    grads = [p.grad for p in params]
    scale = scaler._scale
    assert scale is not None
    flags = [True] * len(grads)
    stats, cycle, view = mon._stats, mon._cycle, mon._view
    r = args.reps
    rows: list[tuple[str, float]] = [
        ("partials (per-layer capture: all 8 partials, raw)",
         med_us(lambda: stats.partials(grads, scale, flags), r)),
        ("partials + histogram (a sampled step's capture)",
         med_us(lambda: stats.partials(grads, scale, flags, histogram=True), max(10, r // 10))),
        ("raw_norms (every-step capture)", med_us(lambda: stats.raw_norms(grads), r)),
        ("scaled_flags (stage lookup)",
         med_us(lambda: scaled_flags(view, opt, mon._cycle.optimizers, params), r)),
        ("before_update (scale copy, found_inf)", med_us(view.before_update, r)),
    ]

    class EveryTenth:
        def __init__(self) -> None:
            self.distinct = [10]

        def due(self, step_no: int) -> bool:
            return step_no % 10 == 0

    cycle._cadence = EveryTenth()

    def capture(step_no: int) -> None:
        cycle.reset()
        cycle.capture(opt, mon._cycle.optimizers, step_no)

    rows.append(("capture, non-layer step", med_us(lambda: capture(1), r)))
    rows.append(("capture, layer step", med_us(lambda: capture(0), r)))
    before = view.before_update()
    transport = mon._transport
    assert transport is not None
    captured: list[Any] = []
    real_put = transport.put
    def collect(item: Any) -> int:
        captured.append(item)
        return 0

    transport.put = collect
    capture(1)
    def record() -> None:  # ``StepCycle.end``'s record and put, without starting the next cycle
        transport.put(cycle.build(before, seq=0, step=1, misuse=None, clip=cycle.clip,
                                  optimizers=cycle.optimizers))

    rows.append(("end, norms only (stack + record)", med_us(record, r)))
    rec_norms = captured[-1]
    capture(0)
    rows.append(("end, with the stats block", med_us(record, r)))
    rec_layers = captured[-1]
    transport.put = real_put
    rows.append(("sender thread: to_wire, norms-only record", med_us(rec_norms.to_wire, r)))
    rows.append(("sender thread: to_wire, record with layers", med_us(rec_layers.to_wire, r)))
    wl, ws = rec_layers.to_wire(), rec_norms.to_wire()
    rows.append(("sender thread: encode 1 record with layers",
                 med_us(lambda: mon._encode([wl], False, False), r)))
    rows.append(("sender thread: encode 1 norms-only record",
                 med_us(lambda: mon._encode([ws], False, False), r)))
    mon.close()
    scaler2 = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**10)
    for _ in range(3):
        step(model, opt, scaler2, x, y)
    step(model, opt, scaler2, x, y, finish=False)
    rows.append(("scaler.step + update, no hook (for scale)",
                 med_us(lambda: step_update(scaler2, opt), 30)))
    print(f"parts (median us per call; reference step with hook every step: {base / 1e3:.2f} ms; "
          f"{len(params)} tensors, {sum(p.numel() for p in params)} elements)")
    for name, us in rows:
        print(f"  {name:<54} {us:9.1f} us")


def ops(args: argparse.Namespace) -> None:
    model, opt, x, y = setup(args)
    scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**10)
    mon: Any = ampscope.watch(model, scaler, opt, sender=MemorySender(), layer_every=1)
    step(model, opt, scaler, x, y, finish=False)
    grads = [p.grad for p in mon._params]
    scale = scaler._scale
    assert scale is not None
    flags = [True] * len(grads)
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("partials", lambda: mon._stats.partials(grads, scale, flags)),
        ("raw_norms", lambda: mon._stats.raw_norms(grads)),
    ]
    for name, fn in calls:
        for _ in range(5):
            fn()
        n = 50
        prof: Any = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        with prof:
            for _ in range(n):
                fn()
        print(f"ops: {name}, share of self CPU time, top 14; {n} calls")
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events)
        for e in events[:14]:
            print(f"  {e.key:<34} {100 * e.self_cpu_time_total / total:5.1f} %  "
                  f"x{e.count / n:.0f}/call")
    mon.close()


def cprofile(args: argparse.Namespace) -> None:
    for layer_every in (0, 1, 10):
        model, opt, x, y = setup(args)
        scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**10)
        mon: Any = ampscope.watch(model, scaler, opt, sender=MemorySender(),
                                  layer_every=layer_every)
        for _ in range(5):
            step(model, opt, scaler, x, y)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.steps):
            step(model, opt, scaler, x, y)
        prof.disable()
        mon.close()
        buf = io.StringIO()
        st = pstats.Stats(prof, stream=buf)
        print(f"cprofile: layer_every={layer_every}, {args.steps} steps, ms per step "
              f"(training thread only; cumulative)")
        entries, calls = [], []
        for (filename, _, func), (_, _, _, ct, callers) in st.stats.items():  # type: ignore[attr-defined]
            if "ampscope" in filename:
                entries.append((ct, f"{filename.rsplit('/', 1)[-1]}:{func}"))
                continue
            # What the hook's own code calls outside it (torch, the stdlib): time from those calls.
            from_hook = sum(v[3] for k, v in callers.items() if "ampscope" in k[0])
            if from_hook:
                calls.append((from_hook, f"{filename.rsplit('/', 1)[-1]}:{func}"))
        for ct, name in sorted(entries, reverse=True)[:16]:
            print(f"  {name:<48} {ct / args.steps * 1e3:7.3f} ms")
        print("  called from the hook's code:")
        for ct, name in sorted(calls, reverse=True)[:12]:
            print(f"    {name[-60:]:<60} {ct / args.steps * 1e3:7.3f} ms")


def inloop(args: argparse.Namespace) -> None:
    x, y = setup(args)[2:]
    for layer_every in (0, 10, 1):
        model, opt, _, _ = setup(args)
        scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**10)
        mon: Any = ampscope.watch(model, scaler, opt, sender=MemorySender(),
                                  layer_every=layer_every, activation_every=0, histogram_every=0)
        outer: dict[str, int] = dict.fromkeys(("scale", "unscale_", "step", "update"), 0)
        inner = dict(outer)

        def timer(fn: Callable[..., Any], into: dict[str, int], name: str) -> Callable[..., Any]:
            def timed(*a: Any, **k: Any) -> Any:
                start = time.perf_counter_ns()
                try:
                    return fn(*a, **k)
                finally:
                    into[name] += time.perf_counter_ns() - start
            return timed

        for name in outer:
            wrapper = vars(scaler)[name]  # ``step._Wrapper``: its ``original`` is torch's
            wrapper.original = timer(wrapper.original, inner, name)
            setattr(scaler, name, timer(wrapper, outer, name))
        for _ in range(5):
            step(model, opt, scaler, x, y)
        # The fused kernel (a per-layer layout above FUSE_MIN_ELEMS) compiles in the
        # background: wait for it, so that the steps timed take the path a long run takes.
        ready = [s for _, s, _ in mon._stats.compiles(timeout=900) if s is not None]
        for _ in range(5):
            step(model, opt, scaler, x, y)
        rounds: list[dict[str, float]] = []
        for _ in range(max(1, args.steps // 20)):
            for d in (outer, inner):
                d.update(dict.fromkeys(d, 0))
            for _ in range(20):
                step(model, opt, scaler, x, y)
            rounds.append({n: (outer[n] - inner[n]) / 20 / 1e3 for n in outer})
        mon.close()
        cells = ", ".join(f"{n} {statistics.median(r[n] for r in rounds):.1f}" for n in outer)
        total = statistics.median(sum(r.values()) for r in rounds)
        print(f"inloop: layer_every={layer_every}, own us per step (median of "
              f"{len(rounds)} x 20 steps): {cells}; total {total:.1f}; fused kernels ready: "
              f"{len(ready)}, path of the last per-layer read: {mon._stats.last_path}")


def cpu_us(fn: Callable[[], Any], reps: int) -> float:
    """Median CPU time of this thread per call of ``fn``, in microseconds."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start = time.thread_time_ns()
        fn()
        times.append(time.thread_time_ns() - start)
    return statistics.median(times) / 1e3


def sender(args: argparse.Namespace) -> None:
    x, y = setup(args)[2:]
    for layer_every in (0, 1):
        model, opt, _, _ = setup(args)
        scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**10)
        mon: Any = ampscope.watch(model, scaler, opt, sender=MemorySender(),
                                  layer_every=layer_every, activation_every=0,
                                  histogram_every=0, fused=False)
        records: list[Any] = []
        mon._transport.put = records.append
        for _ in range(4):
            step(model, opt, scaler, x, y)
        record = records[-1]
        wire = record.to_wire()
        to_wire = cpu_us(record.to_wire, args.reps)
        encode = cpu_us(lambda: mon._encode([wire], False, False), args.reps)  # noqa: B023
        mon.close()
        print(f"sender: layer_every={layer_every}, sender-thread CPU us per record (median of "
              f"{args.reps}): to_wire {to_wire:.1f}, encode {encode:.1f}; "
              f"load {os.getloadavg()[0]:.2f}")


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.n = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        self.n += 1
        return func(*args, **(kwargs or {}))


def launches(args: argparse.Namespace) -> None:
    x, y = setup(args)[2:]

    def ops_per_step(layer_every: int | None) -> int:
        model, opt, _, _ = setup(args)
        scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**10)
        mon = None if layer_every is None else ampscope.watch(
            model, scaler, opt, sender=MemorySender(), layer_every=layer_every,
            activation_every=0, histogram_every=0, fused=False)
        counts: list[int] = []
        for _ in range(12):  # the last: steady state (plans and caches built)
            with _Count() as mode:
                step(model, opt, scaler, x, y)
            counts.append(mode.n)
        if mon is not None:
            mon.close()
        last: int = counts[-1]
        return last

    base = ops_per_step(None)
    for layer_every in (0, 1):
        print(f"launches: layer_every={layer_every}, ATen ops added per step on the training "
              f"thread: {ops_per_step(layer_every) - base} (a step without the hook: {base})")


def kernels(args: argparse.Namespace) -> None:
    """CUDA: the kernels (and copies) a step runs and their GPU time, without and with the hook
    at each cadence (``torch.profiler``, 20 steady-state steps each)."""
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if DEVICE.type != "cuda":
        print("kernels: CUDA only (--device cuda)")
        return
    x, y = setup(args)[2:]
    base: tuple[float, float] | None = None
    for layer_every in (None, 0, 10, 1):
        model, opt, _, _ = setup(args)
        scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**10)
        mon = None if layer_every is None else ampscope.watch(
            model, scaler, opt, sender=MemorySender(), layer_every=layer_every,
            activation_every=0, histogram_every=0)
        for _ in range(5):
            step(model, opt, scaler, x, y)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                step(model, opt, scaler, x, y)
            torch.cuda.synchronize()
        device_events = [e for e in prof.events()
                         if e.device_type == DeviceType.CUDA]
        n = len(device_events) / 20
        gpu_us = sum(e.time_range.elapsed_us() for e in device_events) / 20
        if mon is not None:
            mon.close()
        if base is None:
            base = (n, gpu_us)
            print(f"kernels: no hook, per step: {n:.1f} kernels and copies, {gpu_us:.1f} us GPU")
            continue
        print(f"kernels: layer_every={layer_every}, added per step: {n - base[0]:.1f} kernels "
              f"and copies, {gpu_us - base[1]:.1f} us GPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="parts,ops,cprofile,sender,inloop,launches")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--size", default=None, choices=list(SHAPES),
                        help="the sweep's model and FP32 loop (batch 4 x 32 tokens)")
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if args.size:
        global AUTOCAST
        AUTOCAST = False
        args.batch, args.seq = 4, 32
    for name in args.only.split(","):
        {"parts": parts, "ops": ops, "cprofile": cprofile, "sender": sender, "inloop": inloop,
         "launches": launches, "kernels": kernels}[name](args)


if __name__ == "__main__":
    main()
