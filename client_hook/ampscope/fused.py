"""The fused per-layer reduction: one kernel that reads every gradient once.

On the CPU the kernel is a C loop (``native_read``: built by the system's C compiler in a
fraction of a second, docs/hook-cost.md#the-c-loop); on CUDA, or where no C compiler builds it,
``torch.compile`` turns ``partials.tensor_partials`` over a model's gradients into one loop per
gradient computing all eight partials in one read from ``.grad`` (cost:
docs/hook-cost.md#when-the-fused-kernel-is-taken). Kernels are specialised on a *layout* (device;
per gradient shape, strides, dtype, scaled flag) and kept process-wide (``MAX_LAYOUTS``).
``FusedPartials.__call__`` returns None, and the caller takes the exact eager path, while the
layout is unsupported, still building (in the background: training never waits;
docs/hook-cost.md#the-fused-kernels-compile) or failed. Compiled calls run under
``set_stance("fail_on_recompile")``: a guard miss falls back to eager instead of compiling on the
training thread. No host sync: thresholds are device tensors, the output stays on the device.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ampscope import native_read
from ampscope.devices import device_tensor
from ampscope.formats import TargetFormat
from ampscope.histogram import MIN_EXP, NUM_BINS, scale_bits, tensor_histogram
from ampscope.partials import NUM_COLUMNS, format_bits, tensor_partials, threshold_bits
from ampscope.transport import lower_thread_priority

__all__ = ["HISTOGRAM_MAX_ELEMS", "MAX_LAYOUTS", "FusedPartials", "LayoutState", "build_kernel",
           "compile_options", "cpu_vector_options", "layout_key"]

logger = logging.getLogger("ampscope")

MAX_LAYOUTS = 16
"""Compiled layouts kept per process; past it the oldest is forgotten (a run has one or two)."""

_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)

HISTOGRAM_MAX_ELEMS = 2**31
"""Layers from this size get no fused histogram (inductor materialises the scatter's int64 bin
index there); the histogram takes the eager path's bounded groups."""

Kernel = Callable[[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Spec = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]  # shape, stride, dtype
Options = dict[str, str | int | bool | Callable[..., Any]]  # inductor's ``options``


@dataclass(frozen=True)
class LayoutKey:
    """What one compiled kernel is specialised on."""

    device: torch.device
    scaled: tuple[bool, ...]
    fmt: str
    specs: tuple[Spec, ...]  # the present gradients', in layer order
    histogram: bool = False  # the kernel also counts the exponent histogram (same read)
    # Layers whose gradient is None: (index, numel). PyTorch's meaning, all zeros: their rows
    # are constants of the kernel, which is called with the present gradients only.
    absent: tuple[tuple[int, int], ...] = ()
    native: bool = False  # the C loop takes it where it builds (a CPU layout, ``NATIVE``)


class LayoutState(enum.Enum):
    COMPILING = "compiling"
    READY = "ready"
    FAILED = "failed"


@dataclass
class _Layout:
    state: LayoutState = LayoutState.COMPILING
    kernel: Kernel | None = None
    backend: str | None = None  # "native" (the C loop) or "inductor", once READY
    compile_s: float | None = None  # wall time from the compile's start to READY or FAILED
    compile_cpu_s: float | None = None  # the compile thread's CPU time: ~ its hold of the GIL
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


_REGISTRY: dict[LayoutKey, _Layout] = {}
_LOCK = threading.Lock()
_LOGGED_FAILURE = False
_LOGGED_NATIVE = False

EXIT_WAIT_S = 120.0
"""How long the interpreter's exit waits for a compile still running (``_finish_compiles``)."""
COMPILE_NICENESS = 19
"""The compile thread's nice increment (Linux; its compilers inherit it): idle CPU only."""

NATIVE = True
"""Whether CPU layouts take the C loop (``native_read``) where it builds, before inductor. Read
when a ``FusedPartials`` is made: its layouts keep their choice."""

_RUNNING: set[threading.Thread] = set()
_EXITING = threading.Event()


def _at_exit() -> None:
    """At interpreter exit: wait for the compile threads."""
    _EXITING.set()
    _finish_compiles()


def _finish_compiles(timeout: float = EXIT_WAIT_S) -> bool:
    """At exit, wait up to ``timeout`` s for running compile threads; True when none is left.
    Why: a daemon thread inside inductor's C++ at finalization aborts the process (status 134)."""
    with _LOCK:
        running = [t for t in _RUNNING if t.is_alive()]
    if running:
        logger.info("ampscope: waiting for the fused read's compile to finish before exit")
    deadline = time.monotonic() + timeout
    for thread in running:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in running)


