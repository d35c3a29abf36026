"""Live latency across processes on one Postgres (DESIGN.md §8: p95 ≤ 1 s across workers).

Two `ampscope serve` instances, A and B, on one fresh Postgres database (the case of several
instances; `--workers N` is the same mechanism within one). A client posts one record at a time
to A; WebSocket clients on `/api/runs/{id}/live` of A and of B receive it. A step's latency is
the time its message arrives on the socket minus the time its POST was sent (one clock, one
machine): inside the clock are the HTTP request and ingest transaction on A, and either A's
in-process fan-out (socket on A) or Postgres NOTIFY → B's listener → B's read (socket on B).

Usage: `python bench/live_workers.py [--steps 200] [--interval 0.1]`; prints p50, p95 and max
for each socket, and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
from team_server import CLI, database, free_port, wait_healthy  # type: ignore[import-not-found]
from websockets.sync.client import connect


@contextmanager
def serve(url: str) -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--db", url, "--log-level",
                             "warning"])
    wait_healthy(f"http://127.0.0.1:{port}")
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def body(run_id: str, attempt: str, seq: int) -> dict[str, object]:
    return {"schema_version": 1, "run": {"id": run_id, "project": "bench", "name": "latency"},
            "attempt": {"id": attempt, "pid": 1, "started_at": 1.7e9},
            "records": [{"seq": seq, "step": seq, "wall_time": time.time(), "found_inf": False,
                         "skipped": False, "loss": 1.0}]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, database("postgres", Path(folder)) as url:
        subprocess.run([*CLI, "db", "upgrade", "--db", url], check=True, capture_output=True)
        with serve(url) as port_a, serve(url) as port_b, ExitStack() as stack:
            run_id, attempt = str(uuid.uuid4()), str(uuid.uuid4())
            ingest = stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{port_a}"))
            assert ingest.post("/api/ingest", json=body(run_id, attempt, 0)).status_code == 200
            sent: dict[int, float] = {}
            arrived: dict[str, dict[int, float]] = {"A (same process)": {},
                                                    "B (other process)": {}}

            def listen(label: str, port: int) -> None:
                with connect(f"ws://127.0.0.1:{port}/api/runs/{run_id}/live") as ws:
                    while len(arrived[label]) < args.steps:
                        message = json.loads(ws.recv(timeout=30))
                        now = time.perf_counter()
                        for step in message.get("steps", ()):
                            if step["seq"] > 0:
                                arrived[label][step["seq"]] = now

            threads = [threading.Thread(target=listen, args=(label, port))
                       for label, port in zip(arrived, (port_a, port_b), strict=True)]
            for thread in threads:
                thread.start()
            time.sleep(1.0)  # both sockets past their backfill
            for seq in range(1, args.steps + 1):
                sent[seq] = time.perf_counter()
                assert ingest.post("/api/ingest",
                                   json=body(run_id, attempt, seq)).status_code == 200
                time.sleep(args.interval)
            for thread in threads:
                thread.join(60)
    load = os.getloadavg()
    for label, times in arrived.items():
        latencies = sorted(1e3 * (times[seq] - sent[seq]) for seq in times)
        print(f"{label}: {len(latencies)} steps, p50 {statistics.median(latencies):.1f} ms, "
              f"p95 {latencies[int(0.95 * (len(latencies) - 1))]:.1f} ms, "
              f"max {latencies[-1]:.1f} ms")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
