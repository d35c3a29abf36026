"""What ``GET /api/runs/{id}/optimizers`` costs on a long run, through a real server.

One run of ``--steps`` steps, every step carrying wire v4's ``optimizers`` (two optimizers: one
with two parameter groups and a cosine lr, one with one group that skips every 97th step), is
ingested over HTTP into a real ``ampscope serve`` (SQLite, or Postgres with ``--db postgres``;
auth required, an admin token). Then, ``--repeat`` times each, interleaved: the run page's
``/optimizers`` request and, for scale, its ``/series/lr`` request (a read of the step
rollups). Inside the clock: the HTTP request on loopback, client side (an upper bound of the
server's time). Outside it: the ingest. The machine's load is printed beside.

    .venv/bin/python bench/optimizer_reads.py --steps 100000
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
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from team_server import database, server  # type: ignore[import-not-found]

SKIP_EVERY = 97
BATCH = 1000


def records(first: int, count: int, steps: int) -> list[dict[str, Any]]:
    out = []
    for step in range(first, first + count):
        lr = 1e-3 * 0.5 * (1 + math.cos(math.pi * step / steps))
        out.append({
            "seq": step, "step": step, "wall_time": 1.7e9 + step, "loss": 2.0 - step * 1e-6,
            "scale_before": 65536.0, "scale_after": 65536.0, "growth_tracker": 0,
            "found_inf": False, "skipped": False, "grad_norm": 0.75, "lr": lr,
            "duration": 0.01, "layers": None,
            "optimizers": [{"skipped": False, "lr": [lr, lr / 10]},
                           {"skipped": step % SKIP_EVERY == SKIP_EVERY - 1, "lr": [0.01]}],
        })
    return out


def ingest(base: str, token: str, run_id: str, steps: int) -> None:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    layer = {"index": 0, "name": "w", "shape": [4], "dtype": "float32", "numel": 4,
             "module_type": "Linear"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        for first in range(0, steps, BATCH):
            body = {"schema_version": 4,
                    "run": {"id": run_id, "project": "bench", "name": "optimizers"},
                    "attempt": {"id": run_id, "pid": 1, "started_at": 1.7e9},
                    "layers": [layer], "records": records(first, min(BATCH, steps - first),
                                                          steps)}
            response = client.post("/api/ingest", content=json.dumps(body))
            response.raise_for_status()


def timed(client: httpx.Client, path: str) -> float:
    start = time.perf_counter()
    response = client.get(path)
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return 1e3 * elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--db", default="sqlite", choices=["sqlite", "postgres"])
    args = parser.parse_args()
    run_id = str(uuid.uuid4())
    with tempfile.TemporaryDirectory() as tmp, database(args.db, Path(tmp)) as url, \
            server(url, Path(tmp)) as (base, token, _):
        start = time.perf_counter()
        ingest(base, token, run_id, args.steps)
        print(f"{args.db}: one run of {args.steps} steps with two optimizers ingested in "
              f"{time.perf_counter() - start:.1f} s")
        paths = {"optimizers": f"/api/runs/{run_id}/optimizers",
                 "series lr": f"/api/runs/{run_id}/series/lr"}
        times: dict[str, list[float]] = {name: [] for name in paths}
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                          timeout=120) as client:
            read = client.get(paths["optimizers"]).json()
            skipped = [track["skipped"] for track in read["optimizers"]]
            for _ in range(args.repeat):
                for name, path in paths.items():
                    times[name].append(timed(client, path))
        one, five, _ = os.getloadavg()
        print(f"skipped per optimizer: {skipped}; load {one:.2f}/{five:.2f} on "
              f"{os.cpu_count()} cores")
        for name, values in times.items():
            values.sort()
            p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
            print(f"{name:11s} p50 {statistics.median(values):8.1f} ms  p95 {p95:8.1f} ms")


if __name__ == "__main__":
    main()
