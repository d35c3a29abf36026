"""One rank of a 2-process job on the CPU (gloo), for ``test_collective``: it trains a few steps
under ``ampscope.watch`` and writes what its monitor recorded, with the truth to check it
against, as JSON.

Jobs (``argv[3]``), ``,``-joined, run one after the other in one pair of processes (each in a
process group of its own, its output to ``argv[2]`` with ``JOB`` replaced by the job's index): one
interpreter and one torch import per rank for many jobs. A job's modes, ``+``-joined: ``ddp``,
``fsdp2`` (``fully_shard`` per layer and on the model), ``fsdp1`` (``FullyShardedDataParallel``,
``use_orig_params=True``) or ``fsdp1flat`` (``use_orig_params=False``); ``all``
(``all_ranks=True``); ``noscaler`` (no GradScaler: ``record_loss``) or ``shardedscaler`` (FSDP1's
``ShardedGradScaler``); ``nan`` (rank 1's loss is NaN at step 2); ``break`` (rank 1's hook fails in
every capture and disables itself); ``alone`` (rank 1 never calls ``watch()``); ``server=URL``
(send to that server instead of a ``MemorySender``).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import ampscope
from ampscope import wire
from ampscope.histogram import exponent_histogram
from ampscope.transport import MemorySender
from tests.client_hook.reference import layer_stats, unpack
from tests.support.distributed import leave

STEPS = 4


def reference(grads: list[torch.Tensor], scale: torch.Tensor | float, scaled: bool
              ) -> dict[str, Any]:
    """The full gradients' statistics as one unsharded rank would compute them."""
    stats = layer_stats(grads, scale, scaled, "fp16" if scaled else "bf16")
    norm, rows = unpack(stats.tolist(), len(grads))
    counts = exponent_histogram(grads, scale, [scaled] * len(grads), None)
    return {"grad_norm": norm, "layers": wire.encode_stats(rows),
            "histogram": counts.reshape(len(grads), -1).tolist()}


def recorded(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """What rank 0 sent, for the tests: the run, the layer table's names and (shape, numel),
    and every record (None and [] on a rank that sent nothing)."""
    first = payloads[0] if payloads else None
    return {
        "run": first["run"] if first else None,
        "layers": [layer["name"] for layer in first["layers"]] if first else None,
        "shapes": [(layer["shape"], layer["numel"]) for layer in first["layers"]]
        if first else None,
        "records": [r for p in payloads for r in p["records"]],
    }


def main(store: str, out: str, jobs: list[str]) -> None:
    for i, job in enumerate(jobs):
        run(f"{store}-{i}", out.replace("JOB", str(i)), set(job.split("+")))


def run(store: str, out: str, mode: set[str]) -> None:
    server = next((m.removeprefix("server=") for m in mode if m.startswith("server=")), None)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=int(os.environ["WORLD_SIZE"]))
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    sharded = "fsdp2" in mode
    model: nn.Module
    fsdp1 = "fsdp1" in mode or "fsdp1flat" in mode
    if fsdp1:
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(base, use_orig_params="fsdp1flat" not in mode,
                                         device_id=torch.device("cpu"))
    elif sharded:
        from torch.distributed.fsdp import fully_shard

        for layer in base:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(base)
        model = base
    else:
        model = nn.parallel.DistributedDataParallel(base)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler: torch.amp.GradScaler | None = None
    if "shardedscaler" in mode:  # FSDP1's: found_inf all-reduced across the ranks
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        scaler = ShardedGradScaler("cpu")
    elif "noscaler" not in mode:
        scaler = torch.amp.GradScaler("cpu")
    sender = MemorySender()
    mon = None
    if not ("alone" in mode and rank == 1):
        mon = ampscope.watch(model, scaler, opt, sender=None if server else sender,
                             server=server, run="dist",
                             all_ranks="all" in mode, activation_every=0, layer_every=1,
                             histogram_every=2, dist_timeout_s=3)
    if "break" in mode and rank == 1 and mon is not None:
        def fail(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("broken on purpose")
        for read in ("raw_norms", "checked_norms", "partials"):  # every read of the capture
            setattr(mon._stats, read, fail)
    gen = torch.Generator().manual_seed(rank)
    losses, truth = [], []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        loss = ((model(x) - y) ** 2).mean()
        if "nan" in mode and rank == 1 and step == 2:
            loss = loss * math.nan
        losses.append(wire.encode_float(loss.item()))
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            (mon.record_loss(loss) if mon is not None else loss).backward()
        full = None
        if sharded:  # on both ranks, before the hook's capture: the full gradients
            full = [p.grad.full_tensor() for p in model.parameters()]  # type: ignore[union-attr]
        elif "fsdp1" in mode:
            with FullyShardedDataParallel.summon_full_params(model, with_grads=True):
                full = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
        if full is not None:
            scale = scaler._scale if scaler is not None and scaler._scale is not None else 1.0
            truth.append(reference(full, scale, scaler is not None))
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
    if mon is not None:
        mon.close()
    payloads = sender.payloads()
    Path(out).write_text(json.dumps({
        "rank": rank,
        "state": None if mon is None else mon.state.value,
        "produced": 0 if mon is None else mon.stats().produced,
        "errors": 0 if mon is None else mon.stats().internal_errors,
        "acknowledged": 0 if mon is None else mon.stats().acknowledged,
        "run_id": None if mon is None else mon.run_id,
        **recorded(payloads),
        "losses": losses,
        "truth": truth,
    }))
    dist.barrier()  # both ranks done with the store before either tears it down
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3].split(","))
    leave()  # the exit status is the work's, not torch's teardown's
