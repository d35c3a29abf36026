"""The hook's GPU check (#13), one process: sync-free, its cost, its copy path, FSDP2.

On a CUDA machine, from the repository root (the hook needs torch alone; the FSDP2 check's
truth, ``tests/client_hook/reference.py``, imports NumPy and pytest too)::

    PYTHONPATH=client_hook python bench/gpu_check.py --out OUT.json

1. **Syncs and records.** ``--steps`` (200) steps of a small GPT-style model (token and position
   embeddings, pre-norm causal transformer blocks, a tied LM head) under FP16 autocast with a
   ``GradScaler`` and ``ampscope.watch`` at per-layer statistics every step, the hook's own
   training-thread code run under ``torch.cuda.set_sync_debug_mode("error")`` (a host sync there
   raises inside the hook and is counted as an internal error: the check wants 0). The whole step
   cannot run under "error": ``GradScaler.step`` reads ``found_inf`` itself. Every step must be
   produced and delivered (``MemorySender``).
2. **The copy path.** Every record the training thread builds is checked: its values one pinned
   host tensor with the CUDA event the sender thread waits on (``cycle._one_copy``).
3. **Cost.** Interleaved segments (``base hook base`` per round, ``--rounds`` x ``--segment``
   steps, a second model without the hook as the baseline, in the same process): the median of
   the rounds' median-step ratios at the default cadence. Inside the clock: the step from
   ``zero_grad`` to ``update()`` and a ``cuda.synchronize()``; outside: the segment's flush.
4. **FSDP2, one process.** ``fully_shard`` over a one-rank process group (NCCL; gloo with
   ``--device cpu``), ``--fsdp-steps`` steps with the hook: the gradients are DTensors, each
   step's per-layer statistics and norm must equal those of the local (= full) gradients.

``--device cpu`` runs the same checks on the CPU (no sync to make; bf16 autocast, the ratio of
a CPU) so that ``make test`` keeps this script working (``tests/bench/test_gpu_check.py``).
Prints a JSON summary, and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests' twins

import torch
from hook_overhead import Block  # type: ignore[import-not-found]
from hook_sweep import strict_sync  # type: ignore[import-not-found]
from torch import nn

import ampscope
from ampscope.transport import MemorySender
from tests.client_hook.reference import layer_stats, unpack


class Gpt(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq),
                             persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x, self.mask)
        out: torch.Tensor = self.head(self.ln(x))
        return out


def make_model(args: argparse.Namespace, device: torch.device) -> Gpt:
    torch.manual_seed(0)
    return Gpt(args.vocab, args.d, args.layers, 4, args.seq).to(device)


class Loop:
    def __init__(self, model: nn.Module, args: argparse.Namespace, device: torch.device,
                 scaler: bool = True) -> None:
        self.model, self.device = model, device
        self.opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        self.scaler = torch.amp.GradScaler(device.type, init_scale=2.0**12) if scaler else None
        self.dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        gen = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen).to(
            device)

    def step(self) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=self.dtype):
            logits = self.model(self.ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                           self.ids[:, 1:].flatten())
        if self.scaler is None:
            loss.backward()
            self.opt.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        return loss


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_syncs_and_copies(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    loop = Loop(make_model(args, device), args, device)
    sender = MemorySender()
    mon = ampscope.watch(loop.model, loop.scaler, loop.opt, sender=sender, layer_every=1,
                         activation_every=50, histogram_every=100, fused=False)
    copies = {"pinned_with_event": 0, "other": 0}
    build = mon._cycle.build

    def spy(*a: Any, **k: Any) -> Any:
        record = build(*a, **k)
        pinned = isinstance(record.values, torch.Tensor) and record.values.is_pinned()
        copies["pinned_with_event" if pinned and record.ready is not None else "other"] += 1
        return record

    mon._cycle.build = spy  # type: ignore[method-assign]
    if device.type == "cuda":
        for name in ("capture", "end", "on_scale"):  # the step seam's calls (``step.py``)
            setattr(mon._cycle, name, strict_sync(getattr(mon._cycle, name)))
        mon._view.before_update = strict_sync(mon._view.before_update)  # type: ignore[method-assign]
    for _ in range(args.steps):
        loop.step()
    sync(device)
    mon.close(timeout=60)
    stats = mon.stats()
    records = [r for p in sender.payloads() for r in p["records"]]
    return {"steps": args.steps, "produced": stats.produced, "acknowledged": stats.acknowledged,
            "records": len(records), "internal_errors": stats.internal_errors,
            "with_layers": sum(r["layers"] is not None for r in records),
            "copies": copies}


def segment(loop: Loop, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loop.step()
        sync(loop.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_cost(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    base, hooked = Loop(make_model(args, device), args, device), Loop(
        make_model(args, device), args, device)
    mon = ampscope.watch(hooked.model, hooked.scaler, hooked.opt, sender=MemorySender())
    for loop in (base, hooked):
        segment(loop, 3)  # warm-up: kernels, allocator, the hook's plans
    ratios, base_ms = [], []
    for _ in range(args.rounds):
        before = segment(base, args.segment)
        got = segment(hooked, args.segment)
        mon.flush(60)  # the sender's work on this segment, outside the clock
        after = segment(base, args.segment)
        ratios.append(got / statistics.median([before, after]))
        base_ms.append(1e3 * statistics.median([before, after]))
    mon.close(timeout=60)
    return {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "base_step_ms": statistics.median(base_ms),
            "rounds": args.rounds, "segment_steps": args.segment,
            "load": os.getloadavg()[0]}


def check_fsdp2(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    os.environ.update(RANK="0", WORLD_SIZE="1")
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=f"file://{Path(tmp) / 'store'}", rank=0,
                                world_size=1)
        try:
            model = make_model(args, device)
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            loop = Loop(model, args, device, scaler=False)
            sender = MemorySender()
            mon = ampscope.watch(model, None, loop.opt, sender=sender, layer_every=1,
                                 activation_every=0)
            truth: list[dict[str, Any]] = []
            params = [p for p in model.parameters() if p.requires_grad]

            def before_step(opt: Any, *a: Any) -> None:  # registered after the hook's own
                grads = [p.grad.full_tensor() for p in params]  # type: ignore[union-attr]
                norm, rows = unpack(layer_stats(grads, 1.0, False, "bf16").tolist(), len(grads))
                truth.append({"grad_norm": norm, "l2": rows["l2"], "amax": rows["amax"]})

            loop.opt.register_step_pre_hook(before_step)
            for _ in range(args.fsdp_steps):
                loop.step()
            mon.close(timeout=60)
            records = [r for p in sender.payloads() for r in p["records"]]
        finally:
            dist.destroy_process_group()

    def same(a: Any, b: float) -> bool:
        return isinstance(a, float) and math.isclose(a, b, rel_tol=1e-6)

    equal = sum(
        same(r["grad_norm"], t["grad_norm"]) and r["layers"] is not None
        and all(same(a, b) for a, b in zip(r["layers"]["l2"], t["l2"], strict=True))
        and r["layers"]["amax"] == t["amax"]
        for r, t in zip(records, truth, strict=True))
    return {"steps": args.fsdp_steps, "records": len(records), "equal_to_full": equal,
            "internal_errors": mon.stats().internal_errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--segment", type=int, default=30)
    parser.add_argument("--fsdp-steps", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: this is the GPU check (--device cpu runs it on the CPU)")
    summary: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "parameters": sum(p.numel() for p in make_model(args, device).parameters()),
    }
    summary["syncs_and_copies"] = check_syncs_and_copies(args, device)
    summary["cost"] = measure_cost(args, device)
    summary["fsdp2"] = check_fsdp2(args, device)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
