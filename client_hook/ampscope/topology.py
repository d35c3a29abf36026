"""Where the gradients live and who sends the run: resolved once, by ``resolve``, into one value.

Everything downstream (what the capture reads, whether it shares, whether anything is sent)
follows from the situation, decided once at ``watch()`` and never re-derived:

=============================== ===================================================================
single process                  ``.grad`` of every watched parameter, read whole; this process sends
DDP (a hook group)              the same; every rank contributes its loss and norms, rank 0 sends
FSDP2 / FSDP1 orig params       each rank's shard (``sharded``), merged through the group
FSDP1 flat parameters           ``pieces_only``: the pieces' finiteness in the share, no layer stats
DeepSpeed ZeRO 1-3 (``engine``) the partition's pieces (``ZeroEngine.reader``), merged as FSDP's
ZeRO-3 offloaded                ``pieces_only``: losses, scale and skips, no gradient statistics
a ZeRO engine's inner module    ``grads_off``: its ``.grad`` is empty
sharded without a full group    ``grads_off``: a shard alone would be sent as the layer's
=============================== ===================================================================
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ampscope import collective, zero
from ampscope.record import layer_table

__all__ = ["Topology", "process_group_ready", "resolve", "world_size"]

logger = logging.getLogger("ampscope")


@dataclass(frozen=True)
class Topology:
    """The resolved answer; ``enabled`` False where this rank records nothing at all."""

    model: torch.nn.Module  # what is watched: the engine's module for DeepSpeed
    layers: tuple[dict[str, Any], ...]  # the wire's layer table
    params: tuple[torch.nn.Parameter, ...]  # the watched parameters, in the table's order
    rank: int
    world_size: int
    enabled: bool
    engine: zero.ZeroEngine | None = None
    group: collective.Group | None = None
    sends: bool = True  # this rank sends the run (rank 0 of a group, or alone)
    sharded: bool = False  # each rank holds a shard/piece of every gradient
    grads_off: bool = False  # no gradient is read at all
    pieces_only: bool = False  # pieces read for the share's finiteness only, never as layers

    @property
    def device(self) -> torch.device:
        return self.params[0].device if self.params else torch.device("cpu")


def rank() -> int:
    return _distributed("RANK", "get_rank", 0)


def world_size() -> int:
    return _distributed("WORLD_SIZE", "get_world_size", 1)


def _distributed(variable: str, getter: str, default: int) -> int:
    """The launcher's environment variable (set before the process group exists), else the
    initialized process group's answer, else ``default``."""
    if variable in os.environ:
        try:
            return int(os.environ[variable])
        except ValueError:
            pass
    if process_group_ready():
        return int(getattr(torch.distributed, getter)())
    return default


def process_group_ready() -> bool:
    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def resolve(
    model: torch.nn.Module,
    scaler: torch.amp.GradScaler | None,
    *,
    enabled: bool,
    all_ranks: bool,
    dist_timeout_s: float,
    include: Sequence[str] | None,
    exclude: Sequence[str] | None,
) -> Topology:
    """The topology of this ``watch()``, joining the hook's group (waits ``dist_timeout_s``)."""
    this_rank, size = rank(), world_size()
    # A DeepSpeed engine (``zero.py``): its model's parameters are the layers, its ZeRO
    # optimizer the step cycle, its partitions the gradients.
    engine = zero.engine_of(model) if enabled else None
    if engine is not None:
        if scaler is not None:
            raise ValueError("DeepSpeed scales the loss itself: watch the engine without a "
                             "GradScaler, ampscope.watch(engine)")
        model = engine.module
    # The module inside a ZeRO engine, watched as a plain model (a framework's callback): its
    # .grad is empty, and reading it would send zeros as the layers' statistics.
    inside_engine = engine is None and enabled and zero.partitioned(model)
    if inside_engine:
        logger.warning("ampscope: these parameters belong to a DeepSpeed ZeRO engine, whose "
                       "gradients are not in .grad: gradient statistics are off; watch the "
                       "engine, ampscope.watch(engine)")
    flat = collective.flat_shards(model) if enabled else None
    full = engine.full_shapes() if engine is not None else (None if flat is None else flat.full)
    layers, params = layer_table(model, include, exclude, full)
    # One run per distributed job (``collective.py``): every rank takes part in the hook's
    # reductions, rank 0 sends. Without a group (no process group yet, or a rank that never
    # called watch()) rank 0 records alone and the others are inert, as enabled=False.
    group: collective.Group | None = None
    if enabled and not all_ranks and size > 1:
        if process_group_ready():
            device = params[0].device if params else torch.device("cpu")
            group = collective.join(this_rank, size, device, dist_timeout_s)
        if group is None and this_rank != 0:
            logger.info("ampscope: global rank %d of %d does not record (rank 0 does; "
                        "all_ranks=True records every rank)", this_rank, size)
            enabled = False
    # FSDP2's gradients are DTensor shards: without a group to merge them no rank holds a
    # layer's statistics, and a shard's would be sent as the layer's: none are taken (one
    # process's only shard is the whole gradient). A ZeRO job of one process reads each
    # gradient whole (its one piece), as an unsharded model is read.
    sharded = collective.sharded(params) or (flat is not None and not flat.flat_only) or (
        engine is not None and engine.has_pieces and size > 1)
    grads_off = (sharded and group is None and size > 1) or inside_engine
    if grads_off and enabled and not inside_engine:
        logger.warning("ampscope: the gradients are sharded (FSDP) and the ranks are not all "
                       "watched: gradient statistics are off (call watch() on every rank, "
                       "without all_ranks)")
    pieces_only = flat is not None and flat.flat_only
    if engine is not None and not engine.has_pieces:
        pieces_only = True  # no piece is read: the losses, scale and skips only
        logger.warning("ampscope: DeepSpeed ZeRO stage 3 with an offloaded optimizer: no "
                       "gradient statistics (the losses, the loss scale and the skipped steps "
                       "are recorded)")
    elif pieces_only:
        # Flat parameters are not layers: only their pieces' finiteness goes into the ranks'
        # shares; alone, nothing is read.
        grads_off = group is None
        logger.warning("ampscope: FSDP1 with use_orig_params=False keeps flat parameters: no "
                       "gradient statistics (the losses and the ranks' non-finite gradients "
                       "are recorded); use_orig_params=True or FSDP2 have them")
    return Topology(model=model, layers=tuple(layers), params=tuple(params), rank=this_rank,
                    world_size=size, enabled=enabled, engine=engine, group=group,
                    sends=group is None or this_rank == 0, sharded=sharded,
                    grads_off=grads_off, pieces_only=pieces_only)
