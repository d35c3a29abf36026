"""What one optimizer step leaves on the host, and the layer table: the hook's side of the wire.

``StepRecord`` is built on the training thread (cheap: a host tensor, or on the CPU the unstacked
pieces, and a few ints) and turned into the wire record on the sender thread (``to_wire``: the
only place that reads the values).
"""

from __future__ import annotations

import ctypes
import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ampscope import wire
from ampscope.capture import Finished, Kind, Taken, finish
from ampscope.collective import Pending
from ampscope.devices import to_device
from ampscope.histogram import MAX_EXP, MIN_EXP
from ampscope.misuse import ClipHeuristic
from ampscope.names import canonical_names
from ampscope.partials import NUM_COLUMNS, HostStats
from ampscope.recheck import NAN_CODE, ORIGIN_FORMATS, ORIGIN_SIZE
from ampscope.recipes import MOMENTS, OPERANDS, SCALE_WIDTH, STATS, TRAINED
from ampscope.reductions import STAT_NAMES
from ampscope.selection import selected
from ampscope.shadow import block_size
from ampscope.shards import Unpacked, unpack

F64 = torch.float64

# Scalars at the head of the per-step tensor, in this order; the sections of ``Sections`` follow.
SCALARS = ("scale_before", "scale_after", "growth_tracker", "found_inf", "loss", "grad_norm", "lr")

# A CPU step's values left unstacked by the training thread (``cycle.StepCycle.build``): first the
# SCALARS as 0-d tensors, then one entry per section, a tensor or a list of 0-d tensors (the raw
# per-layer norms). Read in this order they are the same values as the stacked tensor.
Parts = list[list[torch.Tensor] | torch.Tensor]


@dataclass(frozen=True)
class Slot:
    """An index into the record's optimizer section (a tensor lr's or found_inf's 0-d copy)."""

    index: int


@dataclass(frozen=True)
class OptimizerSlots:
    """One optimizer's ``optimizers`` entry: its skip (``Slot``, host bool, None: unknown), lrs."""

    skipped: Slot | bool | None
    lr: tuple[Slot | float | None, ...]


@dataclass(frozen=True)
class FormatsSection:
    """A formats block's recipes, the layer-table rows of its modules' weights and, when one
    of them trains in a recipe, each one's (``format_probe.trained_recipe``)."""

    recipes: tuple[str, ...]
    layers: tuple[int, ...]
    trained: tuple[str | None, ...] | None = None

    @property
    def width(self) -> int:
        """Values per module and operand: the recipes' ``STATS``, ``MOMENTS``, the recipes'
        ``SCALE_WIDTH`` and ``TRAINED``."""
        return (len(self.recipes) * (len(STATS) + SCALE_WIDTH) + len(MOMENTS)
                + (len(TRAINED) if self.trained is not None else 0))


@dataclass(frozen=True)
class Sections:
    """Which blocks follow the scalars in a step's host values, in this order: ``taken`` (the
    capture's), ``modules`` (an (8, M) activation block), ``swallowed`` (L), ``recheck``
    (2 + L + ORIGIN_SIZE), ``shadow`` (1 + 3·L), ``formats`` (modules · 3 · width), the
    optimizer values. ``layers``: the partials
    are sent as per-layer stats (a histogram-only step sends only the histogram).
    """

    num_layers: int
    taken: Taken | None = None
    layers: bool = False
    modules: int = 0
    swallowed: bool = False
    recheck: bool = False
    shadow: bool = False
    formats: FormatsSection | None = None
    optimizer_values: int = 0  # the last section: 0-d values the ``OptimizerSlots`` point to


