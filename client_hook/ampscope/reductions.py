"""Per-layer gradient statistics as tensor math: one read per gradient, no host sync.

Units. The caller passes the raw ``.grad`` tensors, the scale ``s`` in effect for the step, and for
each gradient whether it is still *scaled* (captured before ``unscale_``: raw = g·s) or already in
*true units* (captured after ``unscale_``: raw = g). Every magnitude statistic comes back in **true
units** (g), while the subnormal/underflow classes are judged on |g·s|, the value the target format
would hold at that scale. A layer is one named parameter.

Two paths, one result. ``GradStats.layer_stats`` computes each layer's mergeable partials
(``partials.py``: counts, sum of squares, max, min) and turns them into the wire's stats with
``partials.finalize``:

* **fused** (``fused.py``): a ``torch.compile``d kernel reads each gradient once, in place, for all
  eight partials. Taken when the layout is supported and compiled (in the background);
* **eager**, exact and always available: every gradient is copied once into a persistent float32
  buffer in which each layer is zero-padded to whole ``CHUNK``-element rows (one
  ``torch._foreach_copy_`` into fixed views, or one ``torch.cat`` per group for a layout that
  needs several groups or holds sparse or off-device gradients); each partial is a row reduction
  over the ``(chunks, CHUNK)`` matrix, folded into layers with one ``index_add_`` and two
  ``scatter_reduce_``: a constant number of launches however many layers there are. The padding
  zeros are subtracted again from the counts.

Both judge the classes on the bit patterns against ``partials.threshold_bits`` (exact at any
scale), count exactly (row sums of at most ``CHUNK`` ≤ 2^24 ones in float32, or integer sums),
accumulate squares in float64 (squares of scaled float32 gradients overflow float32 from 1.8e19)
and select max/min exactly, so they agree to the last bit except the sum of squares, which they add
in different orders (float64 rounding). Float64 gradients take the eager path and are judged as
their float32 rounding there.

A gradient that is ``None`` is treated as PyTorch defines it, an all-zero gradient of the
parameter's size (``zero_frac`` 1, ``amax`` 0): the parameter received no gradient this step.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch

from ampscope.formats import TargetFormat
from ampscope.fused import FusedPartials, LayoutState
from ampscope.partials import NUM_SUMS, finalize, float32_bits, threshold_bits
from ampscope.wire import LAYER_STAT_NAMES

__all__ = ["CHUNK", "FUSE_MIN_ELEMS", "STAT_NAMES", "GradStats", "grad_norm", "layer_stats",
           "unpack"]

STAT_NAMES: tuple[str, ...] = LAYER_STAT_NAMES
"""Rows of the stats block, in wire order; see DESIGN.md §3 for the definitions."""

CHUNK = 512
"""Elements per reduction row: larger rows waste more padding on small layers, smaller rows make the
chunk-to-layer fold longer. 512 was fastest on the CPU reference loop."""

MAX_GROUP_ELEMS = 1 << 26
"""Scratch buffers hold at most this many elements; bigger models are reduced in groups of layers,
so launches grow with model size / 64M, never with the layer count."""

FUSE_MIN_ELEMS = 1 << 19
"""With ``fused=None`` (auto), layouts of at least this many gradient elements get the compiled
kernel. Below it the fused kernel's fixed cost per gradient (~10 µs) leaves it no faster than the
eager path (bench/hook_sweep.py, 34 tensors: 0.55 against 0.49 ms at 0.25 M parameters, 0.73
against 1.50 ms at 1 M), and a compile takes the GIL and a core from training for seconds."""

# Partial columns (``partials.COLUMNS``): counts and sums first (folded with index_add_), then
# amax, amin.
_ZERO, _NAN, _INF, _LT_UNDER, _LT_NORMAL, _SUMSQ, _AMAX, _AMIN = range(8)
# float32 bit patterns: |x| viewed as int32 is monotonic in x.
_MAX_FINITE_BITS = 0x7F7FFFFF

Grads = Sequence["torch.Tensor | None"]


@dataclass
class _Group:
    """Layers reduced together in one pass over a scratch buffer."""

    layers: list[int]
    pads: list[torch.Tensor | None]
    rows: int


@dataclass
class _Plan:
    """Everything about a gradient layout that does not change from step to step."""

    device: torch.device
    groups: list[_Group]
    chunk_layer: torch.Tensor  # int64 (rows,): layer index of every chunk row
    numel: torch.Tensor  # float64 (L,)
    # float64 (L, NUM_SUMS): -padding for present layers, +numel for absent ones, in the three
    # columns that count zeros (ZERO, LT_UNDER, LT_NORMAL); 0 elsewhere.
    adjust: torch.Tensor
    scaled: torch.Tensor  # bool (L,)
    unscaled_rows: torch.Tensor | None  # bool (rows, 1) when only some layers are unscaled
    all_unscaled: bool
    present: list[int]
    present_scaled: torch.Tensor  # bool (P,)
    present_index: torch.Tensor  # int64 (P,)
    norm_scaled: torch.Tensor  # bool (L,): scaled and present (grad_norms' factor 1/s)
    all_scaled: bool  # every gradient present and scaled
    buf: torch.Tensor
    scratch: torch.Tensor
    meta: list[tuple[object, ...] | None]  # _meta() of every gradient: the layout's identity
    flags: list[bool]
    # Single-group layouts of dense on-device gradients: each present layer's fixed view of
    # ``buf`` (the gradient's shape), filled by one _foreach_copy_; None → torch.cat per group.
    views: list[torch.Tensor] | None
    all_present: bool
    fast: bool  # every gradient present, dense, on ``device``: grad_norms' direct path applies
    one: torch.Tensor  # float64 0-d 1.0
    thresholds: torch.Tensor  # float64 (2,): the format's underflow and min-normal thresholds


_META = operator.attrgetter("shape", "dtype", "device", "layout")


def _meta(grads: Grads) -> list[tuple[object, ...] | None]:
    """What a layout depends on, per gradient (cheap enough to check on every call)."""
    try:
        return list(map(_META, grads))
    except AttributeError:  # a None gradient
        return [None if g is None else _META(g) for g in grads]


def _build_plan(
    grads: Grads,
    scaled: Sequence[bool],
    device: torch.device,
    numels: Sequence[int] | None,
    meta: list[tuple[object, ...] | None],
    fmt: TargetFormat,
) -> _Plan:
    numel = [
        (numels[i] if numels is not None else 0) if g is None else g.numel()
        for i, g in enumerate(grads)
    ]
    present = [i for i, g in enumerate(grads) if g is not None]
    zero_adjust = [float(n) for n in numel]
    groups: list[_Group] = []
    chunk_layer: list[int] = []
    unscaled_rows: list[bool] = []
    current = _Group([], [], 0)
    for i in present:
        rows = -(-numel[i] // CHUNK)
        if current.layers and (current.rows + rows) * CHUNK > MAX_GROUP_ELEMS:
            groups.append(current)
            current = _Group([], [], 0)
        pad = rows * CHUNK - numel[i]
        zero_adjust[i] = -float(pad)
        current.layers.append(i)
        current.pads.append(torch.zeros(pad, device=device) if pad else None)
        current.rows += rows
        chunk_layer.extend([i] * rows)
        unscaled_rows.extend([not scaled[i]] * rows)
    if current.layers:
        groups.append(current)
    max_elems = max((g.rows for g in groups), default=0) * CHUNK
    some_unscaled = any(unscaled_rows)
    all_unscaled = some_unscaled and all(unscaled_rows)
    f64 = {"dtype": torch.float64, "device": device}
    buf = torch.zeros(max_elems, dtype=torch.float32, device=device)
    views: list[torch.Tensor] | None = None
    dense_here = all(g is None or (g.layout == torch.strided and g.device == device) for g in grads)
    if len(groups) == 1 and dense_here:
        views, offset = [], 0
        for i in present:
            g = grads[i]
            assert g is not None
            views.append(buf[offset : offset + numel[i]].view(g.shape))
            offset += -(-numel[i] // CHUNK) * CHUNK
    return _Plan(
        device=device,
        groups=groups,
        chunk_layer=torch.tensor(chunk_layer, dtype=torch.int64, device=device),
        numel=torch.tensor(numel, **f64),  # type: ignore[arg-type]
        adjust=_count_adjust(zero_adjust, device),
        scaled=torch.tensor(list(scaled), dtype=torch.bool, device=device),
        unscaled_rows=(
            torch.tensor(unscaled_rows, dtype=torch.bool, device=device).unsqueeze(1)
            if some_unscaled and not all_unscaled
            else None
        ),
        all_unscaled=all_unscaled,
        present=present,
        present_scaled=torch.tensor([scaled[i] for i in present], dtype=torch.bool, device=device),
        present_index=torch.tensor(present, dtype=torch.int64, device=device),
        norm_scaled=torch.tensor(
            [scaled[i] and grads[i] is not None for i in range(len(grads))],
            dtype=torch.bool,
            device=device,
        ),
        buf=buf,
        scratch=torch.empty(max_elems, dtype=torch.float32, device=device),
        meta=meta,
        flags=list(scaled),
        views=views,
        all_present=len(present) == len(grads),
        fast=len(present) == len(grads) and dense_here,
        all_scaled=len(present) == len(grads) and all(scaled),
        one=torch.ones((), dtype=torch.float64, device=device),
        thresholds=torch.tensor([fmt.underflow_threshold, fmt.min_normal], dtype=torch.float64,
                                device=device),
    )


def _count_adjust(zero_adjust: list[float], device: torch.device) -> torch.Tensor:
    adjust = torch.zeros((len(zero_adjust), NUM_SUMS), dtype=torch.float64)
    column = torch.tensor(zero_adjust, dtype=torch.float64)
    for k in (_ZERO, _LT_UNDER, _LT_NORMAL):
        adjust[:, k] = column
    return adjust.to(device)


def _flat(g: torch.Tensor, device: torch.device) -> torch.Tensor:
    if g.is_sparse:
        g = g.to_dense()
    if g.device != device:
        g = g.to(device, non_blocking=True)
    return g.reshape(-1)


def _scale_tensor(scale: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    """The scale as a 0-d float64 device tensor (a fill kernel, never a host→device copy)."""
    if isinstance(scale, torch.Tensor):
        return scale.detach().to(device=device, dtype=torch.float64).reshape(())
    return torch.full((), float(scale), dtype=torch.float64, device=device)


def _fill(plan: _Plan, group: _Group, grads: Grads) -> torch.Tensor:
    """Copy one group's gradients into the padded buffer; returns it as ``(rows, CHUNK)``."""
    n = group.rows * CHUNK
    flat = plan.buf[:n]
    if plan.views is not None:
        if plan.all_present and isinstance(grads, list | tuple):
            src = cast("list[torch.Tensor]", grads)
        else:
            src = [cast(torch.Tensor, grads[i]) for i in plan.present]
        torch._foreach_copy_(plan.views, src)
    else:
        parts: list[torch.Tensor] = []
        for i, pad in zip(group.layers, group.pads, strict=True):
            g = grads[i]
            assert g is not None
            parts.append(_flat(g, plan.device))
            if pad is not None:
                parts.append(pad)
        torch.cat(parts, out=flat)
    return flat.view(group.rows, CHUNK)


