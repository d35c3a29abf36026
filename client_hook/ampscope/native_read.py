"""The fused read of CPU gradients in C (``native_read.c``: "the C loop"), built by the system's C
compiler and called through ``ctypes``: no ``torch.compile``, so no minutes of compile on
training's cores (docs/hook-cost.md#the-c-loop).

``NativeKernel`` is ``fused.Kernel`` for one layout: the same ``(L, 8)`` partials table, then
with the histogram the ``(L, NUM_BINS)`` counts, counts, amax and amin equal to the bit and the
sum of squares summed in another order. ``NativeNorms`` is the every-step norms' layout
(``GradStats.raw_norms``). Both read on torch's own OpenMP threads where GCC links its runtime
(docs/hook-cost.md#the-c-loop-on-several-threads). ``library()`` builds the loop once per
machine into the user's cache (``cache_dir``), keyed by the source, the compiler's identity, its
flags and the CPU, and loads it once per process (``soon()``: without waiting). It raises
``Unavailable`` where there is no C compiler or the source does not build; the caller takes
inductor's kernel, torch's norms or the eager path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Literal

import torch

from ampscope.partials import NUM_COLUMNS

__all__ = ["FLAG_SETS", "OPENMP", "SOURCE", "THREAD_MIN_ELEMS", "NativeKernel", "NativeNorms",
           "Unavailable", "cache_dir", "dense", "flag_sets", "library", "soon", "threads"]

logger = logging.getLogger("ampscope")

SOURCE = Path(__file__).with_name("native_read.c")
# Each set tried in order until one builds. The last three flags let the compiler sum the squares
# in vector lanes (never ``-ffast-math``: in a shared library it can set flush-to-zero for the
# whole process). ``-march=native``: this CPU's vectors (the key holds the CPU). 512-bit vectors
# where the CPU has them, as torch's own CPU kernels take them there: GCC prefers 256 bits, and
# the loop ran 1.3x faster at 512 (docs/hook-cost.md#the-c-loop). A compiler that does not know
# a flag (``-mprefer-vector-width`` off x86) refuses the set, and the next one is tried.
_COMMON = ("-O3", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math")
FLAG_SETS: tuple[tuple[str, ...], ...] = (
    ("-march=native", "-mprefer-vector-width=512", *_COMMON), ("-march=native", *_COMMON),
    _COMMON)
OPENMP = "-fopenmp"
"""Added first to each set where the loop can run on torch's own OpenMP threads (``_openmp``)."""
BUILD_TIMEOUT_S = 120.0
THREAD_MIN_ELEMS = 1 << 15
"""Gradient elements per reading thread (torch's ``GRAIN_SIZE``): torch's OpenMP threads wait,
spinning, for its next parallel op, so a team starts in microseconds
(docs/hook-cost.md#the-c-loop-on-several-threads)."""
_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # native_read.c's DTYPE_*


class Unavailable(RuntimeError):
    """The C loop cannot be built or loaded here."""


