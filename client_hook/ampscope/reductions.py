"""Per-layer gradient statistics as tensor math: one read per gradient, no host sync.

Callers pass the raw ``.grad`` tensors, the step's scale ``s`` and, per gradient, whether it is
still scaled (raw = g·s) or in true units; magnitudes come back in true units, the underflow
classes judged on |g·s|, what the target format would hold. A ``None`` gradient is PyTorch's
all-zero one. ``GradStats.partials`` takes the **fused** kernel (``fused.py``) once compiled, or
the always-available **eager** path: one copy into a padded ``(chunks, CHUNK)`` float32 buffer,
row reductions folded into layers, a fixed number of ops per group of layers, never one per
layer. Both decide classes on bit patterns (``partials.threshold_bits``: exact at any scale),
sum squares in float64 (scaled float32 squares overflow from 1.8e19) and agree to the last bit
but for the sum of squares' order; float64 gradients go eager, judged as their float32 rounding.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import torch

from ampscope import native_read
from ampscope.devices import device_tensor, to_device
from ampscope.formats import TargetFormat
from ampscope.fused import FusedPartials, LayoutState
from ampscope.histogram import exponent_histogram
from ampscope.native_read import CONTIGUOUS, DATA_PTR, DTYPE, IS_CPU, NUMEL, NativeNorms
from ampscope.partials import (
    AMAX,
    AMIN,
    INF,
    INF_BITS,
    LT_NORMAL,
    LT_UNDER,
    MAX_FINITE_BITS,
    NAN,
    NUM_COLUMNS,
    SUMSQ,
    ZERO,
    finalize,
    format_bits,
    threshold_bits,
)
from ampscope.wire import LAYER_STAT_NAMES

__all__ = ["CHUNK", "DOT_MIN_ELEMS", "FUSE_MIN_ELEMS", "STAT_NAMES", "GradStats"]

STAT_NAMES: tuple[str, ...] = LAYER_STAT_NAMES
"""Rows of the stats block, in wire order (DESIGN.md §3)."""

CHUNK = 512
"""Elements per reduction row: longer rows waste padding on small layers, shorter ones lengthen
the fold. Why 512: docs/hook-cost.md#the-eager-reads-constants."""

MAX_GROUP_ELEMS = 1 << 24
"""The padded and work buffers hold one group of at most this many elements (24 bytes each:
~400 MB on a GPU); bigger models are reduced group by group, so launches grow with model size,
never with the layer count."""

DOT_MIN_ELEMS = 1 << 20
"""From this many float32 gradient elements ``raw_norms`` on the CPU without the C loop takes a
BLAS dot per layer, not one ``_foreach_norm``: faster, a Python op each
(docs/hook-cost.md#the-every-step-norms)."""

FUSE_MIN_ELEMS = 1 << 17
"""``fused=None`` takes the fused kernel for CPU layouts of this many gradient elements; below it
eager costs a fraction of a millisecond, and where the C loop cannot be built inductor's compile
takes the GIL and a core for minutes. Never auto on CUDA (slower there). Why:
docs/hook-cost.md#when-the-fused-kernel-is-taken."""

# The per-row block the fold reads (``_eager_partials``): amax first, the one column a (rows, 1)
# index makes ``scatter_reduce_`` read from a wider source, then the five class counts of
# ``_CLASS_BITS``, then the sum of squares. The counts become the table's through ``_derive``.
_ROW_COLUMNS = 7
_ROW_ZERO, _ROW_UNDER, _ROW_NORMAL, _ROW_FINITE, _ROW_NOT_NAN, _ROW_SUMSQ = range(1, 7)
# The five classes one comparison counts, as ``|x| <= t``: t the float32 whose bit pattern is one
# below the class's bound (``bits(|x|) < b ⇔ |x| <= float(b - 1)`` for |x| ≥ 0; NaN compares
# false with every t, as its pattern lies above them all): zero (b = 1), the underflow and
# min-normal bounds (``_Plan.classes_at``), finite (b = inf's pattern), not NaN (b one above).
_CLASS_BITS = (1, 0, 0, INF_BITS, INF_BITS + 1)


