"""The per-layer partials as a plain C loop, against the inductor kernel (#29): what a kernel
that needs no ``torch.compile`` would cost to build and to call on the CPU.

The fused read's inductor compile is what keeps a fresh process from meeting #29's budgets in
its first minutes (docs/hook-cost.md#a-c-loop-instead-of-inductor): one to four minutes of
Python holding the GIL on a compile thread, during which each per-layer read takes the eager
path. This bench measures the alternative without shipping it: ``LOOP``
below is ``partials.tensor_partials`` for contiguous float32 gradients written as one C loop,
built by the system's C compiler (``$CC``, else ``cc``) into a shared library in a temporary
directory and called through ``ctypes`` (which releases the GIL) with every gradient's pointer
and length in one call. ``this`` is the inductor kernel as ``bench/fused_read.py`` compiles it
(``fused.compile_options``).

Inside the clocks: the build (the C compiler's process; inductor's whole compile and first call,
cold only with an empty ``TORCHINDUCTOR_CACHE_DIR``), then per call the kernel call alone
(``ctypes``' argument arrays included). Outside: everything else of a step. The tables are
compared as ``fused_read`` compares them: counts, amax and amin to the bit, the float64 sum of
squares to 1e-12 relative (the C loop sums it in vector lanes, in another order, as inductor's
does: ``-fassociative-math``).

Usage: ``PYTHONPATH=client_hook:bench python bench/native_read.py [--sizes 0.25M,1M,4M,10M]
[--rounds 40] [--cflags "-O3 -mavx2 ..."]``
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import statistics
import subprocess
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
from fused_read import NORMAL, UNDER, compiled  # type: ignore[import-not-found]

from ampscope import partials

LOOP = r"""
#include <stdint.h>
#include <string.h>
#define INF_BITS 0x7F800000
#define MAX_FINITE_BITS 0x7F7FFFFF

/* Below 2^31 elements: int32 counts, as tensor_partials'. */
static void chunk(const int32_t *restrict x, int64_t n, int32_t under, int32_t normal,
                  int64_t *restrict counts, int32_t *restrict amax, int32_t *restrict key,
                  double *restrict sumsq) {
    int32_t zeros = 0, finite = 0, not_nan = 0, below_under = 0, below_normal = 0;
    int32_t top = 0, low = 0x7FFFFFFF;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        int32_t b = x[i] & 0x7FFFFFFF;  /* |raw| as bits */
        zeros += b < 1;
        finite += b < INF_BITS;
        not_nan += b < INF_BITS + 1;
        below_under += b < under;
        below_normal += b < normal;
        int32_t fb = b < INF_BITS ? b : 0;  /* finite magnitudes; non-finite: 0 */
        top = fb > top ? fb : top;
        int32_t k = (b - 1) & 0x7FFFFFFF;  /* zeros sort last */
        low = k < low ? k : low;
        float v;
        memcpy(&v, &fb, sizeof v);
        sum += (double)v * (double)v;
    }
    counts[0] += zeros; counts[1] += finite; counts[2] += not_nan;
    counts[3] += below_under; counts[4] += below_normal;
    if (top > *amax) *amax = top;
    if (low < *key) *key = low;
    *sumsq += sum;
}

/* The (8,) float64 row of partials.COLUMNS for one contiguous float32 tensor. */
static void row(const int32_t *x, int64_t n, int32_t under, int32_t normal, double *out) {
    int64_t counts[5] = {0};
    int32_t amax = 0, key = 0x7FFFFFFF;
    double sumsq = 0.0;
    const int64_t step = (int64_t)1 << 30;
    for (int64_t start = 0; start < n; start += step)
        chunk(x + start, n - start < step ? n - start : step, under, normal, counts, &amax,
              &key, &sumsq);
    int32_t amin = (key < MAX_FINITE_BITS ? key : MAX_FINITE_BITS) + 1;
    float top, low;
    memcpy(&top, &amax, sizeof top);
    memcpy(&low, &amin, sizeof low);
    out[0] = (double)counts[0];
    out[1] = (double)(n - counts[2]);
    out[2] = (double)(counts[2] - counts[1]);
    out[3] = (double)counts[3];
    out[4] = (double)counts[4];
    out[5] = sumsq;
    out[6] = top;
    out[7] = low;
}