atexit.register(_at_exit)


def _make_kernel(
    flags: tuple[bool, ...], under: int, normal: int, histogram: bool,
    absent: tuple[tuple[int, int], ...] = (),
) -> Kernel:
    """The function ``torch.compile`` traces for one layout (its constants in the closure)."""
    missing = dict(absent)

    def layer_partials(
        grads: list[torch.Tensor], under_bits: torch.Tensor, normal_bits: torch.Tensor,
        hist_bits: torch.Tensor,
    ) -> torch.Tensor:
        rows, counts = [], []
        present = iter(grads)
        device = grads[0].device
        for i, scaled in enumerate(flags):
            if i in missing:  # ``partials.absent`` and ``exponent_histogram``'s row of zeros
                n = float(missing[i])
                rows.append(torch.tensor([n, 0.0, 0.0, n, n, 0.0, 0.0, math.inf],
                                         dtype=torch.float64, device=device))
                if histogram:
                    counts.append(torch.tensor([n] + [0.0] * (NUM_BINS - 1),
                                               dtype=torch.float64, device=device))
                continue
            g = next(present)
            if g.numel() == 0:
                rows.append(torch.tensor([0.0] * (NUM_COLUMNS - 1) + [math.inf],
                                         dtype=torch.float64, device=g.device))
                if histogram:
                    counts.append(torch.zeros(NUM_BINS, dtype=torch.int32, device=g.device))
                continue
            if scaled:  # judged as stored; true units are raw / scale
                rows.append(tensor_partials(g, under, normal))
                if histogram:
                    counts.append(tensor_histogram(g, hist_bits[0], hist_bits[1]))
            else:  # judged at the scale (the thresholds of m = scale); true units as stored
                rows.append(tensor_partials(g, under_bits, normal_bits))
                if histogram:
                    counts.append(tensor_histogram(g, 1, 0))
        out = torch.stack(rows)
        if not histogram:
            return out
        return torch.cat([out, torch.stack([c.to(torch.float64) for c in counts])], dim=1)

    # A code object of its own: dynamo's cache (and its limit of 8 entries) is per code object,
    # and one layout's entry must never evict another's or count against a user's functions.
    layer_partials.__code__ = layer_partials.__code__.replace()
    return layer_partials


def _placeholders(key: LayoutKey) -> list[torch.Tensor]:
    return [torch.empty_strided(shape, stride, dtype=dtype, device=key.device).zero_()
            for shape, stride, dtype in key.specs]


def compile_options(device: torch.device) -> list[Options]:
    """The inductor options to try on ``device``, in order; the first that compiles is kept. CPU:
    one thread (an OpenMP team is a barrier per gradient, stalled by any descheduled thread),
    256-bit vectors where inductor would take 512 (``cpu_vector_options``) and a C++ wrapper
    (the Python one calls Python per output buffer), else the Python wrapper
    (docs/hook-cost.md#the-fused-kernels-compile)."""
    if device.type != "cpu":
        return [{}]
    cpu: Options = {"cpp.threads": 1, **cpu_vector_options()}
    return [{**cpu, "cpp_wrapper": True}, cpu]


AVX2_BITS = 256


def cpu_vector_options() -> Options:
    """``cpp.simdlen`` 256 where inductor would vectorise the loop at 512 bits (AVX-512) and
    256-bit AVX2 is there too, else nothing. Inductor's AVX-512 code of this loop moves each
    bit cast through memory one lane at a time and ran it 3-4x slower than its AVX2 code on the
    same CPU (docs/hook-cost.md#avx-512-against-avx2); narrower or other ISAs are left as
    inductor picks them (a 256-bit request where there is none would be scalar code)."""
    from torch._inductor import cpu_vec_isa

    if cpu_vec_isa.pick_vec_isa().bit_width() <= AVX2_BITS:
        return {}
    if not any(isa.bit_width() == AVX2_BITS for isa in cpu_vec_isa.valid_vec_isa_list()):
        return {}
    return {"cpp.simdlen": AVX2_BITS}


