"""One rank of a 2-process DeepSpeed job on the CPU (gloo), for ``test_deepspeed``: a tiny model
trained a few optimizer steps through a real ZeRO engine under ``ampscope.watch(engine)``; it
writes what its monitor recorded and the truth to check it against, as JSON.

Modes (``argv[2]``), ``+``-joined: ``stage0`` (only what ``watch`` says), ``stage1``, ``stage2`` or
``stage3``; ``fp16``, ``bf16`` or
``fp32``; ``nan`` (rank 1's loss is NaN at its third micro-batch, inside optimizer step 1);
``torchstyle`` (``mon.record_loss(loss).backward()`` instead of ``engine.backward(loss)``);
``accelerate`` (FP32 only: the engine from ``Accelerator(deepspeed_plugin=...)``, watched as
``watch(model, accelerator.scaler, optimizer)`` with the prepared pair; no truth recorded);
``module`` (the engine's module watched instead of the engine, with its ZeRO optimizer);
``server=URL`` (send to that server instead of a ``MemorySender``). Two micro-batches per step.
The JSON goes to ``argv[1]`` with ``{}`` replaced by the rank.

Several jobs in one launch: ``argv[2]`` may list modes joined by ``,``; each runs in turn in the
same two processes (one process group, a barrier between them) and writes to ``argv[1]`` with
``MODE`` replaced by its mode. A launch costs each rank an interpreter, torch, DeepSpeed and the
process group (~3 s of CPU): the test module's 12 jobs share two. ``accelerate`` goes last (its
``AcceleratorState`` is a process-wide singleton), stage 3 in a launch of its own (see
``test_deepspeed.JOBS``).

FP16: DeepSpeed refuses FP16 on a CPU without AVX-512 FP16 units (``is_fp16_supported``), a
hardware check of the accelerator, not of the math: torch computes FP16 on any CPU, slowly. The
worker answers that one check with True; nothing else is replaced.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.utils import safe_get_full_grad
from torch import nn

import ampscope
from ampscope import wire, zero
from ampscope.transport import MemorySender
from tests.client_hook.dist_worker import recorded, reference
from tests.support.distributed import capture_logs, leave, without_deepspeed_shm_build

STEPS = 4
MICRO = 2


def main(out: str, mode: set[str]) -> None:
    server = next((m.removeprefix("server=") for m in mode if m.startswith("server=")), None)
    rank = int(os.environ["RANK"])
    precision = next(p for p in ("fp16", "bf16", "fp32") if p in mode)
    stage = next(int(m.removeprefix("stage")) for m in mode if m.startswith("stage"))
    if precision == "fp16":
        type(get_accelerator()).is_fp16_supported = lambda self: True
    without_deepspeed_shm_build()
    deepspeed.init_distributed(dist_backend="gloo")  # once per process: later calls return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": MICRO,
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
        "fp16": {"enabled": precision == "fp16", "initial_scale_power": 10, "hysteresis": 1},
        "bf16": {"enabled": precision == "bf16"},
        "steps_per_print": 10**9,
    }
    accelerator = None
    logged: list[str] = []
    if "accelerate" in mode:  # the engine from accelerate's DeepSpeed plugin, as its users make it
        from accelerate import Accelerator  # type: ignore[import-untyped]
        from accelerate.utils import DeepSpeedPlugin  # type: ignore[import-untyped]

        config.pop("optimizer")
        accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config),
                                  gradient_accumulation_steps=MICRO)
        engine, prepared = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), 0.01))
        optimizer = engine.optimizer
    else:
        engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config,
                                                       model_parameters=model.parameters())
    sender = MemorySender()
    if stage == 0:  # refused: what watch() says
        try:
            ampscope.watch(engine, sender=sender)
        except ValueError as exc:
            Path(out.format(rank)).write_text(json.dumps({"error": str(exc)}))
        return
    options: dict[str, Any] = {
        "sender": None if server else sender, "server": server, "run": "ds",
        "activation_every": 0, "layer_every": 1, "histogram_every": 2, "dist_timeout_s": 10}
    if accelerator is not None:  # the README's accelerate line, as it is
        mon = ampscope.watch(engine, accelerator.scaler, prepared, **options)
    elif "module" in mode:  # the module inside the engine, as a framework's callback has it
        with capture_logs() as logged:
            mon = ampscope.watch(engine.module, None, optimizer, **options)
    else:
        mon = ampscope.watch(engine, **options)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    gen = torch.Generator().manual_seed(rank)
    losses: list[Any] = []
    truth: list[dict[str, Any]] = []
    micro = 0
    for _ in range(STEPS):
        step_loss = 0.0
        for _ in range(MICRO):
            x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
            loss = ((engine(x.to(dtype)).float() - y) ** 2).mean()
            if "nan" in mode and rank == 1 and micro == 2:
                loss = loss * math.nan
            step_loss += loss.item() / MICRO
            if accelerator is not None:  # engine.backward, then engine.step: no truth between
                with accelerator.accumulate(engine):
                    accelerator.backward(loss)
                micro += 1
                continue
            if "torchstyle" in mode:
                mon.record_loss(loss).backward()
            else:
                engine.backward(loss)
            if engine.is_gradient_accumulation_boundary():
                scale = float(optimizer.loss_scale)
                # Every rank takes part: safe_get_full_grad all-reduces the pieces.
                full = [safe_get_full_grad(p).float() for p in model.parameters()]
                truth.append({**reference(full, scale, precision == "fp16"),
                              "scale_before": scale})
            engine.step()
            micro += 1
        losses.append(wire.encode_float(step_loss))
        if truth:
            truth[-1].update(scale_after=float(optimizer.loss_scale),
                             skipped=bool(optimizer.overflow))
    # What users do while watched: a DeepSpeed checkpoint (every rank) and the module's weights
    # saved (the module itself does not pickle under DeepSpeed, watched or not: its own hooks).
    saved = engine.save_checkpoint(str(Path(out).parent / "checkpoint"), tag="last")
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    mon.close()
    Path(out.format(rank)).write_text(json.dumps({
        "rank": rank,
        "state": mon.state.value,
        "errors": mon.stats().internal_errors,
        "produced": mon.stats().produced,
        "run_id": mon.run_id,
        **recorded(sender.payloads()),
        "losses": losses,
        "truth": truth,
        "partitioned": [zero.partitioned(model), zero.partitioned(nn.Linear(2, 2))],
        "saved": [bool(saved), buffer.tell() > 0],
        "warnings": logged,
        "wrapped": [name for name in ("backward",) if name in vars(engine)]
        + [name for name in ("step",) if name in vars(optimizer)],
    }))
    dist.barrier()


if __name__ == "__main__":
    for job in sys.argv[2].split(","):
        main(sys.argv[1].replace("MODE", job), set(job.split("+")))
    if dist.is_initialized():
        dist.destroy_process_group()
    leave()  # the exit status is the work's, not torch's teardown's