def _chunk_stats(
    plan: _Plan, group: _Group, grads: Grads, under: torch.Tensor | int,
    normal: torch.Tensor | int,
) -> torch.Tensor:
    """One group's per-chunk partials, float64 (rows, 8); columns as ``partials.COLUMNS``.

    ``under``/``normal``: the classes' threshold bit patterns (``partials.threshold_bits``), 0-d
    or one per row ``(rows, 1)`` when scaled and unscaled layers are mixed."""
    a = _fill(plan, group, grads).abs_()
    s = plan.scratch[: group.rows * CHUNK].view(group.rows, CHUNK)
    cols: list[torch.Tensor] = [torch.empty(0)] * 8
    # Counts go through a float32 scratch: comparison into float plus a float32 row-sum is ~5x
    # faster on CPU than materialising bool tensors or summing into float64, and exact (a row holds
    # CHUNK < 2^24 elements). The final stack promotes the float32 columns to float64.
    cols[_ZERO] = torch.eq(a, 0.0, out=s).sum(1)
    cols[_NAN] = torch.ne(a, a, out=s).sum(1)
    cols[_INF] = torch.eq(a, math.inf, out=s).sum(1)
    bits = a.view(torch.int32)  # |raw| ≥ 0: the bit pattern orders as the value (NaN above inf)
    cols[_LT_UNDER] = torch.lt(bits, under, out=s).sum(1)
    cols[_LT_NORMAL] = torch.lt(bits, normal, out=s).sum(1)
    torch.nan_to_num(a, nan=0.0, posinf=0.0, out=s)  # finite magnitudes, non-finite → 0
    cols[_AMAX] = s.amax(1)
    # float64 accumulation: squares of scaled fp32 gradients overflow float32 from 1.8e19.
    cols[_SUMSQ] = torch.linalg.vector_norm(s, dim=1, dtype=torch.float64).square()
    # min over finite non-zero |x| on the int32 bit patterns: (bits - 1) & 0x7fffffff sends 0 to the
    # largest key and keeps every other magnitude in order, so zeros never win; a row without a
    # finite non-zero element lands at or above the inf pattern and reads back as +inf.
    key = s.view(torch.int32)
    torch.sub(bits, 1, out=key).bitwise_and_(0x7FFFFFFF)
    amin_bits = key.amin(1).clamp_max_(_MAX_FINITE_BITS).add_(1)
    cols[_AMIN] = amin_bits.view(torch.float32)
    return torch.stack(cols, dim=1)


