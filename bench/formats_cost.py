"""What the formats probe costs (#33): the sampled step's extra time, the amortized ratio at a
cadence, and the bytes a sampled step puts on the wire.

Two copies of the sweep's model (``hook_sweep.make_model``, same seed), each with a GradScaler,
AdamW and a default monitor sending to a ``MemorySender``: one with ``formats_every=1`` (every
step a sample), one with ``formats=()``; both read their per-layer statistics eagerly
(``fused=False``: a background compile would load one copy's segments and not the other's).
Interleaved segments of ``--steps`` steps per round, the order alternating, the copies' records
flushed after each segment (``hook_sweep.run_segment``).
Inside the clock: forward, backward, ``scaler.step``/``update`` and every hook call of the step;
outside: the flush of the sender thread, the models' construction and ``--warmup`` untimed steps.
The per-step extra of a sample is the difference of the two medians; the amortized ratio at
``--every`` N is derived from it, 1 + extra / (N · the no-formats step), not timed.

Usage: ``python bench/formats_cost.py [--size 4M] [--rounds 5] [--steps 10] [--every 100]``.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hook_sweep  # type: ignore[import-not-found]  # a sibling script, not a package

import ampscope
from ampscope.transport import MemorySender


def _live(shape: tuple[int, int], sender: MemorySender, **formats: object
          ) -> hook_sweep.Live:
    model = hook_sweep.make_model(*shape)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    mon = ampscope.watch(model, scaler, opt, sender=sender, fused=False,
                         **formats)  # type: ignore[arg-type]
    return hook_sweep.Live(model, opt, scaler, mon)


def _wire_bytes(live: hook_sweep.Live, sender: MemorySender) -> tuple[int, int]:
    """(bytes of the last sampled record's ``formats`` block as JSON, values in it)."""
    assert live.mon is not None
    live.mon.close()
    blocks = [r["formats"] for body in sender.bodies for r in json.loads(body)["records"]
              if "formats" in r]
    block = blocks[-1]  # as sent: the arrays packed
    text = json.dumps(block, separators=(",", ":"))
    values = sum(len(base64.b64decode(block[k]["f64le"])) // 8
                 for k in ("values", "operands", "scales"))
    return len(text), values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="4M", choices=list(hook_sweep.SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--every", type=int, default=100)
    args = parser.parse_args()
    shape = hook_sweep.SHAPES[args.size]
    torch.manual_seed(0)
    x = torch.randn(32, 16, hook_sweep.D_IN)
    y = torch.randint(0, hook_sweep.CLASSES, (32,))
    sink = MemorySender()
    sampled, off = _live(shape, sink, formats_every=1), _live(shape, MemorySender(), formats=())
    print(f"{args.size}: {sum(p.numel() for p in sampled.model.parameters()) / 1e6:.2f} M "
          f"parameters; {hook_sweep.load()}")
    for live in (sampled, off):
        hook_sweep.run_segment(live, x, y, args.warmup)
    times: dict[str, list[float]] = {"sampled": [], "off": []}
    start = time.perf_counter()
    for r in range(args.rounds):
        order = [("sampled", sampled), ("off", off)]
        for name, live in order if r % 2 == 0 else order[::-1]:
            times[name] += hook_sweep.run_segment(live, x, y, args.steps)
    wall = time.perf_counter() - start
    med = {name: statistics.median(t) for name, t in times.items()}
    extra = med["sampled"] - med["off"]
    print(f"step median: every step sampled {med['sampled'] * 1e3:.2f} ms, formats off "
          f"{med['off'] * 1e3:.2f} ms; a sample adds {extra * 1e3:.2f} ms "
          f"({med['sampled'] / med['off']:.3f}x that step)")
    print(f"amortized at formats_every={args.every}: "
          f"{1 + extra / (args.every * med['off']):.4f}x (derived, not timed)")
    size, values = _wire_bytes(sampled, sink)
    print(f"wire: {size} bytes of JSON per sampled step for {values} values "
          f"({size / values:.2f} B/value, base64 of float64)")
    print(f"{args.rounds} rounds x {args.steps} steps each in {wall:.1f} s; {hook_sweep.load()}")


if __name__ == "__main__":
    main()