def _derive() -> torch.Tensor:
    """The constant map from the folded row block to the table (exact integers below 2^53)."""
    d = torch.zeros((_ROW_COLUMNS, NUM_COLUMNS), dtype=torch.float64)
    d[_ROW_ZERO, ZERO] = 1.0
    d[_ROW_NOT_NAN, NAN] = -1.0
    d[_ROW_NOT_NAN, INF] = 1.0
    d[_ROW_FINITE, INF] = -1.0
    d[_ROW_UNDER, LT_UNDER] = 1.0
    d[_ROW_NORMAL, LT_NORMAL] = 1.0
    d[_ROW_SUMSQ, SUMSQ] = 1.0
    return d


Grads = Sequence["torch.Tensor | None"]


@dataclass
class _Group:
    """Layers reduced together in one pass; its buffer views are made once, not per step."""

    layers: list[int]
    pads: list[torch.Tensor | None]
    rows: int
    start: int = 0  # its first row in the plan's per-row buffers
    flat: torch.Tensor | None = None  # the buffer's first rows·CHUNK elements
    matrix: torch.Tensor | None = None  # the same, (rows, CHUNK)
    bits: torch.Tensor | None = None  # the same as int32 bit patterns
    column: torch.Tensor | None = None  # the same as (rows, 1, CHUNK), against (5, 1) bounds
    # Contiguous views of the plan's work buffer, each read before the next one is written:
    classes: torch.Tensor | None = None  # float32 (rows, 5, CHUNK): the comparisons' 0/1
    finite: torch.Tensor | None = None  # float32 (rows, CHUNK): the finite magnitudes (5th fifth)
    wide: torch.Tensor | None = None  # float64 (rows, CHUNK): the same, widened (1st, 2nd fifth)
    key: torch.Tensor | None = None  # int32 (rows, CHUNK): the amin keys, in ``finite``'s place
    counts: torch.Tensor | None = None  # its rows of ``_Plan.row_counts`` (and so on)
    amax: torch.Tensor | None = None
    norms: torch.Tensor | None = None
    amin_key: torch.Tensor | None = None


