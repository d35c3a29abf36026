"""The hook's cost in a fresh process on a cold inductor cache, the compile period included (#29).

``hook_sweep.py`` waits for the fused kernel's compile before it times anything; a user's run
does not. Here ONE fresh process, with ``TORCHINDUCTOR_CACHE_DIR`` and ``AMPSCOPE_CACHE_DIR``
set to a new temporary directory before torch is imported (so every compile is cold, and the C
loop of ``native_read`` is built by the C compiler again), trains two copies of
``hook_sweep``'s 4M model (``SHAPES["4M"]``: ``Linear(32, 256)``, a 2-layer TransformerEncoder,
a 4-layer MLP 1024 wide; FP32 forward, ``GradScaler`` on, AdamW, batch 4 x 32 tokens), one
hooked (``--config default``: per-layer stats every 10th step; ``every``: every step; both
``fused=None``, auto) and one without a hook, in alternating segments of ``--segment`` steps
(hooked first, then no-hook, and so on) until ``--minutes`` of wall time have passed since the
script started. No warm-up: the first steps (the allocator's, the monitor's first per-layer
read and plan, the first fused compile's start) are the run's own.

Printed: for every minute and for the first 1, 2, ... N minutes together, the **median step
ratio** (the median of the hooked segments' step times over the median of the no-hook ones')
and the **total-time ratio** (the hooked segments' summed time over the no-hook segments');
``base`` (the no-hook median step against the last minute's), which shows what the process as
a whole lost meanwhile; when the fused read engaged (the first hooked segment after which
``GradStats.last_path == "fused"``) and when the every-step norms took the C loop (the first
hooked segment after which ``GradStats`` holds a ``NativeNorms``; ``default`` only: ``every``
reads no norms apart), each fused layout's build (wall, and the build thread's CPU time); the
load average at start and end (``os.getloadavg``) and the process's CPU time
(``time.process_time``: every thread, the build threads' included; not the compiler's
processes).

The clocks. A step's time (``time.perf_counter``) is ``zero_grad``, forward, loss, backward,
``scaler.step`` and ``scaler.update``, with the hook's training-thread work inside them. A
segment's time is its steps plus, for the hooked one, ``Monitor.flush`` (the sender thread's
work on the segment's records, to a ``MemorySender``; ``hook_sweep.run_segment``): the hook's
total. Outside every clock: the models' construction, the gaps between segments (this script's
bookkeeping, a few µs). The builds run on their own threads **concurrently with both copies'
segments**: their CPU slows the no-hook segments as much as the hooked ones, so the ratios do
not show it; ``base`` does. What the ratios show meanwhile is the hook's own path (the exact
eager read, torch's norms).

Usage: ``python bench/cold_start.py [--minutes 5] [--config default|every] [--segment 5]``;
run from the repository with ``client_hook`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import time

START = time.monotonic()  # the script's start: before torch's import

import argparse  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

CONFIGS = {"default": 10, "every": 1}


@dataclass
class Segment:
    start: float  # seconds since START
    hooked: bool
    steps: list[float]
    total: float  # the steps and, hooked, the flush


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} cores)"


def ratios(segments: list[Segment]) -> tuple[float, float, float] | None:
    """(median step ratio, total-time ratio, no-hook median step in s), or None."""
    hooked = [s for s in segments if s.hooked]
    base = [s for s in segments if not s.hooked]
    if not hooked or not base:
        return None
    base_median = statistics.median(t for s in base for t in s.steps)
    median = statistics.median(t for s in hooked for t in s.steps) / base_median
    per_step = (sum(s.total for s in hooked) / sum(len(s.steps) for s in hooked)) / (
        sum(s.total for s in base) / sum(len(s.steps) for s in base))
    return median, per_step, base_median


def report(segments: list[Segment], minutes: int) -> None:
    last = ratios([s for s in segments if minutes - 1 <= s.start / 60 < minutes])
    steady = last[2] if last is not None else None
    print(f"{'minutes':>9} {'median':>7} {'total':>7} {'steps':>6} {'base ms':>8} {'base':>6}")
    for lo in (True, False):  # per minute, then cumulative
        for m in range(1, minutes + 1):
            part = [s for s in segments if (m - 1 if lo else 0) <= s.start / 60 < m]
            got = ratios(part)
            if got is None:
                continue
            median, total, base = got
            span = f"{m - 1}-{m}" if lo else f"0-{m}"
            inflation = f"{base / steady:6.3f}" if steady else "     -"
            steps = sum(len(s.steps) for s in part if s.hooked)
            print(f"{span:>9} {median:7.3f} {total:7.3f} {steps:6d} {base * 1e3:8.2f} "
                  f"{inflation} {'(per minute)' if lo else '(cumulative)'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=5, help="wall time from the start")
    parser.add_argument("--config", choices=tuple(CONFIGS), default="default")
    parser.add_argument("--segment", type=int, default=5, help="steps per segment")
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="ampscope-cold-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # before torch's import: a cold cache
    os.environ["AMPSCOPE_CACHE_DIR"] = cache  # and the C loop (``native_read``) built anew
    start_load = load()
    run(args, cache, start_load)


def run(args: argparse.Namespace, cache: str, start_load: str) -> None:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from hook_sweep import (  # type: ignore[import-not-found]
        CLASSES,
        D_IN,
        SHAPES,
        make_live,
        run_segment,
    )

    from ampscope.native_read import NativeNorms

    cpu = torch.device("cpu")
    hooked: Any = make_live(SHAPES["4M"], cpu, CONFIGS[args.config], None)
    base: Any = make_live(SHAPES["4M"], cpu, None, None)
    torch.manual_seed(1)
    x = torch.randn(4, 32, D_IN)
    y = torch.randint(0, CLASSES, (4,))
    print(f"cold_start: 4M, config {args.config} (layer_every {CONFIGS[args.config]}), "
          f"segments of {args.segment} steps, {args.minutes} min; cache {cache}; torch "
          f"{torch.__version__}; {torch.get_num_threads()} threads; start {start_load}")
    segments: list[Segment] = []
    engaged: tuple[float, int] | None = None
    norms: tuple[float, int] | None = None
    hooked_steps = 0
    end = args.minutes * 60.0
    while time.monotonic() - START < end:
        for live, is_hooked in ((hooked, True), (base, False)):
            at = time.monotonic() - START
            t0 = time.perf_counter()
            steps = run_segment(live, x, y, args.segment)
            segments.append(Segment(at, is_hooked, steps, time.perf_counter() - t0))
            if is_hooked:
                hooked_steps += len(steps)
                if engaged is None and live.mon._stats.last_path == "fused":
                    engaged = (time.monotonic() - START, hooked_steps)
                if norms is None and isinstance(live.mon._stats.native, NativeNorms):
                    norms = (time.monotonic() - START, hooked_steps)
    wall = time.monotonic() - START
    report(segments, args.minutes)
    for what, when in (("fused read", engaged), ("every-step norms in the C loop", norms)):
        print(f"{what}: never" if when is None else
              f"{what}: from hooked step {when[1]}, {when[0]:.1f} s after the start")
    for entry in hooked.mon._stats._fused._seen.values() if hooked.mon._stats._fused else ():
        cpu_s = f"{entry.compile_cpu_s:.1f}" if entry.compile_cpu_s is not None else "-"
        took = f"{entry.compile_s:.1f} s" if entry.compile_s is not None else "unfinished"
        print(f"build: {entry.state.value} ({entry.backend}), {took}; its thread's CPU {cpu_s} s"
              f"{'; ' + entry.error if entry.error else ''}")
    print(f"end {load()}; wall {wall:.1f} s, process CPU {time.process_time():.1f} s "
          f"(the compiler's processes not counted)")


if __name__ == "__main__":
    main()
