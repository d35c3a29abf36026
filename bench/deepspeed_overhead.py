"""What ``ampscope.watch(engine)`` costs a DeepSpeed ZeRO run: step time with / without it,
interleaved.

Inside the clock: every optimizer step after ``--warmup`` untimed ones, from one
``engine.step()`` return to the next (forward, ``engine.backward``, DeepSpeed's reduction,
overflow check and optimizer step, and with ampscope the hook's wrappers, its capture of the ZeRO
partitions' pieces, its record, and whatever its sender thread takes from the training thread's
cores). Outside it: ``deepspeed.initialize`` and ``watch()``/``close()`` (each segment is a new
engine, so a new run), and the background compile of the fused per-layer kernel (a job of one
process reads whole gradients, so it is fused as a plain model is), waited for at the end of the
warm-up.

One process (a job of one rank: no cross-rank reduction; two processes on this 2-core machine
would measure their contention, not the hook). Method as ``integration_overhead.py``: rounds of
``base hook base`` (and ``base control base``, the noise floor), a round's ratio is the segment's
median step over the median of the two baselines beside it; the report gives the median of the
rounds' ratios and their range, with the machine's load average. Records go to ``MemorySender``.

Model: an MLP of ``--width`` (1.19M parameters at 768), batches of 64, AdamW, ZeRO ``--stage``
(default 2) in ``--precision`` fp32 or bf16; the hook at its defaults (per-layer statistics
every 10th step, activations every 50th, histograms every 100th).

    .venv/bin/python bench/deepspeed_overhead.py --rounds 6 --steps 60
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
import warnings

import torch
from torch import nn

import ampscope
from ampscope.transport import MemorySender


def mlp(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))


def segment(args: argparse.Namespace, hooked: bool) -> tuple[float, float | None]:
    """One new engine trained ``warmup + steps`` steps: (median timed step in seconds, the
    fused kernel's compile time when one was waited for)."""
    import deepspeed

    model = mlp(args.width)
    config = {
        "train_micro_batch_size_per_gpu": 64,
        "zero_optimization": {"stage": args.stage},
        "bf16": {"enabled": args.precision == "bf16"},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    mon = ampscope.watch(engine, sender=MemorySender()) if hooked else None
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    total = args.warmup + args.steps + 1
    x, y = torch.randn(64 * total, 8, dtype=dtype), torch.randn(64 * total, 4)
    times: list[float] = []
    compile_s = None
    last = None
    for i in range(total):
        if i == args.warmup and mon is not None:
            seconds = [s for _, s, _ in mon._stats.compiles(timeout=900) if s is not None]
            compile_s = sum(seconds) if seconds else None
            last = time.perf_counter()
        loss = ((engine(x[64 * i : 64 * (i + 1)]).float() - y[64 * i : 64 * (i + 1)]) ** 2).mean()
        engine.backward(loss)
        engine.step()
        now = time.perf_counter()
        if last is not None and i > args.warmup:
            times.append(now - last)
        last = now
    if mon is not None:
        mon.close()
    engine.destroy()
    return statistics.median(times), compile_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--stage", type=int, default=2, choices=[1, 2, 3])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    args = parser.parse_args()
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29531"),
                        ("DS_ACCELERATOR", "cpu")):  # a job of one process, on the CPU
        os.environ.setdefault(name, value)
    import deepspeed  # after DS_ACCELERATOR: it picks its accelerator on import

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    # Not its shared-memory all-reduce: a C++ build on a machine's first run (~60 s of CPU) for
    # inference only; ZeRO trains through torch.distributed either way.
    from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder
    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    deepspeed.init_distributed(dist_backend="gloo")
    params = sum(p.numel() for p in mlp(args.width).parameters())
    print(f"DeepSpeed {deepspeed.__version__}, torch {torch.__version__}, {params / 1e6:.2f}M "
          f"parameters, ZeRO stage {args.stage}, {args.precision}, {args.rounds} rounds x "
          f"{args.steps} steps (+{args.warmup} warm-up)")
    ratios: dict[str, list[float]] = {"ampscope": [], "control": []}
    base_ms: list[float] = []
    compiles: list[float] = []
    for r in range(args.rounds):
        before, _ = segment(args, False)
        for name in (["ampscope", "control"] if r % 2 == 0 else ["control", "ampscope"]):
            got, compile_s = segment(args, name == "ampscope")
            if compile_s is not None:
                compiles.append(compile_s)
            after, _ = segment(args, False)
            ratios[name].append(got / statistics.median([before, after]))
            base_ms.append(1e3 * statistics.median([before, after]))
            before = after
        print(f"round {r + 1}: ampscope {ratios['ampscope'][-1]:.3f}, control "
              f"{ratios['control'][-1]:.3f}, load {os.getloadavg()[0]:.1f}", flush=True)
    # The fused kernel compiles once per layout and process (the later runs reuse it).
    print(f"\nno-hook step: {statistics.median(base_ms):.2f} ms; fused-kernel compile "
          f"(background, once): {' '.join(f'{c:.1f}' for c in sorted(set(compiles)))} s")
    for name, values in ratios.items():
        print(f"{name:9s} median {statistics.median(values):.3f}  "
              f"(min {min(values):.3f}, max {max(values):.3f})")


if __name__ == "__main__":
    main()
