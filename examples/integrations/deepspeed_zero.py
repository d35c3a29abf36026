"""A DeepSpeed ZeRO-2 run watched by ampscope, on as many processes as the launcher starts:
``torchrun --nproc_per_node 2 examples/integrations/deepspeed_zero.py`` (or ``deepspeed``, or
``python`` for one process).

A tiny regression model in BF16 with two micro-batches per step, on the CPU (gloo) unless a
CUDA device is there, into the server at ``--server`` (``ampscope serve`` on the default
http://127.0.0.1:8765; with ``AMPSCOPE_MODE=offline`` the records go to the spool). The whole
integration is ``ampscope.watch(engine)`` on every rank: the job is one run, and the per-layer
statistics are those of the full gradient, merged from the ranks' ZeRO partitions.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

import ampscope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", default="http://127.0.0.1:8765")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511")):
        os.environ.setdefault(name, value)  # `python` alone: a job of one process
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 4))
    config = {
        "train_micro_batch_size_per_gpu": 32,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 2},
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    mon = ampscope.watch(engine, run="deepspeed-zero2", server=args.server, layer_every=10)
    gen = torch.Generator().manual_seed(int(os.environ["RANK"]))
    for _ in range(args.steps * 2):  # two micro-batches per optimizer step
        x = torch.randn(32, 16, generator=gen).to(engine.device, torch.bfloat16)
        y = torch.randn(32, 4, generator=gen).to(engine.device)
        loss = nn.functional.mse_loss(engine(x).float(), y)
        engine.backward(loss)
        engine.step()
    mon.close()
    print(f"rank {os.environ['RANK']}: {mon.stats().produced} records, run {mon.run_id}")


if __name__ == "__main__":
    main()
