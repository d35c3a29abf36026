"""The fused per-layer read alone (#29): ms per call of the compiled loop over a model's
gradients, one ``partials.tensor_partials`` against others in the same process.

On a per-layer step above ``FUSE_MIN_ELEMS`` the training thread runs one compiled kernel that
reads every gradient once for its partials (``fused.py``); what that loop does per element is
``partials.tensor_partials``. Here each implementation of it (``this``: the working tree's
``partials.py``; each ``--against``: a git revision's, or a file) is compiled as ``fused.py``
compiles it (inductor, ``fused.compile_options``' first choice: one thread and the C++
wrapper, static shapes) over the real gradients of one backward of ``hook_sweep.py``'s models
(34 tensors, raw: scaled by 2^16), and the calls are interleaved, one of each per round in a
rotating order. Inside the clock: the kernel call alone (its C++ wrapper, the loops, the
output); outside: the compile (printed apart) and everything else of a step.

Printed per size, beside the load average: the compile time, the median wall time per call
(10th-90th percentiles), the calling thread's median CPU time, the median of the per-round
ratios to ``this``, and whether the tables agree with ``this`` (counts, amax and amin to the
bit, the sum of squares to 1e-12).

``--against-simdlen N`` compiles the ``--against`` copies at an N-bit vector width instead
(``cpp.simdlen``; 0: inductor's own pick): ``--against HEAD --against-simdlen 0`` measures
``fused.cpu_vector_options`` alone.

Usage: ``PYTHONPATH=client_hook:bench python bench/fused_read.py [--sizes 1M,4M,10M]
[--against HEAD ...] [--against-simdlen N] [--rounds 60]``
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from types import ModuleType

import torch
from eager_read import (  # type: ignore[import-not-found]
    SCALE,
    Impl,
    agree,
    compare,
    comparison_parser,
    gradients,
    interleave,
    timing_cells,
)

from ampscope import fused, partials

SOURCE = "client_hook/ampscope/partials.py"
Read = Callable[[list[torch.Tensor]], torch.Tensor]


def _bits(x: float) -> int:
    return int(torch.tensor(x, dtype=torch.float32).view(torch.int32).item())


UNDER, NORMAL = _bits(2.0**-25 * SCALE), _bits(2.0**-14 * SCALE)
"""FP16's flush and normal bounds at the scale, as ``fused`` gives a scaled layer's."""


def compiled(module: ModuleType, simdlen: int | None = None) -> Read:
    """``module.tensor_partials`` over every gradient, compiled as ``fused`` compiles it; with
    ``simdlen``, at that vector width instead (0: inductor's own pick)."""
    def read(grads: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([module.tensor_partials(g, UNDER, NORMAL) for g in grads])
    read.__code__ = read.__code__.replace()  # dynamo's cache is per code object
    options = dict(fused.compile_options(torch.device("cpu"))[0])
    if simdlen is not None:
        options.pop("cpp.simdlen", None)
        if simdlen:
            options["cpp.simdlen"] = simdlen
    kernel: Read = torch.compile(read, dynamic=False, fullgraph=True, options=options)
    return kernel


def run_size(size: str, impls: list[Impl], rounds: int, against_simdlen: int | None) -> None:
    grads = gradients(size)
    numel = sum(g.numel() for g in grads)
    kernels, tables, compiles = [], [], []
    with torch.no_grad():
        for i, impl in enumerate(impls):
            start = time.perf_counter()
            kernel = compiled(impl.module, against_simdlen if i else None)
            tables.append(kernel(grads))
            compiles.append(time.perf_counter() - start)
            kernels.append(kernel)
        before = os.getloadavg()
        interleave(impls, [functools.partial(kernel, grads) for kernel in kernels], rounds)
        after = os.getloadavg()
    print(f"\n{size}: {len(grads)} tensors, {numel / 1e6:.2f} M elements; {rounds} rounds; "
          f"load {before[0]:.2f} {before[1]:.2f} → {after[0]:.2f} {after[1]:.2f} "
          f"({os.cpu_count()} cores)")
    print(f"  {'implementation':<28} {'compile s':>9} {'wall ms (p10-p90)':>24} "
          f"{'thread cpu ms':>14} {'ratio to this (min-max)':>26} {'agrees':>7}")
    for impl, table, seconds in zip(impls, tables, compiles, strict=True):
        spread, ratio = timing_cells(impl, 3)
        print(f"  {impl.label[-28:]:<28} {seconds:9.1f} {spread:>24} "
              f"{statistics.median(impl.cpu_ms):14.3f} {ratio:>26} "
              f"{agree(table, tables[0])!s:>7}")


def main() -> None:
    parser = comparison_parser(__doc__, SOURCE)
    parser.add_argument("--against-simdlen", type=int, default=None,
                        help="compile the --against copies at this vector width in bits "
                             "(0: inductor's own pick) instead of fused.compile_options'")
    args = parser.parse_args()
    compare("fused read", partials, SOURCE, args,
            functools.partial(run_size, against_simdlen=args.against_simdlen))


if __name__ == "__main__":
    main()
