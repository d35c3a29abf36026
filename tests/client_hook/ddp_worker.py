"""One rank of a 2-process DDP job on the CPU (gloo), for ``test_monitor.TestDistributed``: it
trains a few steps under ``ampscope.watch`` and writes what its monitor recorded as JSON."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import ampscope
from ampscope.transport import MemorySender


def main(store: str, out: str, all_ranks: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}",
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(),
                                                              nn.Linear(16, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    sender = MemorySender()
    mon = ampscope.watch(model, scaler, opt, sender=sender, run="ddp", all_ranks=all_ranks,
                         activation_every=0)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(4):
        opt.zero_grad()
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        scaler.scale(((model(x) - y) ** 2).mean()).backward()
        scaler.step(opt)
        scaler.update()
    mon.close()
    payloads = sender.payloads()
    Path(out).write_text(json.dumps({
        "rank": dist.get_rank(), "state": mon.state.value, "produced": mon.stats().produced,
        "steps": [r["step"] for p in payloads for r in p["records"]],
        "run_rank": payloads[0]["run"]["rank"] if payloads else None,
        "layers": [layer["name"] for layer in payloads[0]["layers"]] if payloads else None,
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] == "all")
