"""The fused read's two CPU kernels, as ``fused`` builds them: the C loop (``native_read``, the
default; on one thread and on the threads it takes, torch's OpenMP team) against inductor's
(``fused.build_kernel``, taken where no C compiler builds the loop), with and without the
exponent histogram.

Inside the clocks: each kernel's build (the C compiler's process, into an empty directory;
inductor's whole compile and first call, cold only with an empty ``TORCHINDUCTOR_CACHE_DIR``),
then per call the kernel call alone, as ``FusedPartials`` makes it (the C loop: its output
tensor and its pointer array; inductor: its C++ wrapper), interleaved in one process. Outside:
the layout key, the thresholds and everything else of a step. The tables are compared as
``fused_read`` compares them: counts, amax, amin and the histogram to the bit, the float64 sum of
squares to 1e-12 relative (both sum it in vector lanes, in other orders).

Usage: ``PYTHONPATH=client_hook:bench python bench/native_read.py [--sizes 0.25M,1M,4M,10M]
[--rounds 40] [--histogram]``
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from eager_read import (  # type: ignore[import-not-found]
    Impl,
    agree,
    gradients,
    interleave,
    timing_cells,
)

from ampscope import fused, native_read, partials
from ampscope.formats import FORMATS
from ampscope.histogram import MIN_EXP, NUM_BINS
from ampscope.partials import format_bits

FP16 = FORMATS["fp16"]
UNDER, NORMAL = format_bits(FP16)


def run_size(size: str, lib: ctypes.CDLL, lib_s: float, rounds: int, histogram: bool) -> None:
    grads = gradients(size)
    flags = [True] * len(grads)
    key = fused.layout_key(grads, flags, FP16, histogram)
    assert key is not None
    bits = torch.tensor([UNDER, NORMAL], dtype=torch.int32)
    hist = torch.tensor([1, 0], dtype=torch.int32)  # scale 1: es = 1, mb = 0
    threads = native_read.threads(sum(g.numel() for g in grads))
    impls = [Impl("inductor", partials), Impl("C loop, 1 thread", partials),
             Impl(f"C loop, {threads} threads", partials)]
    with torch.no_grad():
        start = time.perf_counter()
        inductor = fused.build_kernel(key, UNDER, NORMAL, fused.compile_options(key.device))
        want = inductor(grads, bits[0], bits[1], hist)
        inductor_s = time.perf_counter() - start
        loops = []
        for n in (1, threads):
            loop = native_read.NativeKernel(lib, key.scaled, key.specs, key.absent,
                                            UNDER, NORMAL, NUM_BINS if histogram else 0, MIN_EXP)
            loop._threads = n
            loops.append(loop)
        tables = [want, *(loop(grads, bits[0], bits[1], hist) for loop in loops)]
        before = os.getloadavg()
        interleave(impls, [lambda: inductor(grads, bits[0], bits[1], hist),
                           lambda: loops[0](grads, bits[0], bits[1], hist),
                           lambda: loops[1](grads, bits[0], bits[1], hist)], rounds)
        after = os.getloadavg()
    print(f"\n{size}{' with the histogram' if histogram else ''}: {len(grads)} tensors, "
          f"{sum(g.numel() for g in grads) / 1e6:.2f} M elements; {rounds} rounds; load "
          f"{before[0]:.2f} → {after[0]:.2f} ({os.cpu_count()} cores); inductor's compile and "
          f"first call {inductor_s:.1f} s, the C loop's build {lib_s:.2f} s")
    print(f"  {'kernel':<16} {'wall ms (p10-p90)':>24} {'thread cpu ms':>14} "
          f"{'ratio to inductor (min-max)':>28} {'agrees':>7}")
    for impl, table in zip(impls, tables, strict=True):
        spread, ratio = timing_cells(impl, 3)
        print(f"  {impl.label:<16} {spread:>24} {statistics.median(impl.cpu_ms):14.3f} "
              f"{ratio:>28} {agree(table, want)!s:>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", default="0.25M,1M,4M,10M")
    parser.add_argument("--rounds", type=int, default=40, help="interleaved calls of each")
    parser.add_argument("--histogram", action="store_true",
                        help="the kernels that also count the exponent histogram")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ampscope-native-") as where:
        start = time.perf_counter()
        lib = native_read.library(Path(where))
        lib_s = time.perf_counter() - start
        first = native_read.flag_sets(native_read._compiler()[1])[0]
        print(f"C loop: {Path(lib._name).name} ({os.environ.get('CC', 'cc')} "
              f"{' '.join(first)}, the first set tried); torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads")
        for size in args.sizes.split(","):
            run_size(size, lib, lib_s, args.rounds, args.histogram)


if __name__ == "__main__":
    main()
