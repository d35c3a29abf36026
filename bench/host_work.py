"""The hook's host work, counted and timed: what the training thread and the sender thread pay.

1. ``counts``: the aten ops and Python calls the hook adds to one step on the training thread
   (hook minus no hook, ``tests/client_hook/test_step.py``'s deterministic counters), plain and
   per-layer, at 34 and 500 parameter tensors, with torch's every-step norms (``fused=False``)
   and with the C loop's (``fused=None``; these tiny models' per-layer reads stay eager below
   ``FUSE_MIN_ELEMS``). Budgets (issue #29): plain <= 8 ops and <= 60 calls, per-layer <= 20
   ops and <= 150 calls, equal at any width.
2. ``sender``: the sender thread's CPU time per record (``time.thread_time_ns``, which a loaded
   machine inflates far less than wall time), median of ``--reps``: ``to_wire`` (the host values
   turned into the record) and the encode of a one-record body, packed (wire v5, ``wire.dumps``)
   and as the v4 JSON arrays (``json.dumps`` of the same body unpacked), for a scalars-only
   record and a per-layer one. The machine's load average is printed beside every figure.

Usage: ``python bench/host_work.py [--only counts,sender] [--reps 200]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests' counters

import torch
from torch import nn

import ampscope
from ampscope import wire
from ampscope.transport import MemorySender
from tests.client_hook.test_step import added

WIDTHS = (34, 500)


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def cpu_us(fn: Callable[[], Any], reps: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start = time.thread_time_ns()
        fn()
        times.append(time.thread_time_ns() - start)
    return statistics.median(times) / 1000


def counts() -> None:
    for fused, norms in ((False, "torch's norms"), (None, "the C loop's norms")):
        for tensors in WIDTHS:
            for layer_every, kind in ((0, "plain"), (1, "per-layer")):
                ops, calls = added(tensors, layer_every, fused)
                print(f"counts: {tensors} tensors, {kind} step, {norms}: +{ops} aten ops, "
                      f"+{calls} Python calls on the training thread; {load()}")


def records(tensors: int, layer_every: int) -> tuple[Any, Any]:
    """(the monitor, the last StepRecord) of a short run of a ``tensors``-tensor model."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(tensors // 2)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    mon: Any = ampscope.watch(model, scaler, opt, sender=MemorySender(), layer_every=layer_every,
                              activation_every=0, histogram_every=0, fused=False)
    kept: list[Any] = []

    def keep(item: Any) -> int:
        kept.append(item)
        return 0

    mon._transport.put = keep
    x = torch.randn(3, 4)
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        scaler.scale(model(x).square().mean()).backward()
        scaler.step(opt)
        scaler.update()
    return mon, kept[-1]


def sender(reps: int) -> None:
    for tensors in WIDTHS:
        for layer_every, kind in ((0, "scalars-only"), (1, "per-layer")):
            mon, record = records(tensors, layer_every)
            rec = record.to_wire()
            to_wire = cpu_us(record.to_wire, reps)
            packed = cpu_us(lambda: mon._encode([rec], False, False), reps)  # noqa: B023
            body = wire.unpack_payload(json.loads(mon._encode([rec], False, False)))

            def as_v4(body: dict[str, Any] = body) -> bytes:
                return json.dumps(body, allow_nan=False, separators=(",", ":")).encode()

            plain = cpu_us(as_v4, reps)
            size_packed, size_json = len(mon._encode([rec], False, False)), len(as_v4())
            mon.close()
            print(f"sender: {tensors} layers, {kind} record: to_wire {to_wire:.1f} us, encode "
                  f"packed {packed:.1f} us ({size_packed} B) vs JSON arrays {plain:.1f} us "
                  f"({size_json} B); per record {to_wire + packed:.1f} us; {load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="counts,sender")
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    only = set(args.only.split(","))
    if "counts" in only:
        counts()
    if "sender" in only:
        sender(args.reps)


if __name__ == "__main__":
    main()