void rows(const int32_t *const *grads, const int64_t *numels, int64_t count, int32_t under,
          int32_t normal, double *out) {
    for (int64_t i = 0; i < count; i++) row(grads[i], numels[i], under, normal, out + 8 * i);
}
"""

CFLAGS = "-O3 -mavx2 -mfma -fassociative-math -fno-signed-zeros -fno-trapping-math"


def build(cflags: str, where: Path) -> tuple[ctypes.CDLL, float]:
    """``LOOP`` built into a shared library in ``where``: (the library, the build's seconds)."""
    source, library = where / "rows.c", where / "rows.so"
    source.write_text(LOOP)
    start = time.perf_counter()
    subprocess.run([os.environ.get("CC", "cc"), *shlex.split(cflags), "-shared", "-fPIC",
                    "-o", str(library), str(source)], check=True)
    seconds = time.perf_counter() - start
    lib = ctypes.CDLL(str(library))
    lib.rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32,
                         ctypes.c_int32, ctypes.c_void_p]
    lib.rows.restype = None
    return lib, seconds


def native(lib: ctypes.CDLL, grads: list[torch.Tensor]) -> torch.Tensor:
    """The partials of contiguous float32 ``grads`` in one call of ``rows``."""
    out = torch.empty(len(grads), partials.NUM_COLUMNS, dtype=torch.float64)
    pointers = (ctypes.c_void_p * len(grads))(*[g.data_ptr() for g in grads])
    numels = (ctypes.c_int64 * len(grads))(*[g.numel() for g in grads])
    lib.rows(pointers, numels, len(grads), UNDER, NORMAL, out.data_ptr())
    return out


def run_size(size: str, lib: ctypes.CDLL, rounds: int) -> None:
    grads = gradients(size)
    assert all(g.dtype == torch.float32 and g.is_contiguous() for g in grads)
    impls = [Impl("this (inductor)", partials), Impl("C loop", partials)]
    with torch.no_grad():
        start = time.perf_counter()
        kernel = compiled(partials)
        want = kernel(grads)
        inductor_s = time.perf_counter() - start
        got = native(lib, grads)
        before = os.getloadavg()
        interleave(impls, [lambda: kernel(grads), lambda: native(lib, grads)], rounds)
        after = os.getloadavg()
    print(f"\n{size}: {len(grads)} tensors, {sum(g.numel() for g in grads) / 1e6:.2f} M "
          f"elements; {rounds} rounds; load {before[0]:.2f} → {after[0]:.2f} "
          f"({os.cpu_count()} cores); inductor's compile and first call {inductor_s:.1f} s")
    print(f"  {'implementation':<16} {'wall ms (p10-p90)':>24} {'thread cpu ms':>14} "
          f"{'ratio to this (min-max)':>26} {'agrees':>7}")
    for impl, table in zip(impls, [want, got], strict=True):
        spread, ratio = timing_cells(impl, 3)
        print(f"  {impl.label:<16} {spread:>24} {statistics.median(impl.cpu_ms):14.3f} "
              f"{ratio:>26} {agree(table, want)!s:>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", default="0.25M,1M,4M,10M")
    parser.add_argument("--rounds", type=int, default=40, help="interleaved calls of each")
    parser.add_argument("--cflags", default=CFLAGS, help="the C compiler's flags")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ampscope-native-") as where:
        lib, build_s = build(args.cflags, Path(where))
        print(f"C loop built in {build_s:.2f} s ({os.environ.get('CC', 'cc')} {args.cflags}); "
              f"torch {torch.__version__}")
        for size in args.sizes.split(","):
            run_size(size, lib, args.rounds)


if __name__ == "__main__":
    main()
