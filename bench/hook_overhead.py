"""Hook overhead on the CPU reference loop: median step time with / without ampscope, interleaved.

Prints ratios against a baseline measured in the same run (DESIGN.md §8 budgets: default cadence
≤ 1.02x, per-layer stats every step ≤ 1.10x) and the enqueue p50/p99 on the training thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import ampscope
from ampscope.transport import MemorySender


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


def make_model(d: int = 128) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, d), *[Block(d, 4) for _ in range(4)], nn.Linear(d, 10))


def timed_steps(model: nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                x: torch.Tensor, y: torch.Tensor, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x).float().mean(1)
        loss = nn.functional.cross_entropy(out, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300, help="timed steps per configuration")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds")
    args = parser.parse_args()
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32, 32), torch.randint(0, 10, (16,))
    per = args.steps // args.rounds
    results: dict[str, list[float]] = {"none": [], "default": [], "every": []}
    enqueue_ns: list[int] = []
    for _ in range(args.rounds):
        for mode in results:
            scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
            timed_steps(model, opt, scaler, x, y, 3)  # warm-up (and let the scale settle)
            mon = None
            if mode != "none":
                mon = ampscope.watch(model, scaler, opt, sender=MemorySender(),
                                     layer_every=10 if mode == "default" else 1)
                assert mon._transport is not None
                put = mon._transport.put

                def timed_put(item: object, put: object = put) -> None:
                    start = time.perf_counter_ns()
                    put(item)  # type: ignore[operator]
                    enqueue_ns.append(time.perf_counter_ns() - start)

                mon._transport.put = timed_put  # type: ignore[method-assign]
            results[mode] += timed_steps(model, opt, scaler, x, y, per)
            if mon is not None:
                mon.close()
    base = statistics.median(results["none"])
    params = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    print(f"model: {tensors} parameter tensors, {params} parameters; {per * args.rounds} "
          f"steps per configuration, torch threads {torch.get_num_threads()}")
    print(f"median step, no hook:            {base * 1e3:.2f} ms")
    for mode, label in (("default", "default cadence (layer_every=10)"),
                        ("every", "per-layer every step")):
        med = statistics.median(results[mode])
        print(f"median step, {label:<32} {med * 1e3:.2f} ms  ratio {med / base:.3f}")
    enqueue_ns.sort()
    p50, p99 = enqueue_ns[len(enqueue_ns) // 2], enqueue_ns[int(len(enqueue_ns) * 0.99)]
    print(f"enqueue p50 {p50 / 1e3:.1f} us, p99 {p99 / 1e3:.1f} us")


if __name__ == "__main__":
    main()
