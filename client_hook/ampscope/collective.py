"""The ranks of one distributed job as one run: who takes part, the hook's own process group and
its asynchronous reductions (a service).

Under ``torch.distributed`` every rank's monitor takes part in one run: rank 0 sends the records,
every rank contributes its share of each step through collectives: its loss and its non-finite
layers (the ``ranks`` block, ``shards.py``) and, when the gradients are sharded (FSDP2 DTensor
shards), the per-layer partials of its shard, merged into the full gradient's. Per captured step
that is ONE ``SUM`` all-reduce, plus ONE ``MAX`` on steps with per-layer statistics; a step that
captures nothing reduces nothing. FSDP1 with ``use_orig_params=True`` merges as FSDP2 does, its
pieces being disjoint parts of each layer (``flat_shards``); with flat parameters only, a rank's
share is its loss and its pieces' finiteness.

Why a process group of its own. Collectives on one group must be issued in the same order on every
rank; training's own (DDP's bucket all-reduces, FSDP's all-gathers and reduce-scatters) must never
meet one of the hook's. The hook's group (``new_group``, the default group's backend: gloo for CPU
tensors, NCCL for CUDA ones) keeps the two streams apart: whatever happens to the hook's
collectives, training's are untouched.

Why a rendezvous (``join``). ``new_group`` is itself collective: a rank that never calls
``watch()`` (a loop that watches on rank 0 only, as ampscope's own docs once said) would leave the
others blocked in it. ``join`` first asks, through the default group's key-value store and within
``timeout_s``, whether every rank is there; rank 0 decides and publishes the decision, so all ranks
act on one answer. Without it, rank 0 records alone, as before.

Why the training thread never waits. ``all_reduce(async_op=True)`` returns at once: gloo runs it on
its own threads, NCCL on its own stream. The sender thread waits for it (``Pending.synchronize``,
bounded: a reduction that does not finish leaves that step without its reduced blocks, never a
lost record); on CUDA the step's one host copy is queued behind it (``Pending.wait_stream``: the
stream waits, the host does not).

A rank whose hook disabled itself (internal errors) keeps contributing: ``Group.contribute_nothing``
issues the step's collectives with an empty share, so its peers never wait for it; its column of
the ranks block then says "no share" (``shards.RANK_ROWS``), and such a step's sharded statistics
are sent as unknown rather than as a wrong number.
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
"""Issued reductions a contributing rank keeps referenced until they finish (gloo, NCCL keep the
buffers alive through the work; the bound keeps a stalled peer from growing the list)."""
_WATCHES = itertools.count()  # the n-th watch() of this process: the same n on every rank


def sharded(params: list[torch.nn.Parameter]) -> bool:
    """Whether any parameter is a DTensor (FSDP2 ``fully_shard``, tensor parallel): its
    gradient is then this rank's shard of the full one."""
    if not torch.distributed.is_available():
        return False
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # a torch without DTensor has no FSDP2
        return False
    return any(isinstance(p, DTensor) for p in params)


@dataclass(frozen=True)
class FlatShards:
    """FSDP1 (``FullyShardedDataParallel``) in a model. With ``use_orig_params=True`` each
    original parameter is a 1-D view of this rank's piece of it (possibly empty, its gradient
    then None): pieces of one layer on different ranks are disjoint, so they merge as FSDP2's
    shards do, and ``full`` gives each one's real shape and size (id of the parameter → shape,
    numel) for the layer table. ``flat_only``: some unit keeps its flat parameters
    (``use_orig_params=False``): there are no layers to merge."""

    full: dict[int, tuple[list[int], int]]
    flat_only: bool


def flat_shards(model: torch.nn.Module) -> FlatShards | None:
    """The FSDP1 units of ``model`` (None: there are none), read from their flat parameters'
    ``_params``/``_shapes``/``_numels`` (private, feature-checked: a unit without them counts as
    ``flat_only``)."""
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
        """Block (the sender thread) until the reductions finished; ``TimeoutError`` after
        ``timeout_s``. On CUDA the buffers are then read by a blocking copy."""
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
        """At ``close``: let the retained reductions finish (up to ``timeout_s``), then drop
        them, so that no pending work outlives the monitor into the interpreter's exit."""
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
    """The hook's group when every rank of the default group calls ``watch()`` within
    ``timeout_s`` (rank 0 decides, module docstring); None otherwise, or when the default group
    has no store to ask. Called once per ``watch()``, on every rank that calls it."""
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