@dataclass
class _Plan:
    """A gradient layout's constants and the persistent buffers of its (sequential) passes."""

    device: torch.device
    groups: list[_Group]
    chunk_layer: torch.Tensor  # int64 (rows,): layer index of every chunk row
    chunk_layer_col: torch.Tensor  # the same as (rows, 1), for the amax/amin scatters
    scaled: torch.Tensor  # bool (L,)
    unscaled_rows: torch.Tensor | None  # bool (rows, 1, 1) when only some layers are unscaled
    all_unscaled: bool
    present: list[int]
    buf: torch.Tensor
    meta: list[tuple[object, ...] | None]  # _meta() of every gradient: the layout's identity
    flags: list[bool]
    # Single-group layouts of dense on-device gradients: each present layer's fixed view of
    # ``buf`` (the gradient's shape), filled by one _foreach_copy_; None → torch.cat per group.
    views: list[torch.Tensor] | None
    all_present: bool
    thresholds: torch.Tensor  # float64 (2,): the format's underflow and min-normal thresholds
    classes_at: torch.Tensor  # float32 (5, 1): the class bounds of scaled layers (_CLASS_BITS)
    # Per-row results, written by the groups' reductions (out=), read by one cat.
    row_counts: torch.Tensor  # float32 (rows, 5): exact, a row holds CHUNK < 2^24 elements
    row_amax: torch.Tensor  # float32 (rows, 1)
    row_norms: torch.Tensor  # float64 (rows, 1), squared in place
    row_amin_key: torch.Tensor  # int32 (rows, 1)
    fold_zero: torch.Tensor  # float64 (L, _ROW_COLUMNS) zeros: index_add's out-of-place base
    # float64 (L, 8): the addmm's bias. Counts: -padding for present layers, +numel in the three
    # columns that count zeros for layers without rows, rows·CHUNK for NaN; amax and amin
    # written every step through the two views (0 and +inf for layers without rows).
    table: torch.Tensor
    table_amax: torch.Tensor  # table[:, AMAX:AMAX + 1]
    table_amin: torch.Tensor  # table[:, AMIN:AMIN + 1]
    key_bound: torch.Tensor  # int32 (L, 1) MAX_FINITE_BITS: caps each layer's least key
    amin_keys: torch.Tensor  # int32 (L, 1): each layer's least key, capped
    amin_keys_f32: torch.Tensor  # the same as float32
    derive: torch.Tensor  # float64 (_ROW_COLUMNS, 8): _derive()
    inf: torch.Tensor  # float32 0-d +inf: nextafter's direction


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
    bias = torch.zeros((len(grads), NUM_COLUMNS), dtype=torch.float64)
    for k in (ZERO, LT_UNDER, LT_NORMAL):  # layers without rows: all their elements zero
        bias[:, k] = torch.tensor([float(n) for n in numel], dtype=torch.float64)
    bias[:, AMIN] = math.inf
    groups: list[_Group] = []
    chunk_layer: list[int] = []
    unscaled_rows: list[bool] = []
    current = _Group([], [], 0)
    for i in present:
        rows = -(-numel[i] // CHUNK)
        if current.layers and (current.rows + rows) * CHUNK > MAX_GROUP_ELEMS:
            groups.append(current)
            current = _Group([], [], 0, start=current.start + current.rows)
        pad = rows * CHUNK - numel[i]
        if rows:  # the padding zeros are counted in every class at or below zero's
            for k in (ZERO, LT_UNDER, LT_NORMAL):
                bias[i, k] = -float(pad)
            bias[i, NAN] = float(rows * CHUNK)
        current.layers.append(i)
        current.pads.append(torch.zeros(pad, device=device) if pad else None)
        current.rows += rows
        chunk_layer.extend([i] * rows)
        unscaled_rows.extend([not scaled[i]] * rows)
    if current.layers:
        groups.append(current)
    total_rows = len(chunk_layer)
    max_rows = max((g.rows for g in groups), default=0)
    some_unscaled = any(unscaled_rows)
    all_unscaled = some_unscaled and all(unscaled_rows)
    f32, f64, i32 = torch.float32, torch.float64, torch.int32
    buf = torch.zeros(max_rows * CHUNK, dtype=f32, device=device)
    # One work buffer, five float32 per element: the five comparisons; once they are summed, the
    # finite magnitudes in its last fifth, widened to float64 in its first two, and the amin keys
    # over the magnitudes. Each view contiguous (docs/hook-cost.md#the-eager-reads-constants).
    slots = len(_CLASS_BITS)
    work = torch.zeros(max_rows * slots * CHUNK, dtype=f32, device=device)
    row_counts = torch.zeros((total_rows, len(_CLASS_BITS)), dtype=f32, device=device)
    row_amax = torch.zeros((total_rows, 1), dtype=f32, device=device)
    row_norms = torch.zeros((total_rows, 1), dtype=f64, device=device)
    row_amin_key = torch.zeros((total_rows, 1), dtype=i32, device=device)
    for group in groups:
        n, r, rows_of = group.rows * CHUNK, group.rows, slice(group.start, group.start + group.rows)
        group.flat = buf[:n]
        group.matrix = group.flat.view(r, CHUNK)
        group.bits = group.matrix.view(i32)
        group.column = group.matrix.view(r, 1, CHUNK)
        group.classes = work[: n * slots].view(r, slots, CHUNK)
        group.wide = work[: 2 * n].view(f64).view(r, CHUNK)
        group.finite = work[(slots - 1) * n : slots * n].view(r, CHUNK)
        group.key = group.finite.view(i32)
        group.counts = row_counts[rows_of]
        group.amax = row_amax[rows_of]
        group.norms = row_norms[rows_of]
        group.amin_key = row_amin_key[rows_of]
    amin_keys = torch.zeros((len(grads), 1), dtype=i32, device=device)
    views: list[torch.Tensor] | None = None
    dense_here = all(g is None or (g.layout == torch.strided and g.device == device) for g in grads)
    if len(groups) == 1 and dense_here:
        views, offset = [], 0
        for i in present:
            g = grads[i]
            assert g is not None
            views.append(buf[offset : offset + numel[i]].view(g.shape))
            offset += -(-numel[i] // CHUNK) * CHUNK
    layer_of_row = device_tensor(chunk_layer, torch.int64, device)
    table = to_device(bias, device)
    class_bits = list(_CLASS_BITS)
    class_bits[1:3] = format_bits(fmt)
    return _Plan(
        device=device,
        groups=groups,
        chunk_layer=layer_of_row,
        chunk_layer_col=layer_of_row.unsqueeze(1),
        scaled=device_tensor(list(scaled), torch.bool, device),
        unscaled_rows=(
            device_tensor(unscaled_rows, torch.bool, device).view(-1, 1, 1)
            if some_unscaled and not all_unscaled
            else None
        ),
        all_unscaled=all_unscaled,
        present=present,
        buf=buf,
        meta=meta,
        flags=list(scaled),
        views=views,
        all_present=len(present) == len(grads),
        thresholds=device_tensor([fmt.underflow_threshold, fmt.min_normal], f64, device),
        classes_at=_class_bounds(device_tensor([b - 1 for b in class_bits], i32, device)),
        row_counts=row_counts,
        row_amax=row_amax,
        row_norms=row_norms,
        row_amin_key=row_amin_key,
        fold_zero=torch.zeros((len(grads), _ROW_COLUMNS), dtype=f64, device=device),
        table=table,
        table_amax=table[:, AMAX : AMAX + 1],
        table_amin=table[:, AMIN : AMIN + 1],
        key_bound=torch.full((len(grads), 1), MAX_FINITE_BITS, dtype=i32, device=device),
        amin_keys=amin_keys,
        amin_keys_f32=amin_keys.view(f32),
        derive=to_device(_derive(), device),
        inf=torch.full((), math.inf, dtype=f32, device=device),
    )


def _class_bounds(below: torch.Tensor) -> torch.Tensor:
    """``(5, 1)`` float32 bounds from the patterns one below the classes' (``_CLASS_BITS``)."""
    return below.view(torch.float32).view(-1, 1)


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
    assert group.flat is not None and group.matrix is not None
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
        torch.cat(parts, out=group.flat)
    return group.matrix


def _chunk_stats(plan: _Plan, group: _Group, grads: Grads, bounds: torch.Tensor) -> None:
    """One group's per-row partials into the plan's buffers: five class counts (float32, exact
    below 2^24 per row), amax, the float64 sum of squares and the amin key. ``bounds``: the
    ``(5, 1)`` class bounds, or ``(rows, 5, 1)`` when scaled and unscaled layers mix."""
    a = _fill(plan, group, grads).abs_()
    column, classes, finite, key = group.column, group.classes, group.finite, group.key
    bits, wide = group.bits, group.wide
    assert column is not None and classes is not None and finite is not None and key is not None
    assert bits is not None and wide is not None
    # All five classes in one comparison and one row sum: float 0/1 into a float32 buffer and a
    # float32 row sum, exact and the fastest form (docs/hook-cost.md#the-eager-reads-constants).
    # Comparing the floats against the float32 one pattern below each bound is the bits' test.
    torch.le(column, bounds, out=classes)
    torch.sum(classes, -1, out=group.counts)
    torch.nan_to_num(a, nan=0.0, posinf=0.0, out=finite)  # finite magnitudes, non-finite → 0
    torch.amax(finite, 1, keepdim=True, out=group.amax)
    # float64 accumulation: squares of scaled fp32 gradients overflow float32 from 1.8e19. Widened
    # in the work buffer, not by ``vector_norm(dtype=float64)``: that widens into a fresh
    # temporary on every call, a big one's pages faulted in each time
    # (docs/hook-cost.md#the-eager-reads-constants).
    torch.linalg.vector_norm(wide.copy_(finite), 2, 1, True, out=group.norms).pow_(2)
    # min over finite non-zero |x| on the int32 bit patterns: (bits - 1) & 0x7fffffff sends 0 to
    # the largest key and keeps every other magnitude in order, so zeros never win; the fold
    # caps each layer's least key at MAX_FINITE_BITS, so a layer without a finite non-zero
    # element (its keys those of zeros, inf or NaN) reads back as +inf (``_eager_partials``).
    # Written over ``finite``, read already.
    torch.sub(bits, 1, out=key).bitwise_and_(0x7FFFFFFF)
    torch.amin(key, 1, keepdim=True, out=group.amin_key)


def _dense_float32_cpu(grads: Sequence[torch.Tensor | None]) -> bool:
    """Every gradient a dense, contiguous float32 CPU tensor (``raw_norms``' dot path)."""
    for g in grads:
        if (g is None or g.dtype != torch.float32 or g.device.type != "cpu"
                or g.layout != torch.strided or not g.is_contiguous()):
            return False
    return True


class GradStats:
    """Per-layer stats for one target format, caching layouts and scratch buffers."""

    def __init__(
        self,
        fmt: TargetFormat | str = "fp16",
        numels: Sequence[int] | None = None,
        exact_norms: bool = False,
        fused: bool | None = None,
    ) -> None:
        """``numels[i]``: layer i's size when its gradient is ``None``. ``fused``: None (auto,
        ``FUSE_MIN_ELEMS``), True, or False (never compile). ``exact_norms``: float64 norms
        always, where no ``found_inf`` tells an overflow from an inf (a disabled scaler)."""
        self.fmt = TargetFormat.get(fmt)
        self.numels = None if numels is None else tuple(numels)
        self._total = 0 if numels is None else sum(self.numels or ())
        self._acc64 = exact_norms  # raw_norms accumulates in float64
        self.exact_norms = exact_norms
        self.float32_norms = False
        """Whether the last ``raw_norms`` accumulated in float32 (its +inf may be an overflow)."""
        self.unscaled = False
        """Whether the last ``raw_norms`` unscaled the gradients too (its ``unscale``)."""
        self._plans: dict[tuple[object, ...], _Plan] = {}
        self._last: _Plan | None = None
        self._fused = FusedPartials(self.fmt, self.numels) if fused is not False else None
        # The C loop's norms (``raw_norms``): None until its library is built and a layout read,
        # False where it is not to be had (``fused=False``, ``fused.NATIVE`` off, gradients it
        # cannot read).
        self.native: NativeNorms | Literal[False] | None = (
            None if self._fused is not None and self._fused.native else False)
        self._fuse_auto = fused is None
        self.last_path: str | None = None
        """Which path the last ``partials`` took: "fused" or "eager" (tests, benchmarks)."""

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
        """Every layer's stats plus the global grad norm, one float64 device tensor, no host sync:
        ``out[0]`` the global L2 norm (true units; NaN, else +inf, if any element is), then the
        ``(8, L)`` rows of ``STAT_NAMES`` (``partials.finalize``)."""
        flags = [scaled] * len(grads) if isinstance(scaled, bool) else list(scaled)
        table, _ = self.partials(grads, scale, flags)
        device = table.device
        numel = device_tensor([self._numel(i, g) for i, g in enumerate(grads)], torch.float64,
                              device)
        s = _scale_tensor(scale, device)
        one = torch.ones((), dtype=torch.float64, device=device)
        to_true = torch.where(device_tensor(flags, torch.bool, device),
                              s.reciprocal(), one)
        return finalize(table, numel, to_true)

    def partials(
        self, grads: Grads, scale: torch.Tensor | float, scaled: Sequence[bool] | bool,
        histogram: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every layer's raw partials ``(L, 8)`` and, with ``histogram``, its ``(L, NUM_BINS)``
        exponent histogram: device tensors, no host sync, from one fused read when the kernels
        are ready (else eager). ``last_path`` says which read made the partials."""
        with torch.no_grad():  # gradients of a create_graph=True backward require grad
            flags = [scaled] * len(grads) if isinstance(scaled, bool) else list(scaled)
            self._check(grads, flags)
            table = None
            if self._fused is not None and grads:
                table = self._fused_partials(grads, flags, scale, histogram)
                if table is not None:
                    self.last_path = "fused"
                    if not histogram:
                        return table, None
                    return table[:, :NUM_COLUMNS], table[:, NUM_COLUMNS:]
                if histogram:  # its kernel still compiling, or a layer too large for it
                    table = self._fused_partials(grads, flags, scale, False)
            if table is not None:
                self.last_path = "fused"
            else:
                self.last_path = "eager"
                plan = self._plan(grads, flags, scale)
                table = self._eager_partials(plan, grads, scale)
            counts = (exponent_histogram(grads, scale, flags, self.numels) if histogram
                      else None)
            return table, counts

    def _numel(self, i: int, g: torch.Tensor | None) -> int:
        return (self.numels[i] if self.numels is not None else 0) if g is None else g.numel()

    def wait_fused(
        self, grads: Grads, scaled: Sequence[bool] | bool, timeout: float,
        histogram: bool = False,
    ) -> LayoutState | None:
        """Start this layout's compile and wait; its state (None: not fusable). Tests only."""
        if self._fused is None:
            return None
        flags = [scaled] * len(grads) if isinstance(scaled, bool) else list(scaled)
        return self._fused.wait(grads, flags, timeout, histogram)

    def compiles(self, timeout: float = 0.0) -> list[tuple[LayoutState, float | None, str | None]]:
        """``FusedPartials.compiles``: the fused layouts met so far (empty when it is off)."""
        return [] if self._fused is None else self._fused.compiles(timeout)

    def _fused_partials(
        self, grads: Grads, flags: list[bool], scale: torch.Tensor | float, histogram: bool
    ) -> torch.Tensor | None:
        """The fused kernel's table (``FusedPartials``), or None when it cannot answer now."""
        assert self._fused is not None
        first = next((g for g in grads if g is not None), None)
        if first is None:
            return None
        if self._fuse_auto:
            if first.device.type != "cpu":  # see FUSE_MIN_ELEMS: slower than eager on CUDA
                return None
            total = 0
            for g in grads:
                if g is not None:
                    total += g.numel()
            if total < FUSE_MIN_ELEMS:
                return None
        return self._fused(grads, flags, _scale_tensor(scale, first.device), histogram)

    def _eager_partials(
        self, plan: _Plan, grads: Grads, scale: torch.Tensor | float
    ) -> torch.Tensor:
        """Every layer's partials ``(L, 8)`` through the padded buffer in a fixed number of ops:
        per-row results folded into layers, then one ``addmm`` of the bias and ``_derive()``."""
        bounds = plan.classes_at
        if plan.all_unscaled or plan.unscaled_rows is not None:
            # Unscaled layers' bounds depend on the scale: a tensor only here (scaled layers are
            # judged on the thresholds' own patterns, ``_Plan.classes_at``).
            bits = threshold_bits(plan.thresholds, _scale_tensor(scale, plan.device))
            unscaled = torch.cat([bounds[:1], _class_bounds(bits - 1), bounds[3:]])
            bounds = (unscaled if plan.unscaled_rows is None
                      else torch.where(plan.unscaled_rows, unscaled, bounds))
        for group in plan.groups:
            at = bounds if bounds.dim() == 2 else bounds[group.start : group.start + group.rows]
            _chunk_stats(plan, group, grads, at)
        rows = torch.cat([plan.row_amax, plan.row_counts, plan.row_norms], dim=1)
        sums = torch.index_add(plan.fold_zero, 0, plan.chunk_layer, rows)
        plan.table_amax.scatter_reduce_(0, plan.chunk_layer_col, rows, "amax",
                                        include_self=False)
        torch.scatter_reduce(plan.key_bound, 0, plan.chunk_layer_col, plan.row_amin_key, "amin",
                             out=plan.amin_keys)
        torch.nextafter(plan.amin_keys_f32, plan.inf, out=plan.table_amin)
        return torch.addmm(plan.table, sums, plan.derive)

    def raw_norms(
        self, grads: Grads, *, acc64: bool | None = None, out: torch.Tensor | None = None,
        unscale: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Every layer's L2 norm of the raw gradient (times the scale when scaled), a ``(L,)``
        device tensor, 0 when absent; NaN if the layer holds a NaN, else +inf if it holds ±inf:
        the norms double as finiteness. No host sync. The every-step floor, one read as the
        gradients are (docs/hook-cost.md#the-every-step-norms): on the CPU the C loop
        (``native_read.NativeNorms``, float64 sums, one call) once its library is built;
        else float32 as in ``clip_grad_norm_`` (float64 for float64 gradients, ``exact_norms``
        or ``acc64``), one ``_foreach_norm`` or on the CPU one dot per layer. A float32 raw norm
        from 1.8e19 reads +inf; ``found_inf`` tells that overflow from an inf element (else
        ``checked_norms``). ``out``: a float64 ``(L,)`` tensor, written and returned.
        ``unscale``: GradScaler's ``(inv_scale, found_inf)``; where the C loop reads float32
        gradients it unscales them in the same pass, as torch's kernel would, and sets
        ``unscaled`` (docs/hook-cost.md#the-norms-in-the-unscale)."""
        if self.numels is not None and len(self.numels) != len(grads):
            raise ValueError(f"got {len(grads)} gradients for {len(self.numels)} layers")
        use64 = self._acc64 if acc64 is None else acc64
        self.unscaled = False
        with torch.no_grad():
            if not grads:
                self.float32_norms = not use64
                return torch.zeros(0, dtype=torch.float64 if use64 else torch.float32) if (
                    out is None) else out
            dense = cast("list[torch.Tensor]", grads if isinstance(grads, list | tuple)
                         else list(grads))
            try:
                # The C loop, in float64 (either accumulation asked): its layout checked (in
                # C-level loops over the gradients) and read inline, no Python call on the way.
                native = self.native
                if native and not (array("q", map(NUMEL, dense)) == native.numels
                                   and list(map(DTYPE, dense)) == native.dtypes
                                   and all(map(IS_CPU, dense)) and all(map(CONTIGUOUS, dense))):
                    native = None  # another layout
                if native is None:
                    native = self._native_layout(dense)
                if native:
                    if out is None:
                        out = torch.empty(len(dense), dtype=torch.float64)
                    pointers = array("q", map(DATA_PTR, dense))
                    layout = (len(dense), pointers.buffer_info()[0],
                              native.numels.buffer_info()[0], native.codes.buffer_info()[0])
                    inv, found = unscale if unscale is not None else (None, None)
                    if (inv is not None and found is not None and native.unscale is not None
                            and inv.dtype is found.dtype is torch.float32 and inv.is_cpu
                            and found.is_cpu and inv.dim() == found.dim() == 0):
                        status = native.unscale(*layout, inv.data_ptr(), found.data_ptr(),
                                                native.threads, out.data_ptr())
                        self.unscaled = status == 0
                    else:
                        status = native.read(*layout, native.threads, out.data_ptr())
                    if status == 0:
                        self.float32_norms = False
                        return out
                # torch's read. TypeError for a None gradient, NotImplementedError (a
                # RuntimeError) for a sparse one, RuntimeError for gradients on several devices:
                # the op itself checks, no Python loop over the gradients on the common path.
                if not use64:
                    # ``_dots``, its size test inline (a call fewer on every step).
                    total = self._total if self.numels is not None else DOT_MIN_ELEMS
                    if total >= DOT_MIN_ELEMS and self._dots(dense):
                        squares = []
                        for g in dense:
                            flat = g.view(-1)
                            squares.append(torch.dot(flat, flat))
                        self.float32_norms = True
                        norms = torch.stack(squares).sqrt_()
                    else:
                        try:
                            each = torch._foreach_norm(dense, 2, dtype=torch.float32)
                            self.float32_norms = True
                        except RuntimeError:  # a float64 gradient does not narrow to float32
                            each = torch._foreach_norm(dense, 2, dtype=torch.float64)
                            self._acc64 = True  # it did: float64 from now on
                            self.float32_norms = False
                        norms = torch.stack(each)
                else:
                    norms = torch.stack(torch._foreach_norm(dense, 2, dtype=torch.float64))
                    self.float32_norms = False
            except (TypeError, RuntimeError):
                norms = self._raw_norms_fallback(grads)
            return norms if out is None else out.copy_(norms)

    def checked_norms(self, grads: Grads) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``raw_norms`` in float32 plus a bool ``(L,)`` device tensor, whether the layer holds an
        inf (one ``aminmax`` each), which tells an overflow from an inf where no ``found_inf``
        can. Flags None: the read was float64 anyway. No host sync."""
        if any(g is None or g.numel() == 0 for g in grads):  # aminmax has no answer for those
            return self.raw_norms(grads, acc64=True), None
        norms = self.raw_norms(grads, acc64=False)
        if not self.float32_norms:  # float64, sparse or off-device: read in float64 already
            return norms, None
        dense = cast("list[torch.Tensor]", grads)
        with torch.no_grad():
            bounds = [torch.aminmax(g) for g in dense]
            low = torch.stack([b.min for b in bounds])
            high = torch.stack([b.max for b in bounds])
            return norms, (high == math.inf) | (low == -math.inf)

    def _native_layout(self, grads: list[torch.Tensor]) -> NativeNorms | Literal[False] | None:
        """The C loop's layout of ``grads`` for ``raw_norms``, kept; None while its library is
        being built (``native_read.soon``), False where the loop cannot read them."""
        try:
            lib = native_read.soon() if all(map(IS_CPU, grads)) else False
            if lib is None:
                return None
            self.native = NativeNorms.of(lib, grads) if lib else False
        except (native_read.Unavailable, AttributeError):  # e.g. a None gradient
            self.native = False
        return self.native

    def _dots(self, grads: list[torch.Tensor]) -> bool:
        """Whether ``raw_norms`` takes the dot path (see there)."""
        total = self._total if self.numels is not None else sum(
            g.numel() for g in grads if g is not None)
        return total >= DOT_MIN_ELEMS and _dense_float32_cpu(grads)

    def _raw_norms_fallback(self, grads: Grads) -> torch.Tensor:
        self.float32_norms = False
        device = next(g.device for g in grads if g is not None) if any(
            g is not None for g in grads) else torch.device("cpu")
        present = [i for i, g in enumerate(grads) if g is not None]
        flat = [_flat(cast(torch.Tensor, grads[i]), device) for i in present]
        out = torch.zeros(len(grads), dtype=torch.float64, device=device)
        if flat:
            out[present] = torch.stack(torch._foreach_norm(flat, 2, dtype=torch.float64))
        return out
