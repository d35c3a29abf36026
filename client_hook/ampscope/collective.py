"""The ranks of one distributed job as one run: who takes part, the hook's own process group and
its asynchronous reductions (a service).

Rank 0 sends; every rank contributes its share of each captured step (``shards.py``: loss,
non-finite layers, and its shard's partials when sharded): ONE ``SUM`` all-reduce, plus ONE
``MAX`` on per-layer steps, on the hook's own process group, since collectives of one group must
be issued in the same order on every rank and training's must never meet the hook's. ``join``
is a rendezvous first (``new_group`` is collective: a rank that never calls ``watch()`` would
block the others): rank 0 decides through the store within ``timeout_s``, else records alone.

The training thread never waits (``async_op=True``); the sender thread does, bounded (a stuck
reduction costs the step its reduced blocks, never the record), and on CUDA the host copy queues
behind it. A disabled rank keeps issuing empty shares so its peers never wait; that step's
sharded statistics are then sent as unknown, never wrong.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch

__all__ = ["FlatShards", "Group", "Pending", "flat_shards", "join", "local", "sharded"]

logger = logging.getLogger("ampscope")

DEFAULT_TIMEOUT_S = 30.0
"""How long ``watch()`` waits, once, for every rank to call it (``Monitor(dist_timeout_s=)``)."""
WAIT_TIMEOUT_S = 60.0
"""How long the sender thread waits for one step's reduction before sending it without."""
_RETAINED = 64
"""Issued reductions a contributing rank keeps referenced until done (bounded)."""
_WATCHES = itertools.count()  # the n-th watch() of this process: the same n on every rank


def sharded(params: list[torch.nn.Parameter]) -> bool:
    """Whether any parameter is a DTensor (FSDP2, tensor parallel): its gradient is a shard."""
    if not torch.distributed.is_available():
        return False
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # a torch without DTensor has no FSDP2
        return False
    return any(isinstance(p, DTensor) for p in params)


@dataclass(frozen=True)
class FlatShards:
    """FSDP1 in a model: with ``use_orig_params=True`` each parameter is a 1-D view of this
    rank's disjoint piece, merged as FSDP2's shards; ``full``: id → (real shape, numel).
    ``flat_only``: some unit keeps flat parameters (no layers to merge)."""

    full: dict[int, tuple[list[int], int]]
    flat_only: bool


def flat_shards(model: torch.nn.Module) -> FlatShards | None:
    """The FSDP1 units of ``model`` (None: none), from flat parameters' private fields."""
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except Exception:  # a build whose distributed package lacks FSDP
        return None
    units = [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)]
    if not units:
        return None
    full: dict[int, tuple[list[int], int]] = {}
    flat_only = False
    for unit in units:
        flat = getattr(getattr(unit, "_handle", None), "flat_param", None)
        params = getattr(flat, "_params", None)
        shapes, numels = getattr(flat, "_shapes", None), getattr(flat, "_numels", None)
        if flat is None:
            continue  # a unit that wraps no parameter of its own
        if not (params and shapes and numels) or not (len(params) == len(shapes) == len(numels)):
            flat_only = True
            continue
        for p, shape, numel in zip(params, shapes, numels, strict=True):
            full[id(p)] = (list(shape), int(numel))
    return FlatShards(full, flat_only)


def local(t: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's part of a DTensor (its ``_local_tensor``: no op, no collective), or ``t``."""
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else t


@dataclass
class Pending:
    """One step's issued reductions: the buffers they reduce in place, and their works."""

    buffers: list[torch.Tensor]
    works: list[Any] = field(default_factory=list)

    def synchronize(self, timeout_s: float = WAIT_TIMEOUT_S) -> None:
        """Block the sender thread until the reductions are done (or ``TimeoutError``)."""
        deadline = time.monotonic() + timeout_s
        for work in self.works:
            while not work.is_completed():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"a cross-rank reduction did not finish in {timeout_s} s")
                time.sleep(0.001)
            work.wait()  # raises the collective's own error, if any

    def wait_stream(self) -> None:
        """CUDA: make the current stream wait for the reductions (no host wait: NCCL)."""
        for work in self.works:
            work.wait()

    def done(self) -> bool:
        return all(work.is_completed() for work in self.works)


