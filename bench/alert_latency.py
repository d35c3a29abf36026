"""Alert latency (issue #15): from the batch that carries the step crossing a rule to the webhook
request, through a real `ampscope serve` (shipped settings: one evaluation pass a second) and a
webhook receiver on 127.0.0.1, on SQLite and Postgres.

Each of N runs sends 100 healthy steps, waits a random 0-1 s (so the crossing falls anywhere in
the evaluation cycle), then a batch of 10 steps whose 6th has a NaN loss. Two rules see it: a
`series` rule (non-finite loss) and the default `errors` rule (the findings engine's
forward-overflow error). Inside the clock: the crossing batch's HTTP ingest, the wait for the
next evaluation pass, the findings analysis, the outbox write and the webhook POST. Outside:
the hook's own batching before it sends (at most its flush interval, 0.5 s by default).
Duplicates are counted by the receiver (a delivery id seen twice).

Usage: `python bench/alert_latency.py [--db sqlite|postgres|both] [--runs N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from team_server import CLI, database, free_port, wait_healthy  # type: ignore[import-not-found]

RECEIVED: list[tuple[float, str, dict[str, Any]]] = []
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with LOCK:
            RECEIVED.append((time.time(), self.headers["X-Ampscope-Delivery"], json.loads(body)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def _record(seq: int, loss: float | str) -> dict[str, Any]:
    return {"seq": seq, "step": seq, "wall_time": time.time(), "loss": loss,
            "scale_before": 65536.0, "scale_after": 65536.0, "growth_tracker": seq,
            "found_inf": False, "skipped": False, "grad_norm": 0.75, "lr": 1e-3,
            "layers": None}


def _batch(run_id: str, records: list[dict[str, Any]], first: bool) -> dict[str, Any]:
    return {"schema_version": 1,
            "run": {"id": run_id, "project": "bench", "name": "latency", "tags": [],
                    "config": {}, "host": "bench", "rank": 0, "target_format": "fp16"},
            "attempt": {"id": str(uuid.uuid5(uuid.NAMESPACE_URL, run_id)), "pid": 1,
                        "started_at": time.time()},
            "layers": [{"index": 0, "name": "fc.weight", "shape": [4], "dtype": "float32",
                        "numel": 4, "module_type": "Linear"}] if first else None,
            "records": records, "final": False}


def measure(kind: str, runs: int, hook_url: str) -> None:
    with tempfile.TemporaryDirectory() as tmp, database(kind, Path(tmp)) as url:
        subprocess.run([*CLI, "db", "upgrade", "--db", url], check=True, capture_output=True)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = open(Path(tmp) / "server.log", "wb")  # noqa: SIM115 - the child writes it
        proc = subprocess.Popen([*CLI, "serve", "--host", "127.0.0.1", "--port", str(port),
                                 "--db", url, "--log-level", "warning"], stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            wait_healthy(base)
            client = httpx.Client(base_url=base, timeout=60)
            assert client.post("/api/alerts/destinations", json={
                "project": "bench", "name": "bench", "kind": "webhook", "url": hook_url,
                "min_severity": "info"}).status_code == 201
            assert client.post("/api/alerts/rules", json={
                "project": "bench", "name": "nan loss", "severity": "error",
                "condition": {"kind": "series", "metric": "nonfinite_loss", "window": 20},
            }).status_code == 201
            rules = {r["id"]: r["name"] for r in client.get("/api/alerts/rules").json()}
            sent: dict[str, float] = {}
            with LOCK:
                RECEIVED.clear()
            for _ in range(runs):
                run_id = str(uuid.uuid4())
                client.post("/api/ingest", json=_batch(
                    run_id, [_record(s, 2.0 - s / 1000) for s in range(100)], first=True))
                time.sleep(random.uniform(0.0, 1.0))
                crossing = [_record(s, "nan" if s == 105 else 1.9) for s in range(100, 110)]
                sent[run_id] = time.time()
                assert client.post("/api/ingest", json=_batch(run_id, crossing, False)
                                   ).status_code == 200
            time.sleep(5.0)
            with LOCK:
                got = list(RECEIVED)
            latency: dict[str, list[float]] = {}
            for at, delivery, body in got:
                alert = body["alert"]
                rule = rules.get(delivery.split(":")[0], "?")
                latency.setdefault(rule, []).append(at - sent[alert["run_id"]])
            duplicates = sum(n - 1 for n in Counter(d for _, d, _ in got).values())
            load = os.getloadavg()
            print(f"{kind}: {runs} runs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
            for rule, values in sorted(latency.items()):
                values.sort()
                p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
                print(f"  {rule:18s} alerts {len(values):3d}  p50 {statistics.median(values):.2f} s"
                      f"  p95 {p95:.2f} s  max {values[-1]:.2f} s")
            print(f"  duplicates {duplicates}")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    hook_url = f"http://127.0.0.1:{receiver.server_address[1]}/bench"
    for kind in (["sqlite", "postgres"] if args.db == "both" else [args.db]):
        measure(kind, args.runs, hook_url)
    receiver.shutdown()


if __name__ == "__main__":
    main()
