"""The eager per-layer read alone (#29): ms, page faults and aten ops per call, one
implementation of ``reductions.py`` against others in the same process.

The eager read is what the training thread pays on a per-layer step below ``FUSE_MIN_ELEMS`` and,
above it, until the fused kernel has compiled (minutes on a cold inductor cache). It is timed here
alone: ``GradStats(fused=False).partials`` on the real gradients of one backward of
``hook_sweep.py``'s models (34 tensors, raw: scaled by 2^16, as the capture reads them).

Each implementation is a copy of ``client_hook/ampscope/reductions.py``: ``this`` (the working
tree) and each ``--against`` (a git revision, read with ``git show REV:...``, or a file path),
loaded as modules of their own. The calls are interleaved, one of each per round in a rotating
order, and a round's ratio is an implementation's call time over ``this``'s in the same round:
on a shared machine only such paired, same-process ratios are worth comparing.

Printed per size, beside the load average: the median wall time per call (10th-90th
percentiles); the median CPU time of the calling thread (``time.thread_time``: all of the read
with ``--threads 1``); the median of the per-round ratios; the aten ops per call (views not
counted, as ``tests/client_hook/test_reductions.py`` counts them); the median minor page faults
per call (``getrusage``: first touches of fresh allocations, which a loaded machine does not
blur); and whether the tables agree with ``this`` (counts, amax and amin to the bit, the sum of
squares to 1e-12: implementations may add it in another order).

Usage: ``PYTHONPATH=client_hook:bench python bench/eager_read.py [--sizes 1M,4M,10M]
[--against HEAD ...] [--rounds 60] [--threads N]``
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests' counter

import torch
from hook_sweep import SHAPES  # type: ignore[import-not-found]
from hook_sweep import make_model as sweep_model

from ampscope import reductions
from ampscope.partials import SUMSQ
from tests.support.dispatch import AtenOps

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "client_hook/ampscope/reductions.py"
SCALE = 2.0**16


@dataclass
class Impl:
    label: str
    module: ModuleType
    stats: Any = None
    wall_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    faults: list[int] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)


def load_impl(source: str, index: int, relative: str = SOURCE) -> Impl:
    """``source``: a file path, or a git revision whose ``relative`` (``reductions.py``) is
    read."""
    path = Path(source)
    if not path.is_file():
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{source}:{relative}"],
                              check=True, capture_output=True, text=True).stdout
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
            handle.write(text)
        path = Path(handle.name)
    name = f"ampscope._{Path(relative).stem}_{index}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return Impl(source, module)


def gradients(size: str) -> list[torch.Tensor]:
    """The raw gradients of one backward of the sweep's ``size`` model (loss scaled by 2^16)."""
    model = sweep_model(*SHAPES[size])
    torch.manual_seed(1)
    x, y = torch.randn(4, 32, 32), torch.randint(0, 10, (4,))
    loss = torch.nn.functional.cross_entropy(model(x).mean(1), y)
    (loss * SCALE).backward()
    return [p.grad for p in model.parameters() if p.grad is not None]


def read(impl: Impl, grads: list[torch.Tensor], scale: torch.Tensor) -> torch.Tensor:
    table, _ = impl.stats.partials(grads, scale, True)
    assert impl.stats.last_path == "eager"
    out: torch.Tensor = table
    return out


def agree(got: torch.Tensor, want: torch.Tensor) -> bool:
    others = [c for c in range(want.shape[1]) if c != SUMSQ]
    exact = torch.equal(got[:, others], want[:, others])
    return exact and torch.allclose(got[:, SUMSQ], want[:, SUMSQ], rtol=1e-12, atol=0.0)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timing_cells(impl: Impl, digits: int) -> tuple[str, str]:
    """An implementation's printed wall time, "median (p10-p90)" in ms to ``digits``, and its
    ratio to ``this``, "median (min-max)" of the rounds."""
    wall = impl.wall_ms
    spread = (f"{statistics.median(wall):8.{digits}f} ({pct(wall, 0.1):.{digits}f}-"
              f"{pct(wall, 0.9):.{digits}f})")
    ratio = (f"{statistics.median(impl.ratios):.3f} ({min(impl.ratios):.2f}-"
             f"{max(impl.ratios):.2f})")
    return spread, ratio


