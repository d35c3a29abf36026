"""Team-server figures under hostile load (issue #10), on SQLite and Postgres, against a real
`ampscope serve --auth required` on 127.0.0.1:

1. **Health under a large ingest.** `/api/health` is polled every 20 ms while one ~7.5 MiB batch
   (1,600 records x 100 layers) is posted with an ingest token; the figure is the latency of the
   polls that overlapped the ingest (p50, p95, max). Inside the clock: one HTTP round trip of a
   health check on a fresh keep-alive connection. The ingest itself (body upload, JSON parse,
   validation, storage, rollups) runs in the threadpool, so the event loop keeps answering.
2. **Export memory.** A run of 10,000 steps x 100 layers is ingested, then its JSON export
   (`GET /api/runs/{id}/export`) is downloaded by 4 clients at once. The figure is the server
   process's peak RSS during the downloads (VmHWM, reset through /proc/PID/clear_refs first)
   minus its RSS just before, next to the export's size.

The machine's load average is printed beside the figures. Usage:
`python bench/team_server.py [--db sqlite|postgres|both]` (Postgres on 127.0.0.1:5432, user
postgres, trust auth, as in the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg

CLI = [sys.executable, "-m", "ampscope_server.cli"]
LAYERS = 100
PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def database(kind: str, folder: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'bench.db'}"
        return
    name = f"ampscope_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def wait_healthy(base: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/api/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"the server at {base} did not answer within {timeout_s:.0f} s")


@contextmanager
def server(url: str, folder: Path) -> Iterator[tuple[str, str, int]]:
    """(base URL, an all-projects admin token, the server's pid)."""
    subprocess.run([*CLI, "db", "upgrade", "--db", url], check=True, capture_output=True)
    token = subprocess.run([*CLI, "token", "create", "--all-projects", "--scope", "admin",
                            "--db", url], check=True, capture_output=True, text=True).stdout
    port = free_port()
    env = {**os.environ, "AMPSCOPE_INGEST_RATE_PER_S": "1000", "AMPSCOPE_INGEST_BURST": "1000"}
    with open(folder / "server.log", "ab") as log:
        proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--db", url, "--auth",
                                 "required", "--log-level", "warning"], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base)
    try:
        yield base, token.strip(), proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def records(start: int, n: int) -> list[dict[str, Any]]:
    stats = {"amax": [0.5] * LAYERS, "amin_nz": [1e-9] * LAYERS, "zero_frac": [0.01] * LAYERS,
             "subnormal_frac": [0.001] * LAYERS, "underflow_frac": [0.0001] * LAYERS,
             "nan_count": [0] * LAYERS, "inf_count": [0] * LAYERS, "l2": [1.25] * LAYERS}
    return [{"seq": i, "step": i, "wall_time": 1.7e9 + i, "loss": 2.0 - i * 1e-5,
             "scale_before": 65536.0, "scale_after": 65536.0, "growth_tracker": i,
             "found_inf": False, "skipped": False, "grad_norm": 0.75, "lr": 1e-3,
             "duration": 0.01, "layers": stats} for i in range(start, start + n)]


def batch(run_id: str, attempt: str, recs: list[dict[str, Any]]) -> bytes:
    layers = [{"index": i, "name": f"block{i}.weight", "shape": [64, 64], "dtype": "float32",
               "numel": 4096, "module_type": "Linear"} for i in range(LAYERS)]
    return json.dumps({"schema_version": 1, "run": {"id": run_id, "project": "bench",
                                                    "name": "bench"},
                       "attempt": {"id": attempt, "pid": 1, "started_at": 1.7e9},
                       "layers": layers, "records": recs}).encode()


def health_under_ingest(base: str, token: str) -> dict[str, float]:
    body = batch(str(uuid.uuid4()), str(uuid.uuid4()), records(0, 1600))
    latencies: list[tuple[float, float]] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            while not stop.is_set():
                started = time.perf_counter()
                client.get("/api/health")
                latencies.append((started, time.perf_counter() - started))
                time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.5)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    begin = time.perf_counter()
    response = httpx.post(f"{base}/api/ingest", content=body, headers=headers, timeout=120)
    end = time.perf_counter()
    stop.set()
    poller.join()
    assert response.status_code == 200, response.text
    during = sorted(lat for started, lat in latencies if begin <= started <= end)
    return {"body_mib": len(body) / 2**20, "ingest_s": end - begin, "polls": len(during),
            "p50_ms": 1e3 * statistics.median(during),
            "p95_ms": 1e3 * during[int(0.95 * (len(during) - 1))], "max_ms": 1e3 * during[-1]}


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def export_memory(base: str, token: str, pid: int) -> dict[str, float]:
    run_id, attempt = str(uuid.uuid4()), str(uuid.uuid4())
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=base, headers=headers, timeout=300) as client:
        for start in range(0, 10_000, 400):
            response = client.post("/api/ingest", content=batch(run_id, attempt,
                                                                 records(start, 400)))
            assert response.status_code == 200, response.text
    sizes: list[int] = []

    def download() -> None:
        size = 0
        with httpx.stream("GET", f"{base}/api/runs/{run_id}/export", headers=headers,
                          timeout=600) as response:
            for chunk in response.iter_bytes():
                size += len(chunk)
        sizes.append(size)

    download()  # warm: imports, caches, the pool's connections
    before = status_kib(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    threads = [threading.Thread(target=download) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    peak = status_kib(pid, "VmHWM")
    return {"export_mb": sizes[-1] / 1e6, "rss_before_mib": before / 1024,
            "peak_growth_mib": (peak - before) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    for kind in kinds:
        with tempfile.TemporaryDirectory() as folder, database(kind, Path(folder)) as url, \
                server(url, Path(folder)) as (base, token, pid):
            health = health_under_ingest(base, token)
            memory = export_memory(base, token, pid)
            load = os.getloadavg()
            print(f"{kind}: health during a {health['body_mib']:.1f} MiB ingest "
                  f"({health['ingest_s']:.2f} s, {health['polls']:.0f} polls): p50 "
                  f"{health['p50_ms']:.1f} ms, p95 {health['p95_ms']:.1f} ms, max "
                  f"{health['max_ms']:.1f} ms")
            print(f"{kind}: JSON export of {memory['export_mb']:.1f} MB, 4 at once: peak RSS "
                  f"growth {memory['peak_growth_mib']:.1f} MiB (RSS before "
                  f"{memory['rss_before_mib']:.0f} MiB)")
            print(f"{kind}: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on "
                  f"{os.cpu_count()} cores")


if __name__ == "__main__":
    main()