@dataclass
class StepRecord:
    """What the training thread enqueues; ``to_wire`` runs on the sender thread."""

    seq: int
    step: int
    wall_time: float
    duration: float | None
    values: torch.Tensor | Parts  # float64 host tensor: SCALARS, then the ``sections`` blocks
    ready: Any  # torch.cuda.Event to wait on before reading ``values``, or None
    absent: frozenset[str]
    sections: Sections
    found_inf_from_scale: bool  # fallback: no found_inf tensors, infer from a scale decrease
    captured: str | None = None
    misuse: list[dict[str, str]] | None = None
    order: Sequence[int] | None = None  # layer indices in backward order
    clip: ClipHeuristic | None = None
    recheck_error: str | None = None  # the FP32 re-check ran and its closure raised this
    recheck_names: tuple[str, ...] = ()  # the re-check's hooked calls (its origin's index)
    shadow_error: str | None = None  # the shadow step ran and its closure raised this
    shadow_absent: frozenset[int] = frozenset()  # layers without a gradient on either side
    numels: torch.Tensor | None = None  # float64 (L,): the layers' sizes, for the fractions
    # No scaler (BF16, FP32): found_inf says whether a captured gradient held NaN or ±inf, read
    # from the capture here; nothing skips such a step (the optimizer applies it).
    found_inf_from_grads: bool = False
    # Without a loss scale: whether the optimizer skipped the step anyway, known on the host
    # (DeepSpeed's ZeRO optimizer skips a non-finite FP32 step, ``zero.py``); None: it applied it.
    skipped_host: bool | None = None
    # Under torch.distributed, on the CPU: the step's cross-rank reductions, still running when
    # the record was queued (``collective.py``); waited for here, on the sender thread.
    pending: Pending | None = None
    optimizers: tuple[OptimizerSlots, ...] | None = None
    # FSDP1: the capture read this rank's pieces of the layers, for its share's finiteness
    # only; no layer statistic or norm of a piece is sent as the layer's.
    pieces_only: bool = False

    def to_wire(self) -> dict[str, Any]:
        if self.ready is not None:
            self.ready.synchronize()
        reduced = True
        if self.pending is not None:
            try:
                self.pending.synchronize()
            except Exception:  # a peer stalled or the group broke: this step goes without
                reduced = False
        sec, pos = self.sections, len(SCALARS)
        # The capture's partials stay a tensor (``finish`` reads them in a dozen ops, not as
        # 8·L floats) unless the cross-rank packing mixes them with other values.
        keep = (NUM_COLUMNS * sec.num_layers if sec.taken is not None
                and sec.taken.kind is Kind.STATS and sec.taken.layout is None else 0)
        floats, table = _host_read(self.values, keep)
        v: list[Any] = floats  # read as Any: absent scalars become None
        head = dict(zip(SCALARS, v[: len(SCALARS)], strict=True))
        for name in self.absent:
            head[name] = None
        if self.found_inf_from_scale:
            head["found_inf"] = float(head["scale_after"] < head["scale_before"])
        done, ranks, pos = self._capture(v, pos, 0 if table is None else keep, table, reduced,
                                         head)
        activations = None
        if sec.modules:
            m = sec.modules
            activations = {s: v[pos + k * m : pos + (k + 1) * m] for k, s in enumerate(STAT_NAMES)}
            pos += len(STAT_NAMES) * m
        known = [] if ranks is None else [x for x in ranks.losses if x is not None]
        if ranks is not None and known and len(known) == len(ranks.losses):
            # The job's loss: the mean over the ranks, as DDP averages their gradients and the
            # frameworks log it (each rank's own is in ``ranks``); rank 0's own while a rank's
            # is missing. A plain sum: inf and -inf make NaN, where math.fsum would raise.
            head["loss"] = sum(known) / len(known)
        found_inf, skipped, nonfinite = self._flags(head, done, ranks)
        blocks = self._blocks(v, pos, skipped)
        misuse = list(self.misuse or [])
        if self.clip is not None and self.captured == "before_unscale" and not found_inf:
            norm, scale = head["grad_norm"], head["scale_before"]
            hit = self.clip.observe(None if norm is None or scale is None else norm * scale, scale)
            if hit is not None:
                misuse.append(hit)
        growth = head["growth_tracker"]
        layers = None
        if done is not None and done.layers is not None and sec.layers:
            layers = _layers_block(done.layers)
        histogram = None
        if done is not None and done.histogram is not None:
            histogram = {"min_exp": MIN_EXP, "max_exp": MAX_EXP, "counts": done.histogram}
        return wire.step_record(
            seq=self.seq,
            step=self.step,
            wall_time=self.wall_time,
            loss=head["loss"],
            scale_before=head["scale_before"],
            scale_after=head["scale_after"],
            growth_tracker=None if growth is None else round(growth),
            found_inf=found_inf,
            skipped=skipped,
            grad_norm=head["grad_norm"],
            lr=head["lr"],
            duration=self.duration,
            layers=layers,
            captured=self.captured,
            nonfinite=nonfinite,
            misuse=misuse or None,
            activations=activations,
            histogram=histogram,
            ranks=None if ranks is None else {
                "loss": [wire.encode_float(x) for x in ranks.losses],
                "nonfinite": list(ranks.nonfinite)},
            **blocks,
        )

    def _capture(self, v: list[Any], pos: int, keep: int, table: torch.Tensor | None,
                 reduced: bool, head: dict[str, Any]
                 ) -> tuple[Finished | None, Unpacked | None, int]:
        """The capture's block at ``pos`` of the host values (``keep`` of its values kept apart
        in ``table``): its statistics, the ranks' values unpacked from a cross-rank block
        (``reduced``: the reductions finished), and where the next block starts; sets
        ``head["grad_norm"]``."""
        taken, n = self.sections.taken, self.sections.num_layers
        if taken is None:
            return None, None, pos
        size = taken.size(n) - keep
        own: list[float] | None = v[pos : pos + size]
        ranks = None
        layout = taken.layout
        if layout is not None and own is not None:
            k = size - layout.sum_size - layout.max_size  # the parts kept as they were
            if reduced:
                ranks = unpack(own[:k], own[k : k + layout.sum_size],
                               own[k + layout.sum_size :], layout)
                own = ranks.parts
            else:
                own = None if layout.sharded else own[:k]
        done = None
        if own is not None and not self.pieces_only:
            numels = self.numels if self.numels is not None else torch.zeros(n, dtype=F64)
            done = finish(taken, own, numels, head["scale_before"], table)
            head["grad_norm"] = done.grad_norm
        else:  # a rank's piece missing, or FSDP1 flat pieces: unknown, never a part's
            head["grad_norm"] = None
        return done, ranks, pos + size

    def _flags(self, head: dict[str, Any], done: Finished | None, ranks: Unpacked | None
               ) -> tuple[bool, bool, list[dict[str, Any]] | None]:
        """(found_inf, skipped, the non-finite layers): from the scaler, or without one from
        the capture and the ranks; clears ``head["grad_norm"]`` where a float32 sum of squares
        overflowed."""
        if self.found_inf_from_grads:
            nonfinite = self._nonfinite(done) or None
            found_inf = nonfinite is not None or (
                ranks is not None and any(c for c in ranks.nonfinite if c))
            skipped = bool(self.skipped_host)
        else:
            found_inf = skipped = bool(head["found_inf"])
            nonfinite = self._nonfinite(done) if found_inf else None
        taken = self.sections.taken
        if (taken is not None and taken.float32_norms and not found_inf
                and head["grad_norm"] == math.inf):
            # No element was inf (the scaler checked them all), so this +inf is the float32 sum
            # of squares overflowing (a raw norm ≥ 1.8e19): the norm is unknown, not infinite.
            head["grad_norm"] = None
        return found_inf, skipped, nonfinite

    def _blocks(self, v: list[Any], pos: int, skipped: bool) -> dict[str, Any]:
        """The sampled blocks after the capture's and the activations', in ``Sections``' order,
        as ``wire.step_record``'s keywords: swallowed, recheck, shadow, formats, optimizers."""
        sec, n = self.sections, self.sections.num_layers
        swallowed = None
        if sec.swallowed:
            fractions, pos = v[pos : pos + n], pos + n
            if not skipped:  # a skipped step changes no parameter: nothing was swallowed
                swallowed = [x if math.isfinite(x) else None for x in fractions]
        size = 2 + n + ORIGIN_SIZE
        recheck = self._recheck(v[pos : pos + size] if sec.recheck else None)
        pos += size if sec.recheck else 0
        size = block_size(n)
        shadow = self._shadow(v[pos : pos + size] if sec.shadow else None)
        pos += size if sec.shadow else 0
        formats = None
        if sec.formats is not None:
            size = len(sec.formats.layers) * len(OPERANDS) * sec.formats.width
            formats = _formats_block(sec.formats, v[pos : pos + size])
            pos += size
        optimizers = _optimizers(self.optimizers, v[pos : pos + sec.optimizer_values])
        return {"swallowed": swallowed, "recheck": recheck, "shadow": shadow,
                "formats": formats, "optimizers": optimizers}

    def _recheck(self, block: list[float] | None) -> dict[str, Any] | None:
        """The wire ``recheck`` of the FP32 re-check's block (or its error); None if not run."""
        if self.recheck_error is not None:
            return {"status": "failed", "loss": None, "layers": [], "detail": self.recheck_error,
                    "origin": None}
        if block is None:
            return None
        loss = block[1] if block[0] else None
        codes, origin = block[2:-ORIGIN_SIZE], block[-ORIGIN_SIZE:]
        order = self.order if self.order is not None else range(len(codes))
        layers = [{"layer": i, "kind": "nan" if codes[i] == NAN_CODE else "inf"}
                  for i in order if codes[i] > 0]
        persisted = bool(layers) or (loss is not None and not math.isfinite(loss))
        return {"status": "persisted" if persisted else "vanished",
                "loss": wire.encode_float(loss), "layers": layers, "detail": None,
                "origin": self._origin(origin)}

    def _shadow(self, block: list[float] | None) -> dict[str, Any] | None:
        """The wire ``shadow`` of the FP32 shadow step's block (or its error); None if not run."""
        if self.shadow_error is not None:
            return {"status": "failed", "loss": None, "rel_err": None, "cosine": None,
                    "norm": None, "detail": self.shadow_error}
        if block is None:
            return None
        n = self.sections.num_layers
        absent = self.shadow_absent
        rel, cosine, norm = block[1 : 1 + n], block[1 + n : 1 + 2 * n], block[1 + 2 * n :]

        def per_layer(values: list[float]) -> list[Any]:
            return [None if i in absent else wire.encode_float(x) for i, x in enumerate(values)]

        return {"status": "ok", "loss": wire.encode_float(block[0]),
                "rel_err": per_layer(rel), "cosine": per_layer(cosine), "norm": per_layer(norm),
                "detail": None}

    def _origin(self, values: list[float]) -> dict[str, Any] | None:
        """The wire ``recheck.origin``; None when no module's output went non-finite."""
        found, index, input_finite, fmt = values
        if not found or not 0 <= index < len(self.recheck_names):
            return None
        return {"module": self.recheck_names[int(index)], "input_finite": bool(input_finite),
                "format": ORIGIN_FORMATS[int(fmt)]}

    def _nonfinite(self, done: Finished | None) -> list[dict[str, Any]] | None:
        """The non-finite layers in backward order; None when this step measured nothing."""
        kinds: dict[int, str] = {}
        if done is None:
            return None
        if done.layers is not None:
            if done.layers.sums[5] or done.layers.sums[6]:  # else no layer to look for
                nan_counts, inf_counts = done.layers.stats[5:7].tolist()
                for i, (nans, infs) in enumerate(zip(nan_counts, inf_counts, strict=True)):
                    if nans > 0 or infs > 0:
                        kinds[i] = "nan" if nans > 0 else "inf"
        else:
            for i, x in enumerate(done.norms or ()):
                if x is not None and not math.isfinite(x):
                    kinds[i] = "nan" if math.isnan(x) else "inf"
        order = self.order if self.order is not None else range(self.sections.num_layers)
        return [{"layer": i, "kind": kinds[i]} for i in order if i in kinds]