def build_kernel(key: LayoutKey, under: int, normal: int,
                 attempts: Sequence[Options]) -> Kernel:
    """Compile with the first of ``attempts`` that works, run once."""
    bits = device_tensor([under, normal], torch.int32, key.device)
    hist = device_tensor([1, 0], torch.int32, key.device)
    for k, options in enumerate(attempts):
        try:
            # A fresh function (code object) per attempt: a failed one leaves no cache entry.
            kernel = torch.compile(_make_kernel(key.scaled, under, normal, key.histogram,
                                                key.absent),
                                   dynamic=False, fullgraph=True, options=options)
            with torch.no_grad():  # as every call: grad mode is one of the kernel's guards
                kernel(_placeholders(key), bits[0], bits[1], hist)
        except Exception as exc:
            if k == len(attempts) - 1:
                raise
            logger.info("ampscope: the fused reduction did not compile with %s (%s: %s); "
                        "trying %s", options, type(exc).__name__, exc, attempts[k + 1])
            continue
        return kernel
    raise ValueError("no compile options to try")


def _native_kernel(key: LayoutKey, under: int, normal: int) -> Kernel | None:
    """The C loop for a CPU layout, run once on placeholders; None where it is not to be had
    (no C compiler, a gradient not dense in memory): inductor's kernel is tried next."""
    global _LOGGED_NATIVE
    try:  # at training's priority, unlike inductor's compile (``native_read.soon``)
        kernel = native_read.NativeKernel(
            native_read.library(), key.scaled, key.specs, key.absent, under, normal,
            NUM_BINS if key.histogram else 0, MIN_EXP)
    except native_read.Unavailable as exc:
        if not _LOGGED_NATIVE:
            _LOGGED_NATIVE = True
            logger.info("ampscope: no C loop for the fused reduction (%s); compiling it with "
                        "inductor", exc)
        return None
    with torch.no_grad():
        zeros = torch.zeros(2, dtype=torch.int32)
        kernel(_placeholders(key), zeros[0], zeros[1], zeros)
    return kernel


def _compile(key: LayoutKey, layout: _Layout, fmt: TargetFormat) -> None:
    """Background thread: build the layout's kernel and run it once on placeholders: on the CPU
    the C loop (``NATIVE``), else inductor's, compiled at ``COMPILE_NICENESS``."""
    global _LOGGED_FAILURE
    start, cpu = time.perf_counter(), time.thread_time()
    try:
        if _EXITING.is_set():  # e.g. a histogram layout whose plain one ended at exit
            raise RuntimeError("the interpreter is exiting")
        under, normal = format_bits(fmt)
        if key.native:
            native = _native_kernel(key, under, normal)
            if native is not None:
                layout.kernel, layout.backend, layout.state = native, "native", LayoutState.READY
                return
        # Its compiler processes inherit the priority: they take only idle CPU.
        lower_thread_priority(COMPILE_NICENESS)
        layout.kernel = build_kernel(key, under, normal, compile_options(key.device))
        layout.backend, layout.state = "inductor", LayoutState.READY
    except Exception as exc:  # no compiler, no inductor, anything: the eager path stays exact
        layout.error = f"{type(exc).__name__}: {exc}"
        layout.state = LayoutState.FAILED
        if not _LOGGED_FAILURE and not _EXITING.is_set():
            _LOGGED_FAILURE = True
            logger.warning("ampscope: the fused reduction did not compile (%s); per-layer stats "
                           "take the eager path", layout.error)
    finally:
        layout.compile_s = time.perf_counter() - start
        layout.compile_cpu_s = time.thread_time() - cpu
        layout.done.set()


def _run_compile(key: LayoutKey, layout: _Layout, fmt: TargetFormat,
                 after: threading.Event | None) -> None:
    try:
        if after is not None:
            after.wait()
        _compile(key, layout, fmt)
    finally:
        with _LOCK:
            _RUNNING.discard(threading.current_thread())


def layout_key(
    grads: Sequence[torch.Tensor | None], scaled: Sequence[bool], fmt: TargetFormat,
    histogram: bool = False, numels: Sequence[int] | None = None, native: bool = False,
) -> LayoutKey | None:
    """The layout of these gradients, or None when the fused path cannot take them. ``native``:
    a CPU layout may take the C loop."""
    first = next((g for g in grads if g is not None), None)
    if first is None:
        return None
    device = first.device
    if device.type not in ("cpu", "cuda"):
        return None
    specs: list[Spec] = []
    absent: list[tuple[int, int]] = []
    for i, g in enumerate(grads):
        if g is None:
            if numels is None:
                return None
            absent.append((i, numels[i]))
            continue
        if g.layout != torch.strided or g.device != device or g.dtype not in _SUPPORTED:
            return None
        if histogram and g.numel() >= HISTOGRAM_MAX_ELEMS:
            return None
        specs.append((tuple(g.shape), g.stride(), g.dtype))
    return LayoutKey(device, tuple(scaled), fmt.name, tuple(specs), histogram, tuple(absent),
                     native and device.type == "cpu")