def cache_dir() -> Path:
    """``$AMPSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ampscope``, else ``~/.cache/ampscope``."""
    if os.environ.get("AMPSCOPE_CACHE_DIR"):
        return Path(os.environ["AMPSCOPE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ampscope"


def _cpu() -> str:
    """What identifies this CPU's instruction set (``-march=native`` builds for it): its
    feature flags on Linux, else the platform's processor string."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _compiler() -> tuple[list[str], str]:
    """(the C compiler's command, its ``--version``): ``$CC`` (words, as make splits it:
    ``ccache gcc``), else ``cc``."""
    words = shlex.split(os.environ.get("CC") or "cc") or ["cc"]
    path = shutil.which(words[0])
    if path is None:
        raise Unavailable(f"no C compiler ({words[0]!r} is not on PATH)")
    command = [path, *words[1:]]
    return command, _run([*command, "--version"]).stdout


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    """``command``'s completed process; ``Unavailable`` where it cannot run or hangs."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unavailable(f"the C compiler did not run: {exc}") from exc


def _openmp(version: str) -> bool:
    """Whether the loop built with ``OPENMP`` runs on torch's own OpenMP threads: torch's runtime
    is GNU's, loaded as ``libgomp.so.1`` (Linux wheels), and the compiler is GCC, which links
    that name: the process keeps one runtime, whose threads wait for torch's next parallel op.
    Any other pair would load a second runtime with threads of its own competing with torch's
    (docs/hook-cost.md#the-c-loop-on-several-threads)."""
    if "Free Software Foundation" not in version:
        return False
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any(line.rstrip().endswith("/libgomp.so.1") for line in maps)
    except OSError:
        return False


def flag_sets(version: str) -> list[tuple[str, ...]]:
    """The flag sets tried in order for a compiler of this ``--version``: ``FLAG_SETS``, each
    first with ``OPENMP`` where ``_openmp``."""
    if _openmp(version):
        return [(*flags, OPENMP) for flags in FLAG_SETS] + list(FLAG_SETS)
    return list(FLAG_SETS)


def _build(directory: Path, source: bytes) -> Path:
    """The built library of ``source`` in ``directory`` (built now unless there already), for
    the first of ``flag_sets`` that builds."""
    compiler, version = _compiler()
    failures = []
    for flags in flag_sets(version):
        key = hashlib.sha256(b"\0".join(
            [source, version.encode(), " ".join(flags).encode(), _cpu().encode()])).hexdigest()
        target = directory / f"native_read-{key[:20]}.so"
        if target.exists():
            return target
        directory.mkdir(parents=True, exist_ok=True)
        # Built under a name of its own and renamed: two processes building at once each
        # replace the file whole, never load a half-written one.
        fd, partial = tempfile.mkstemp(prefix=".native_read-", suffix=".so", dir=directory)
        os.close(fd)
        try:
            done = _run([*compiler, *flags, "-shared", "-fPIC", "-o", partial, str(SOURCE)])
            if done.returncode == 0:
                os.replace(partial, target)
                return target
            failures.append(f"{' '.join(flags)}: {done.stderr.strip()[-300:]}")
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    raise Unavailable("native_read.c did not build: " + "; ".join(failures))


_LIBRARY: ctypes.CDLL | Unavailable | None = None  # the process's, or why there is none
_LIBRARY_LOCK = threading.Lock()
_BUILDER: threading.Thread | None = None
# The build runs at training's own priority, once per machine (then the cache): at the lowest,
# on a machine that training keeps busy, it waited long for its little CPU while the slower
# reads answered (docs/hook-cost.md#the-fused-kernels-compile).


def library(directory: Path | None = None) -> ctypes.CDLL:
    """The loaded C loop, built on first use into ``directory`` (default ``cache_dir()``; a
    temporary one where that is not writable). Once per process, its failure too (each layout
    asks): raises ``Unavailable``."""
    global _LIBRARY
    with _LIBRARY_LOCK:
        if directory is not None:
            return _load(directory)
        if _LIBRARY is None:
            try:
                _LIBRARY = _load(cache_dir())
            except Unavailable as exc:
                _LIBRARY = exc
        if isinstance(_LIBRARY, Unavailable):
            raise _LIBRARY
        return _LIBRARY


def soon() -> ctypes.CDLL | Literal[False] | None:
    """The loaded C loop; None while a background thread (started by the first call) builds it;
    False where it cannot be built. Never waits: for the every-step read."""
    global _BUILDER
    lib = _LIBRARY
    if isinstance(lib, ctypes.CDLL):
        return lib
    if lib is not None:
        return False
    if _BUILDER is None:
        with _LIBRARY_LOCK:
            if _BUILDER is None:
                _BUILDER = threading.Thread(target=_build_in_background, daemon=True,
                                            name="ampscope-build")
                _BUILDER.start()
    return None


def _build_in_background() -> None:
    try:
        library()
    except Unavailable as exc:
        logger.info("ampscope: no C loop (%s); the every-step norms stay torch's", exc)


def _load(where: Path) -> ctypes.CDLL:
    """The C loop built (or found) in ``where`` and loaded."""
    try:
        source = SOURCE.read_bytes()
    except OSError as exc:
        raise Unavailable(f"{SOURCE} cannot be read ({exc})") from exc
    try:
        try:
            path = _build(where, source)
        except OSError as exc:  # the compiler's own failures are ``Unavailable``
            logger.info("ampscope: %s is not writable (%s); building in a temporary "
                        "directory", where, exc)
            path = _build(Path(tempfile.mkdtemp(prefix="ampscope-")), source)
    except OSError as exc:
        raise Unavailable(f"no directory to build in ({exc})") from exc
    try:
        lib = ctypes.CDLL(str(path))  # a CDLL function releases the GIL while it runs
    except OSError as exc:  # e.g. a file cut short when a disk filled: the next build replaces it
        path.unlink(missing_ok=True)
        raise Unavailable(f"{path} did not load ({exc})") from exc
    lib.ampscope_rows.argtypes = [
        ctypes.c_int64, *[ctypes.c_void_p] * 5, ctypes.c_int32, ctypes.c_int32,
        *[ctypes.c_void_p] * 3, *[ctypes.c_int32] * 3, ctypes.c_void_p]
    lib.ampscope_norms.argtypes = [ctypes.c_int64, *[ctypes.c_void_p] * 3, ctypes.c_int32,
                                   ctypes.c_void_p]
    lib.ampscope_unscale_norms.argtypes = [ctypes.c_int64, *[ctypes.c_void_p] * 5,
                                           ctypes.c_int32, ctypes.c_void_p]
    for function in (lib.ampscope_rows, lib.ampscope_norms, lib.ampscope_unscale_norms):
        function.restype = ctypes.c_int
    return lib


def _check_dtypes(dtypes: Iterable[torch.dtype]) -> None:
    """``Unavailable`` unless the C loop reads every one of ``dtypes`` (``_DTYPES``)."""
    if any(dtype not in _DTYPES for dtype in dtypes):
        raise Unavailable("a gradient is not float32, float16 or bfloat16")


def threads(elements: int) -> int:
    """How many threads read ``elements`` gradient elements: torch's intra-op threads, which sit
    idle while the hook runs on the training thread, one per ``THREAD_MIN_ELEMS``."""
    return max(1, min(torch.get_num_threads(), elements // THREAD_MIN_ELEMS))


def dense(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether a tensor's elements fill exactly ``numel`` consecutive elements of memory, in
    some order (contiguous, channels-last, a transpose): what the C loop reads as flat."""
    expected = 1
    for step, size in sorted((st, sz) for sz, st in zip(shape, stride, strict=True) if sz != 1):
        if size == 0:
            return True
        if step != expected:
            return False
        expected *= size
    return True


# What ``map`` calls from C: no Python call per gradient.
DATA_PTR = torch.Tensor.data_ptr
NUMEL = torch.Tensor.numel
CONTIGUOUS = torch.Tensor.is_contiguous
DTYPE = attrgetter("dtype")
IS_CPU = attrgetter("is_cpu")


@dataclass(frozen=True)
class NativeNorms:
    """One layout of contiguous float32, float16 or bfloat16 CPU gradients as ``ampscope_norms``
    reads it: every gradient's L2 norm summed in float64 (NaN for a layer that holds a NaN, else
    +inf for one that holds an inf; no float32 overflow), on several threads for large layouts.
    ``GradStats.raw_norms`` checks the gradients against it and calls ``read``, inline: no Python
    call on the every-step path; or ``unscale`` (float32 only), which reads them in GradScaler's
    unscale (docs/hook-cost.md#the-norms-in-the-unscale)."""

    numels: array[int]
    dtypes: list[torch.dtype]
    codes: array[int]  # native_read.c's DTYPE_*
    threads: int
    read: Callable[..., int]  # ampscope_norms
    unscale: Callable[..., int] | None  # ampscope_unscale_norms; None unless all are float32

    @classmethod
    def of(cls, lib: ctypes.CDLL, grads: Sequence[torch.Tensor]) -> NativeNorms:
        """The layout of ``grads``; ``Unavailable`` where the C loop cannot read them."""
        if not all(map(IS_CPU, grads)) or not all(map(CONTIGUOUS, grads)):
            raise Unavailable("not every gradient is a contiguous CPU tensor")
        dtypes = list(map(DTYPE, grads))
        _check_dtypes(dtypes)
        numels = array("q", map(NUMEL, grads))
        float32 = all(dtype is torch.float32 for dtype in dtypes)
        return cls(numels, dtypes, array("b", [_DTYPES[dtype] for dtype in dtypes]),
                   threads(sum(numels)), lib.ampscope_norms,
                   lib.ampscope_unscale_norms if float32 else None)


class NativeKernel:
    """``fused.Kernel`` for one CPU layout: called with the present gradients, the unscaled
    layers' threshold bits, and ``scale_bits`` (read by the histogram only)."""

    def __init__(
        self, lib: ctypes.CDLL, scaled: Sequence[bool],
        specs: Sequence[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]],
        absent: Sequence[tuple[int, int]], under: int, normal: int, bins: int, min_exp: int,
    ) -> None:
        """``specs``: the present gradients' (shape, stride, dtype) in layer order; ``absent``:
        (layer, numel) of the ``None`` ones; ``bins``: 0 for no histogram."""
        missing = dict(absent)
        if any(not dense(shape, stride) for shape, stride, _ in specs):
            raise Unavailable("a gradient is not dense in memory")
        _check_dtypes(dtype for _, _, dtype in specs)
        self.layers = len(scaled)
        self.width = NUM_COLUMNS + bins
        present = iter(enumerate(specs))
        slots, numels, dtypes = array("q"), array("q"), array("b")
        for i in range(self.layers):
            if i in missing:
                slots.append(-1)
                numels.append(missing[i])
                dtypes.append(0)
                continue
            slot, (shape, _, dtype) = next(present)
            slots.append(slot)
            numels.append(torch.Size(shape).numel())
            dtypes.append(_DTYPES[dtype])
        self._count = len(specs)
        # Kept on the instance: the C loop reads these buffers on every call.
        self._arrays = (slots, numels, dtypes, array("b", [bool(s) for s in scaled]))
        self._addresses = [a.buffer_info()[0] for a in self._arrays]
        self._constants = (under, normal)
        self._bins, self._min_exp = bins, min_exp
        self._threads = threads(sum(numels))
        self._rows = lib.ampscope_rows

    def __call__(self, grads: list[torch.Tensor], under_bits: torch.Tensor,
                 normal_bits: torch.Tensor, hist: torch.Tensor) -> torch.Tensor:
        if len(grads) != self._count:
            raise ValueError(f"got {len(grads)} gradients for a layout of {self._count}")
        out = torch.empty((self.layers, self.width), dtype=torch.float64)
        pointers = array("q", map(DATA_PTR, grads))
        slots, numels, dtypes, scaled = self._addresses
        status = self._rows(self.layers, pointers.buffer_info()[0], slots, numels, dtypes,
                            scaled, *self._constants, under_bits.data_ptr(),
                            normal_bits.data_ptr(), hist.data_ptr(), self._min_exp,
                            self._bins, self._threads, out.data_ptr())
        if status != 0:
            raise ValueError(f"ampscope_rows refused its arguments ({status})")
        return out