def _optimizers(slots: Sequence[OptimizerSlots] | None, values: Sequence[float]
                ) -> list[dict[str, Any]] | None:
    """The wire's ``optimizers``: each slot read from ``values`` (the optimizer section)."""
    if slots is None:
        return None

    def read(x: Slot | float | bool | None) -> Any:
        return values[x.index] if isinstance(x, Slot) else x

    return [{"skipped": None if (f := read(o.skipped)) is None else bool(f),
             "lr": [wire.encode_float(read(lr)) for lr in o.lr]} for o in slots]


def _formats_block(section: FormatsSection, values: Sequence[float]) -> dict[str, Any]:
    """Wire v7's ``formats``: each (module, operand) row split into its recipes' statistics
    (``values``, layers · operands · recipes · STATS), its moments (``operands``), its recipes'
    block scale exponents (``scales``, layers · operands · recipes · SCALE_WIDTH) and, with
    ``trained``, the amax and scale its recipe used (layers · operands each), packed."""
    stats, width = len(section.recipes) * len(STATS), section.width
    moments = stats + len(MOMENTS)
    exponents = moments + len(section.recipes) * SCALE_WIDTH
    recipe_part, moment_part, scale_part = array("d"), array("d"), array("d")
    amax, scale = array("d"), array("d")
    for start in range(0, len(values), width):
        recipe_part.extend(values[start : start + stats])
        moment_part.extend(values[start + stats : start + moments])
        scale_part.extend(values[start + moments : start + exponents])
        if section.trained is not None:
            amax.append(values[start + exponents])
            scale.append(values[start + exponents + 1])
    block = {"recipes": list(section.recipes), "layers": list(section.layers),
             "values": wire.packed(recipe_part.tobytes()),
             "operands": wire.packed(moment_part.tobytes()),
             "scales": wire.packed(scale_part.tobytes())}
    if section.trained is not None:
        block["trained"] = {"recipes": list(section.trained),
                            "amax": wire.packed(amax.tobytes()),
                            "scale": wire.packed(scale.tobytes())}
    return block