class GradStats:
    """Computes per-layer stats for a fixed target format, caching layouts and scratch buffers.

    The scratch buffers hold two float32 copies of all gradients (padded); they are kept between
    calls so steady-state calls allocate only small per-layer tensors.
    """

    def __init__(
        self,
        fmt: TargetFormat | str = "fp16",
        numels: Sequence[int] | None = None,
        exact_norms: bool = False,
        fused: bool | None = None,
    ) -> None:
        """``numels[i]`` is layer i's parameter size, used when its gradient is ``None``.

        ``fused``: take the compiled kernel when it is ready (``fused.py``); None (auto) does for
        layouts of at least ``FUSE_MIN_ELEMS`` elements, False never compiles anything.

        ``exact_norms``: ``grad_norms`` accumulates in float64 on every path (about twice the cost
        of the float32 direct path; see there). The monitor asks for it when no ``found_inf``
        can tell an accumulator overflow from an inf element (a scaler with ``enabled=False``).
        """
        self.fmt = TargetFormat.get(fmt)
        self.numels = None if numels is None else tuple(numels)
        self._acc64 = exact_norms  # grad_norms' direct path accumulates in float64
        self.float32_norms = False
        """Whether the last ``grad_norms`` accumulated in float32 (its +inf may be an overflow)."""
        self._plans: dict[tuple[object, ...], _Plan] = {}
        self._last: _Plan | None = None
        self._fused = FusedPartials(self.fmt) if fused is not False else None
        self._fuse_auto = fused is None
        self._consts: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self.last_path: str | None = None
        """Which path the last ``layer_stats`` took: "fused" or "eager" (tests, benchmarks)."""
        # grad_norms' direct path (no plan, no buffer copy); off after a layout that cannot take it
        self._try_fast = True

    def _check(self, grads: Grads, scaled: list[bool]) -> None:
        if len(scaled) != len(grads):
            raise ValueError(f"got {len(scaled)} scaled flags for {len(grads)} gradients")
        if self.numels is not None and len(self.numels) != len(grads):
            raise ValueError(f"got {len(grads)} gradients for {len(self.numels)} layers")

    def _plan(self, grads: Grads, scaled: list[bool], scale: torch.Tensor | float) -> _Plan:
        self._check(grads, scaled)
        meta = _meta(grads)
        last = self._last
        if last is not None and last.flags == scaled and last.meta == meta:
            return last
        key = (tuple(meta), tuple(scaled))
        plan = self._plans.get(key)
        if plan is None:
            device = next((g.device for g in grads if g is not None), None)
            if device is None:
                device = scale.device if isinstance(scale, torch.Tensor) else torch.device("cpu")
            if len(self._plans) >= 4:  # a changing layout (e.g. freezing) must not pile up buffers
                self._plans.clear()
            plan = self._plans[key] = _build_plan(grads, scaled, device, self.numels, meta,
                                                        self.fmt)
        self._last = plan
        return plan

    def layer_stats(
        self, grads: Grads, scale: torch.Tensor | float, scaled: Sequence[bool] | bool
    ) -> torch.Tensor:
        """Stats of every layer plus the global grad norm, as one float64 device tensor.

        Layout: ``out[0]`` is the global L2 norm in true units (NaN if any element is NaN, else
        +inf if any is ±inf, else sqrt(sum of l2²)); ``out[1:].view(8, L)`` holds the rows of
        ``STAT_NAMES``. ``amax``/``amin_nz`` are NaN when no element qualifies (sent as null);
        ``nan_count``/``inf_count`` are exact integer-valued floats. No host synchronisation.
        """
        with torch.no_grad():  # gradients of a create_graph=True backward require grad
            return self._layer_stats(grads, scale, scaled)

    def _layer_stats(
        self, grads: Grads, scale: torch.Tensor | float, scaled: Sequence[bool] | bool
    ) -> torch.Tensor:
        flags = [scaled] * len(grads) if isinstance(scaled, bool) else list(scaled)
        self._check(grads, flags)
        partials = None
        if self._fused is not None and grads:
            partials = self._fused_partials(grads, flags, scale)
        if partials is not None:
            self.last_path = "fused"
            return partials
        self.last_path = "eager"
        plan = self._plan(grads, flags, scale)
        s = _scale_tensor(scale, plan.device)
        return finalize(self._eager_partials(plan, grads, s), plan.numel,
                        torch.where(plan.scaled, s.reciprocal(), plan.one))

    def wait_fused(
        self, grads: Grads, scaled: Sequence[bool] | bool, timeout: float
    ) -> LayoutState | None:
        """Start the compile of this layout if needed and wait up to ``timeout`` s for it; its
        state, None when the fused path is off or cannot take the layout. For tests and
        benchmarks: training never waits (``layer_stats`` takes the eager path meanwhile)."""
        if self._fused is None:
            return None
        flags = [scaled] * len(grads) if isinstance(scaled, bool) else list(scaled)
        return self._fused.wait(grads, flags, timeout)

    def compiles(self, timeout: float = 0.0) -> list[tuple[LayoutState, float | None, str | None]]:
        """``FusedPartials.compiles``: the fused layouts met so far (empty when it is off)."""
        return [] if self._fused is None else self._fused.compiles(timeout)

    def _fused_partials(
        self, grads: Grads, flags: list[bool], scale: torch.Tensor | float
    ) -> torch.Tensor | None:
        """The fused path's stats, or None when it cannot answer now (``fused.py``)."""
        assert self._fused is not None
        first = grads[0]
        if first is None or any(g is None for g in grads):
            return None
        numels = tuple(cast(torch.Tensor, g).numel() for g in grads)
        if self._fuse_auto and sum(numels) < FUSE_MIN_ELEMS:
            return None
        s = _scale_tensor(scale, first.device)
        partials = self._fused(grads, flags, s)
        if partials is None:
            return None
        key = (first.device, tuple(flags), numels)
        consts = self._consts.get(key)
        if consts is None:
            if len(self._consts) >= 4:
                self._consts.clear()
            consts = self._consts[key] = (
                torch.tensor(key[2], dtype=torch.float64, device=first.device),
                torch.tensor(flags, dtype=torch.bool, device=first.device),
            )
        numel, is_scaled = consts
        one = torch.ones((), dtype=torch.float64, device=first.device)
        return finalize(partials, numel, torch.where(is_scaled, s.reciprocal(), one))

    def _eager_partials(self, plan: _Plan, grads: Grads, s: torch.Tensor) -> torch.Tensor:
        """Every layer's partials ``(L, 8)`` through the padded buffer (module docstring)."""
        # Scaled layers are judged as stored: the thresholds' own bit patterns.
        under: torch.Tensor | int = float32_bits(self.fmt.underflow_threshold)
        normal: torch.Tensor | int = float32_bits(self.fmt.min_normal)
        if plan.all_unscaled or plan.unscaled_rows is not None:
            bits = threshold_bits(plan.thresholds, s)
            under, normal = bits[0], bits[1]
            if plan.unscaled_rows is not None:  # mixed: one threshold per row
                under = torch.where(plan.unscaled_rows, under, float32_bits(
                    self.fmt.underflow_threshold))
                normal = torch.where(plan.unscaled_rows, normal, float32_bits(
                    self.fmt.min_normal))
        num_layers = len(grads)
        if plan.groups:
            chunks = [_chunk_stats(plan, g, grads, under, normal) for g in plan.groups]
            chunk = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
        else:
            chunk = torch.zeros((0, 8), dtype=torch.float64, device=plan.device)
        f64, dev = torch.float64, plan.device
        sums = torch.zeros((num_layers, NUM_SUMS), dtype=f64, device=dev).index_add_(
            0, plan.chunk_layer, chunk[:, :NUM_SUMS]
        )
        amax = torch.zeros(num_layers, dtype=f64, device=dev).scatter_reduce_(
            0, plan.chunk_layer, chunk[:, _AMAX], "amax"
        )
        amin = torch.full((num_layers,), math.inf, dtype=f64, device=dev).scatter_reduce_(
            0, plan.chunk_layer, chunk[:, _AMIN], "amin"
        )
        return torch.cat([sums.add_(plan.adjust), amax.unsqueeze(1), amin.unsqueeze(1)], dim=1)

    def raw_layer_norms(
        self, grads: Grads, scaled: Sequence[bool] | bool
    ) -> tuple[list[torch.Tensor], bool] | None:
        """The direct path of ``grad_norms`` alone: every layer's L2 norm of the *raw* gradient
        (as stored: times the scale when scaled), L 0-d tensors in the accumulation dtype
        (float32, or float64 with ``exact_norms`` or float64 gradients), and whether they are
        all scaled (divide by the scale for true units). None when the direct path does not
        apply (an absent, sparse or off-device gradient, mixed scaled flags): use
        ``grad_norms``.

        The monitor takes this on every step without per-layer stats and leaves the global norm
        and the division by the scale to the sender thread (``StepRecord.to_wire``), a handful of
        kernels fewer on the training thread; see ``grad_norms`` for the float32 range. The
        norms come unstacked: on the CPU the sender thread reads them one by one (a ``stack`` of
        L 0-d tensors is L ``unsqueeze`` calls, ~50 µs in the reference loop); on a GPU the
        caller stacks them into the step's one host copy.
        """
        if isinstance(scaled, bool):
            uniform: bool | None = scaled
        else:
            flags = list(scaled)
            if len(flags) != len(grads):
                raise ValueError(f"got {len(flags)} scaled flags for {len(grads)} gradients")
            uniform = True if all(flags) else False if not any(flags) else None
        if not (self._try_fast and uniform is not None and grads):
            return None
        if self.numels is not None and len(self.numels) != len(grads):
            raise ValueError(f"got {len(grads)} gradients for {len(self.numels)} layers")
        dense = cast("list[torch.Tensor]", grads if isinstance(grads, list | tuple)
                     else list(grads))
        try:
            # TypeError for a None gradient, NotImplementedError (a RuntimeError) for a sparse
            # one, RuntimeError from stack for gradients on several devices. (A None is checked
            # by the op itself: no Python loop over the gradients.)
            if self._acc64:
                each = torch._foreach_norm(dense, 2, dtype=torch.float64)
            else:
                try:
                    each = torch._foreach_norm(dense, 2, dtype=torch.float32)
                except RuntimeError:  # a float64 gradient does not narrow: float64 from now on
                    self._acc64 = True
                    each = torch._foreach_norm(dense, 2, dtype=torch.float64)
        except (TypeError, RuntimeError):
            return None
        self.float32_norms = not self._acc64
        return list(each), uniform

    def grad_norm(
        self, grads: Grads, scale: torch.Tensor | float, scaled: Sequence[bool] | bool
    ) -> torch.Tensor:
        """Only the global grad norm (0-d float64, true units, NaN/inf as in ``layer_stats``)."""
        return self.grad_norms(grads, scale, scaled)[0]

    def grad_norms(
        self, grads: Grads, scale: torch.Tensor | float, scaled: Sequence[bool] | bool
    ) -> torch.Tensor:
        """The global grad norm, then every layer's L2 norm: float64 ``(1 + L,)``, true units.

        For the steps without per-layer stats: this runs on every optimizer step, so it is the
        hook's floor. When every gradient is present, dense and on one device and all are scaled
        alike (the common case), the norms come straight from the gradients: one
        ``torch._foreach_norm`` accumulating each layer in **float32** (float64 for float64
        gradients; ``raw_layer_norms``), one ``stack`` promoted to float64, a ``dot`` for the
        global norm, one ``cat`` and the division by the scale; about 8 launches plus one
        per-tensor norm inside the multi-tensor call, no copy into the padded buffer.

        Why float32 there: it is what ``torch.nn.utils.clip_grad_norm_`` computes, and on the CPU
        reference loop the float64 conversion doubled the cost (≈210 → ≈110 µs, half of the
        hook's whole budget). Its range, on the *raw* values (scaled, when captured before
        ``unscale_``): a layer whose raw L2 norm reaches 1.8e19 reads +inf (squares overflow),
        and elements below ~1e-19 add nothing (squares underflow), so a layer holding only such
        values reads 0. NaN stays exact (a NaN norm ⇔ a NaN element). Inside that range the
        relative error is float32 rounding. An inf that is only an overflow is told apart from an
        inf element by ``found_inf`` on the host (``StepRecord.to_wire`` sends such a norm as
        unknown); with ``exact_norms`` (no ``found_inf`` to ask) the direct path accumulates in
        float64, as do ``layer_stats`` and the fallback paths, which are exact at any magnitude.

        Otherwise (absent, sparse or off-device gradients, mixed scaled flags) the per-layer norms
        come from a float64 ``_foreach_norm`` over the present gradients, or from the padded
        buffer's rows. A layer's norm is NaN when it holds a NaN, else +inf when it holds ±inf
        (so it doubles as the layer's finiteness code), 0 for an absent gradient; the global norm
        is NaN if any layer's is, else inf if any is. No host synchronisation.
        """
        direct = self.raw_layer_norms(grads, scaled)
        if direct is not None:
            each, divide = direct
            try:  # RuntimeError: gradients on several devices, or the scale on another device
                v = torch.stack(each).to(torch.float64)  # than them: the plan path below
                # dot: a plain sum of squares, so NaN (not inf) when a NaN and an inf layer meet.
                out = torch.cat([torch.dot(v, v).sqrt_().reshape(1), v])
                return out.div_(scale) if divide else out
            except RuntimeError:
                pass
        flags = [scaled] * len(grads) if isinstance(scaled, bool) else list(scaled)
        self.float32_norms = False
        plan = self._plan(grads, flags, scale)
        self._try_fast = plan.fast
        f64 = torch.float64
        if not plan.present:
            return torch.zeros(1 + len(grads), dtype=f64, device=plan.device)
        s = _scale_tensor(scale, plan.device)
        if plan.views is not None:
            rows = _fill(plan, plan.groups[0], grads)
            sumsq = torch.linalg.vector_norm(rows, dim=1, dtype=f64).square()
            layer = torch.zeros(len(grads), dtype=f64, device=plan.device).index_add_(
                0, plan.chunk_layer, sumsq
            )
            if plan.all_scaled:  # one factor for every layer
                inv = s.reciprocal()
                norms = layer.sqrt_().mul_(inv)
                # A plain sum of squares, not vector_norm: NaN, not inf, when both occur.
                return torch.cat([sumsq.sum().sqrt_().mul_(inv).reshape(1), norms])
            # Absent layers are exact zeros: their factor is 1, whatever the scale.
            norms = layer.sqrt_().mul_(torch.where(plan.norm_scaled, s.reciprocal(), plan.one))
            return torch.cat([(norms * norms).sum().sqrt().reshape(1), norms])
        out = torch.zeros(1 + len(grads), dtype=f64, device=plan.device)
        present = [_flat(g, plan.device) for g in grads if g is not None]
        if hasattr(torch, "_foreach_norm"):
            norms = torch.stack(torch._foreach_norm(present, 2, dtype=f64))
        else:  # pragma: no cover - every supported torch has it; keep the public fallback
            norms = torch.stack([torch.linalg.vector_norm(g, dtype=f64) for g in present])
        norms = norms * torch.where(plan.present_scaled, s.reciprocal(), plan.one)
        out[0] = (norms * norms).sum().sqrt()
        out[1:].index_copy_(0, plan.present_index, norms)
        return out


def layer_stats(
    grads: Grads,
    scale: torch.Tensor | float,
    scaled: Sequence[bool] | bool,
    fmt: TargetFormat | str = "fp16",
    numels: Sequence[int] | None = None,
) -> torch.Tensor:
    """``GradStats(fmt, numels).layer_stats(...)`` without caching; see there for the layout."""
    return GradStats(fmt, numels).layer_stats(grads, scale, scaled)


def grad_norm(
    grads: Grads, scale: torch.Tensor | float, scaled: Sequence[bool] | bool
) -> torch.Tensor:
    """``GradStats().grad_norm(...)`` without caching."""
    return GradStats().grad_norm(grads, scale, scaled)


def unpack(values: Sequence[float], num_layers: int) -> tuple[float, dict[str, list[float]]]:
    """Split a host copy of ``layer_stats`` output into (grad_norm, {stat name: per-layer list})."""
    if len(values) != 1 + len(STAT_NAMES) * num_layers:
        raise ValueError(f"expected {1 + len(STAT_NAMES) * num_layers} values, got {len(values)}")
    rows = {
        name: list(values[1 + k * num_layers : 1 + (k + 1) * num_layers])
        for k, name in enumerate(STAT_NAMES)
    }
    return float(values[0]), rows