class FusedPartials:
    """Per-layer partials ``(L, 8)`` from the compiled kernel, or None (take the eager path)."""

    def __init__(self, fmt: TargetFormat, numels: Sequence[int] | None = None) -> None:
        """``numels``: the layers' sizes, which let a layout with ``None`` gradients fuse."""
        self.fmt = fmt
        self.numels = numels
        self.native = NATIVE
        self._last: tuple[LayoutKey, _Layout] | None = None
        self._seen: dict[LayoutKey, _Layout] = {}
        self._thresholds: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def layout(self, key: LayoutKey) -> _Layout:
        """The registry entry of ``key``, starting its background compile on first sight. A
        histogram layout's compile starts once its plain layout's has ended: dynamo compiles
        one graph at a time, and the histogram's, read once every ``histogram_every`` steps,
        held the plain one, read on every per-layer step, back for minutes
        (docs/hook-cost.md#the-fused-kernels-compile)."""
        after = (self.layout(dataclasses.replace(key, histogram=False)).done if key.histogram
                 else None)
        with _LOCK:
            entry = _REGISTRY.get(key)
            if len(self._seen) >= MAX_LAYOUTS:
                self._seen.pop(next(iter(self._seen)))
            if entry is not None:
                self._seen[key] = entry
                return entry
            if len(_REGISTRY) >= MAX_LAYOUTS:
                _REGISTRY.pop(next(iter(_REGISTRY)))
            entry = _REGISTRY[key] = _Layout()
            self._seen[key] = entry
        thread = threading.Thread(target=_run_compile, args=(key, entry, self.fmt, after),
                                  name="ampscope-compile", daemon=True)
        with _LOCK:
            _RUNNING.add(thread)
        thread.start()
        return entry

    def wait(
        self, grads: Sequence[torch.Tensor | None], scaled: Sequence[bool], timeout: float,
        histogram: bool = False,
    ) -> LayoutState | None:
        """Start this layout's compile and wait; its state (None: unsupported). Tests only."""
        key = layout_key(grads, scaled, self.fmt, histogram, self.numels, self.native)
        if key is None:
            return None
        entry = self.layout(key)
        entry.done.wait(timeout)
        return entry.state

    def compiles(self, timeout: float = 0.0) -> list[tuple[LayoutState, float | None, str | None]]:
        """(state, compile seconds, error) of every layout met, waiting up to ``timeout`` s each."""
        out = []
        for entry in list(self._seen.values()):
            entry.done.wait(timeout)
            out.append((entry.state, entry.compile_s, entry.error))
        return out

    def __call__(
        self, grads: Sequence[torch.Tensor | None], scaled: Sequence[bool], scale: torch.Tensor,
        histogram: bool = False,
    ) -> torch.Tensor | None:
        """``(L, 8)`` partials, then with ``histogram`` the ``(L, NUM_BINS)`` counts. ``scale``:
        the float64 0-d device tensor in effect (the unscaled layers' factor)."""
        key = layout_key(grads, scaled, self.fmt, histogram, self.numels, self.native)
        if key is None:
            return None
        last = self._last
        entry = last[1] if last is not None and last[0] == key else self.layout(key)
        self._last = (key, entry)
        if entry.state is not LayoutState.READY or entry.kernel is None:
            return None
        consts = self._thresholds.get(key.device)
        if consts is None:
            fmt = self.fmt
            consts = self._thresholds[key.device] = (
                device_tensor([fmt.underflow_threshold, fmt.min_normal], torch.float64,
                              key.device),
                device_tensor(list(format_bits(fmt)), torch.int32, key.device))
        # Only the unscaled layers read these (the scaled ones' are constants of the kernel).
        bits = consts[1] if all(key.scaled) else threshold_bits(consts[0], scale)
        hist = scale_bits(scale) if histogram else consts[1]  # unread without the histogram
        present = [g for g in grads if g is not None] if key.absent else list(grads)
        try:
            # no_grad: grad mode is one of a compiled kernel's guards (compiled under no_grad).
            stance = (contextlib.nullcontext() if entry.backend == "native"
                      else torch.compiler.set_stance("fail_on_recompile"))
            with torch.no_grad(), stance:
                return entry.kernel(present, bits[0], bits[1], hist)  # type: ignore[arg-type]
        except Exception as exc:  # a guard miss, or anything else: eager from now on
            entry.state, entry.error = LayoutState.FAILED, f"{type(exc).__name__}: {exc}"
            logger.warning("ampscope: the fused reduction failed (%s); eager from now on",
                           entry.error)
            return None