def _layers_block(host: HostStats) -> dict[str, Any]:
    """The wire ``layers`` of a capture's stats, packed straight from the ``(8, L)`` tensor's
    bytes in one C call; a non-finite fraction or count (never from a read) goes as JSON."""
    if math.isfinite(sum(host.sums[2:7])):
        stats = host.stats.nan_to_num(nan=math.nan, posinf=math.nan, neginf=math.nan)
        return wire.packed(ctypes.string_at(stats.data_ptr(), stats.nbytes))
    return wire.encode_stats(dict(zip(STAT_NAMES, host.stats.tolist(), strict=True)))


def _host_values(values: torch.Tensor | Parts) -> list[float]:
    """The record's values as one flat list: the host tensor's, or the parts' in order."""
    return _host_read(values, 0)[0]


def _host_read(values: torch.Tensor | Parts, keep: int) -> tuple[list[float], torch.Tensor | None]:
    """``_host_values`` less the ``keep`` values after the SCALARS, those as a tensor."""
    n = len(SCALARS)
    if isinstance(values, torch.Tensor):
        if not keep:
            return values.tolist(), None
        return values[:n].tolist() + values[n + keep :].tolist(), values[n : n + keep]
    out: list[float] = []
    kept = None
    for part in values:
        if isinstance(part, torch.Tensor):
            if keep and kept is None and len(out) == n and part.numel() == keep:
                kept = part.reshape(-1).to(F64)
            else:
                out += part.reshape(-1).tolist()
            continue
        # One by one: CPU tensors (no device to wait for), on the sender thread; cheaper than a
        # stack of 0-d tensors, and any dtype, shape or device
        # (docs/hook-cost.md#the-sender-threads-arithmetic).
        out += [t.item() for t in part]
    return out, kept  # kept None: no such block, every value is in the list