def interleave(impls: list[Impl], calls: list[Callable[[], object]], rounds: int) -> None:
    """``rounds`` rounds of one call of each implementation, in a rotating order: each call's
    wall and thread CPU time and minor faults, and its wall time over the first's in the same
    round, appended to its ``Impl``."""
    for impl in impls:
        impl.wall_ms, impl.cpu_ms, impl.ratios, impl.faults = [], [], [], []
    for r in range(rounds):
        times: dict[str, float] = {}
        for k in range(len(impls)):
            impl, call = impls[(r + k) % len(impls)], calls[(r + k) % len(impls)]
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            cpu = time.thread_time_ns()
            wall = time.perf_counter_ns()
            call()
            wall = time.perf_counter_ns() - wall
            cpu = time.thread_time_ns() - cpu
            impl.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
            impl.wall_ms.append(wall / 1e6)
            impl.cpu_ms.append(cpu / 1e6)
            times[impl.label] = wall
        for impl in impls:
            impl.ratios.append(times[impl.label] / times[impls[0].label])


def run_size(size: str, impls: list[Impl], rounds: int) -> None:
    grads = gradients(size)
    scale = torch.tensor(SCALE)
    numel = sum(g.numel() for g in grads)
    tables = []
    for impl in impls:
        impl.stats = impl.module.GradStats("fp16", fused=False)
        for _ in range(3):  # the plan and its buffers, then warm
            read(impl, grads, scale)
        tables.append(read(impl, grads, scale))
    ops = []
    for impl in impls:
        with AtenOps() as mode:
            read(impl, grads, scale)
        ops.append(collections.Counter(mode.ops))
    before = os.getloadavg()
    interleave(impls, [functools.partial(read, impl, grads, scale) for impl in impls], rounds)
    after = os.getloadavg()
    print(f"\n{size}: {len(grads)} tensors, {numel / 1e6:.2f} M elements; {rounds} rounds; "
          f"load {before[0]:.2f} {before[1]:.2f} → {after[0]:.2f} {after[1]:.2f} "
          f"({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)")
    print(f"  {'implementation':<28} {'wall ms (p10-p90)':>24} {'thread cpu ms':>14} "
          f"{'ratio to this (min-max)':>26} {'ops':>4} {'faults':>7} {'agrees':>7}")
    for impl, table, counted in zip(impls, tables, ops, strict=True):
        spread, ratio = timing_cells(impl, 2)
        print(f"  {impl.label[-28:]:<28} {spread:>24} {statistics.median(impl.cpu_ms):14.2f} "
              f"{ratio:>26} {sum(counted.values()):4d} {statistics.median(impl.faults):7.0f} "
              f"{agree(table, tables[0])!s:>7}")
    for impl, counted in zip(impls, ops, strict=True):
        listed = ", ".join(f"{n} {c}" if c > 1 else n for n, c in sorted(counted.items()))
        print(f"  ops of {impl.label[-28:]}: {listed}")


def comparison_parser(doc: str | None, source: str) -> argparse.ArgumentParser:
    """The arguments of a bench comparing copies of ``source``: sizes, revisions, rounds."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    parser.add_argument("--sizes", default="1M,4M,10M",
                        help=f"comma-separated, of: {', '.join(SHAPES)}")
    parser.add_argument("--against", action="append", default=None,
                        help=f"a git revision or a {Path(source).name} path to compare "
                             "(repeatable; default HEAD)")
    parser.add_argument("--rounds", type=int, default=60, help="interleaved calls of each")
    return parser


def compare(label: str, this: ModuleType, source: str, args: argparse.Namespace,
            run: Callable[[str, list[Impl], int], None]) -> None:
    """``this`` (the working tree's module) against each ``--against`` copy of ``source``,
    ``run`` size by size, under a header naming the tree, torch and the command."""
    impls = [Impl("this", this)]
    impls += [load_impl(src, i, source) for i, src in enumerate(args.against or ["HEAD"])]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    print(f"{label}, this = the working tree (HEAD {head}); torch {torch.__version__}; "
          f"command: {' '.join(sys.argv)}")
    for size in args.sizes.split(","):
        if size not in SHAPES:
            raise SystemExit(f"unknown size {size!r}; expected one of: {', '.join(SHAPES)}")
        run(size, impls, args.rounds)


def main() -> None:
    parser = comparison_parser(__doc__, SOURCE)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    compare("eager read", reductions, SOURCE, args, run_size)


if __name__ == "__main__":
    main()