class Group:
    """The hook's process group of one job and this rank's place in it."""

    def __init__(self, group: Any, rank: int, world_size: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self._retained: deque[Pending] = deque()

    def reduce(self, sums: torch.Tensor, maxes: torch.Tensor | None) -> Pending:
        """All-reduce ``sums`` with SUM and ``maxes`` (if any) with MAX, in place, async."""
        import torch.distributed as dist

        pending = Pending([sums] if maxes is None else [sums, maxes])
        pending.works.append(dist.all_reduce(sums, dist.ReduceOp.SUM, group=self.group,
                                             async_op=True))
        if maxes is not None:
            pending.works.append(dist.all_reduce(maxes, dist.ReduceOp.MAX, group=self.group,
                                                 async_op=True))
        return pending

    def retain(self, pending: Pending) -> None:
        """Keep a contributing rank's reduction referenced until it finished (bounded)."""
        while self._retained and self._retained[0].done():
            self._retained.popleft()
        if len(self._retained) >= _RETAINED:
            self._retained.popleft()
        self._retained.append(pending)

    def release(self, timeout_s: float) -> None:
        """At ``close``: let retained reductions finish (up to ``timeout_s``), then drop them."""
        deadline = time.monotonic() + timeout_s
        while self._retained and not all(p.done() for p in self._retained):
            if time.monotonic() > deadline:
                break
            time.sleep(0.001)
        self._retained.clear()

    def contribute_nothing(self, sum_size: int, max_size: int, device: torch.device) -> None:
        """Issue one step's reductions with an empty share (``shards.empty_share``'s sizes)."""
        from ampscope.shards import empty_share

        sums, maxes = empty_share(sum_size, max_size, device)
        self.retain(self.reduce(sums, maxes))


def join(rank: int, world_size: int, device: torch.device, timeout_s: float) -> Group | None:
    """The hook's group when every rank calls ``watch()`` within ``timeout_s`` (rank 0
    decides); None otherwise or without a store. Once per ``watch()``, on every such rank."""
    import torch.distributed as dist

    n = next(_WATCHES)
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception as exc:  # a private accessor: feature-checked
        logger.warning("ampscope: no store to meet the other ranks (%r); rank 0 records alone",
                       exc)
        return None
    prefix = f"ampscope/watch/{n}"
    store.add(f"{prefix}/joined", 1)
    decision_key = f"{prefix}/decision"
    if rank == 0:
        deadline = time.monotonic() + timeout_s
        while (joined := store.add(f"{prefix}/joined", 0)) < world_size:
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        agreed = joined >= world_size
        store.set(decision_key, "1" if agreed else "0")
        if not agreed:
            logger.warning(
                "ampscope: %d of %d ranks called watch() within %.0f s: rank 0 records alone "
                "(no per-rank losses; sharded gradients' statistics off). Call watch() on "
                "every rank.", joined, world_size, timeout_s)
    else:
        try:
            store.wait([decision_key], timedelta(seconds=2 * timeout_s + 5))
            agreed = store.get(decision_key) == b"1"
        except Exception:  # rank 0 never called watch(): this rank records nothing
            agreed = False
    if not agreed:
        return None
    backend = "nccl" if device.type == "cuda" else "gloo"
    # The default timeout (the default group's): a step's reduction waits on a peer no longer
    # than training's own collectives would; a shorter one would let NCCL's watchdog abort a
    # rank that merely waited for a slow peer (a checkpoint written by rank 0 alone).
    group = dist.new_group(backend=backend)
    return Group(group, rank, world_size)