def layer_table(
    model: torch.nn.Module,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    full: Mapping[int, tuple[list[int], int]] | None = None,
) -> tuple[list[dict[str, Any]], list[torch.nn.Parameter]]:
    """The watched parameters and their wire table, in model order: ``name`` canonical
    (``names.canonical_names``; what ``include``/``exclude`` match), ``raw_name`` the model's.
    ``full``: real shapes and sizes of this rank's FSDP1 pieces, by id."""
    owner: dict[int, str] = {}
    for _, module in model.named_modules():
        for _, p in module.named_parameters(recurse=False):
            owner.setdefault(id(p), type(module).__name__)
    named = list(model.named_parameters())
    canonical = canonical_names([raw for raw, _ in named])
    table: list[dict[str, Any]] = []
    params: list[torch.nn.Parameter] = []
    for (raw, p), name in zip(named, canonical, strict=True):
        if not p.requires_grad or not selected(name, include, exclude):
            continue
        shape, numel = (full or {}).get(id(p), (list(p.shape), p.numel()))
        table.append({
            "index": len(table),
            "name": name,
            "raw_name": raw,
            "shape": shape,
            "dtype": str(p.dtype).removeprefix("torch."),
            "numel": numel,
            "module_type": owner.get(id(p), type(model).__name__),
        })
        params.append(p)
    return table, params


