"""Exit status of short watched runs (#29): a training script must exit 0 when it ends, whatever
the hook's background work (the fused read's compile, the sender thread) is doing then.

Each run is a fresh interpreter (``--child``): a 2-layer model of ~49k parameters, FP32 forward,
a CPU ``GradScaler``, ``ampscope.watch(..., fused=True, layer_every=1)`` with a ``MemorySender``,
``--steps`` steps, ``mon.close()``, then the interpreter's own exit, where the fused read's
compile may still be running (it starts at the first per-layer step and takes seconds to
minutes). The parent counts exit statuses; anything but 0 is printed with its last output lines.
The inductor cache is the machine's (warm after the first run, as a user's would be); with
``--cold`` each run gets a fresh ``TORCHINDUCTOR_CACHE_DIR`` (a compile still running at exit in
every run).

Usage: ``python bench/exit_status.py [--runs 50] [--steps 20] [--cold]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time


def child(steps: int) -> None:
    import torch
    from torch import nn

    import ampscope
    from ampscope.transport import MemorySender

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    mon = ampscope.watch(model, scaler, opt, sender=MemorySender(), fused=True, layer_every=1)
    x = torch.randn(8, 64)
    for _ in range(steps):
        opt.zero_grad()
        scaler.scale(model(x).square().mean()).backward()
        scaler.step(opt)
        scaler.update()
    mon.close()
    print(f"produced {mon.stats().produced}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cold", action="store_true", help="a fresh inductor cache per run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.steps)
        return
    statuses: collections.Counter[int] = collections.Counter()
    start = time.monotonic()
    for run in range(args.runs):
        env = dict(os.environ)
        with tempfile.TemporaryDirectory() as cache:
            if args.cold:
                env["TORCHINDUCTOR_CACHE_DIR"] = cache
            done = subprocess.run([sys.executable, __file__, "--child", "--steps",
                                   str(args.steps)], capture_output=True, text=True, env=env,
                                  timeout=900)
        statuses[done.returncode] += 1
        if done.returncode != 0 or f"produced {args.steps}" not in done.stdout:
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            print(f"run {run}: exit status {done.returncode}\n  " + "\n  ".join(tail))
    print(f"{args.runs} runs of {args.steps} steps ({'cold' if args.cold else 'warm'} inductor "
          f"cache): exit statuses {dict(sorted(statuses.items()))}, "
          f"{time.monotonic() - start:.0f} s, load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
