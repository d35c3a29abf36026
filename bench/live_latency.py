"""Live latency: a step logged by the hook → the same step on the run's live WebSocket.

DESIGN.md §8 budgets it at p95 ≤ 1 s ("step logged → browser chart"). This bench measures the
part that is ours end to end: a real ``ampscope serve`` on a fresh SQLite file, the reference
CPU AMP loop of ``hook_overhead.py`` streaming into it through the real hook and HTTP sender,
and a WebSocket client on ``/api/runs/{id}/live``, the socket the run page listens on. A step's
latency is the time it arrives on the socket minus the time its ``update()`` returned (one
clock: same machine). The browser's own share (parsing the message, one ``Plotly.extendTraces``
per animation frame) is not in it.

The main term is the hook's ``flush_interval`` (how often the sender thread wakes): a step waits
for the next wake, then one request, one ingest transaction and one push. Each interval given is
measured with its own run, one after the other, on the same server.

Usage: ``python bench/live_latency.py [--flush 0.2,0.5] [--steps 400]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import torch
from hook_overhead import make_model  # type: ignore[import-not-found]
from torch import nn
from websockets.sync.client import connect

import ampscope


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(ok: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ok():
                return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} not reached within {timeout_s:.0f} s")


def answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=1.0) as resp:
        return bool(resp.status == 200)


class Listener(threading.Thread):
    """The run's live socket, in a thread: the arrival time of every step it is sent."""

    def __init__(self, ws_url: str) -> None:
        super().__init__(daemon=True)
        self.ws_url = ws_url
        self.arrived: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        with connect(self.ws_url) as ws:
            while not self.stop.is_set():
                try:
                    message = json.loads(ws.recv(timeout=0.5))
                except TimeoutError:
                    continue
                now = time.time()
                if message.get("type") == "steps":
                    for step in message["steps"]:
                        self.arrived.setdefault(step["step"], now)


def measure(url: str, flush: float, steps: int, warmup: int) -> list[float]:
    """Latencies (s) of the steps after ``warmup``, for one run at one flush interval."""
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    mon = ampscope.watch(model, scaler, opt, server=url, run=f"latency-flush-{flush}",
                         tags=["bench"], flush_interval=flush)
    torch.manual_seed(1)
    x, y = torch.randn(4, 16, 32), torch.randint(0, 10, (4,))
    logged: dict[int, float] = {}
    listener: Listener | None = None
    try:
        for i in range(warmup + steps):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(x).float().mean(1)
            scaler.scale(nn.functional.cross_entropy(out, y)).backward()
            scaler.step(opt)
            scaler.update()
            logged[i] = time.time()
            if i == warmup - 1:  # the run exists once its first batch is in: listen from here
                wait_until(lambda: answers(f"{url}/api/runs/{mon.run_id}"), "the run on the server")
                ws = url.replace("http://", "ws://")
                listener = Listener(f"{ws}/api/runs/{mon.run_id}/live")
                listener.start()
                time.sleep(0.5)  # connected, and the backlog so far delivered
    finally:
        mon.close()
    assert listener is not None
    wait_until(lambda: all(i in listener.arrived for i in range(warmup, warmup + steps)),
               "every step on the socket", timeout_s=30.0)
    listener.stop.set()
    listener.join(timeout=5.0)
    return [listener.arrived[i] - logged[i] for i in range(warmup, warmup + steps)]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flush", default="0.2,0.5", help="flush intervals (s), comma-separated")
    parser.add_argument("--steps", type=int, default=400, help="timed steps per interval")
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="ampscope-latency-") as tmp:
        db = f"sqlite:///{os.path.join(tmp, 'latency.db')}"
        server = subprocess.Popen(
            [sys.executable, "-m", "ampscope_server.cli", "serve", "--host", "127.0.0.1",
             "--port", str(port), "--db", db, "--log-level", "warning"])
        try:
            wait_until(lambda: answers(f"{url}/api/health"), "ampscope serve")
            print(f"live latency, hook update() -> step on /api/runs/{{id}}/live; SQLite; "
                  f"{args.steps} steps per interval after {args.warmup} warm-up steps")
            for flush in (float(f) for f in args.flush.split(",")):
                lat = measure(url, flush, args.steps, args.warmup)
                print(f"flush_interval {flush:4.2f} s: p50 {pct(lat, 0.5) * 1e3:6.0f} ms, "
                      f"p95 {pct(lat, 0.95) * 1e3:6.0f} ms, max {max(lat) * 1e3:6.0f} ms, "
                      f"mean {statistics.mean(lat) * 1e3:6.0f} ms")
        finally:
            server.terminate()
            server.wait(timeout=10)
    print("budget (DESIGN.md §8): live latency p95 <= 1 s (to the browser chart)")


if __name__ == "__main__":
    main()