def optimizer_slots(
    view: Any, before: Mapping[str, Any], optimizers: Sequence[torch.optim.Optimizer],
    stepped: frozenset[int] | set[int], device: torch.device,
) -> tuple[tuple[OptimizerSlots, ...] | None, list[torch.Tensor]]:
    """Each optimizer's skip and every group's lr (the wire's ``optimizers``, for several
    optimizers or groups): host floats where the loop keeps them so, else 0-d copies read later."""
    each: Mapping[int, torch.Tensor] = before.get("found_inf_each", {})
    values: list[torch.Tensor] = []

    def slot(t: torch.Tensor) -> Slot:
        values.append(t if t.dim() == 0 else t.reshape(()))
        return Slot(len(values) - 1)

    slots = []
    for opt in optimizers:
        skipped: Slot | bool | None
        if id(opt) in each:
            skipped = slot(each[id(opt)])
        elif (decided := view.host_skip()) is not None:
            skipped = decided  # DeepSpeed: one decision for the step, known on the host
        elif view.present:  # a disabled scaler skips nothing; absent: not stepped
            skipped = False if not view.enabled() else None
        else:
            skipped = False if id(opt) in stepped else None
        lrs: list[Slot | float | None] = []
        for group in opt.param_groups:
            lr = group.get("lr")
            if isinstance(lr, torch.Tensor):  # a CPU lr reaches a CUDA record unsynced
                lr64 = lr.detach().to(torch.float64, copy=True)
                lrs.append(slot(lr64 if lr64.device == device else to_device(lr64, device)))
            else:
                lrs.append(None if lr is None else float(lr))
        slots.append(OptimizerSlots(skipped, tuple(lrs)))
    return tuple(slots), values


def one_copy(parts: Parts, device: torch.device) -> tuple[torch.Tensor, Any]:
    """Every part stacked into ONE float64 tensor (the stack promotes: no conversion op per
    part), then ONE host copy; on CUDA ``non_blocking`` into pinned memory, with an event."""
    flat = [(p if isinstance(p, torch.Tensor) else
             torch.stack([t.reshape(()).to(device) for t in p])).reshape(-1).to(device)
            for p in parts]
    values = flat[0] if len(flat) == 1 else torch.cat(flat)
    values = values.to(torch.float64)
    if values.is_cuda:
        host = torch.empty(values.shape, dtype=torch.float64, pin_memory=True)
        host.copy_(values, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return host, ready
    if values.device.type != "cpu":
        values = values.to("cpu")
    return values, None
