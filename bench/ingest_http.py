"""Ingest through the real server (DESIGN.md §8: ≥ 1,000,000 layer-statistic values/s with 8
clients; p99 ≤ 500 ms at half that load), on SQLite and Postgres.

A real `ampscope serve` process (one, on 127.0.0.1, no auth as on loopback, SQLite file or a
fresh Postgres database) and N client threads in this process, each a training job of its own
run, POSTing the hook's real wire: records built by `ampscope.wire.step_record` and
`build_payload` from per-layer statistics drawn as a model's would be (`layer_values`), every
record carrying --layers layer statistics, encoded by the hook's codec (`wire.dumps`, JSON)
before the clock starts, so the clients spend their time sending, not encoding.

Inside the clock, per request: the HTTP exchange on a kept-alive connection, the server's body
read, decoding, validation, the ingest transaction (steps, packed layer statistics, rollups),
the commit and the live fan-out to subscribers (none connected here, so only the notification
itself). Values/s counts 8 statistics per layer per accepted record over the wall time from the
first request sent to the last answer. Two phases per database:

- `full`: every client sends its batches back to back (closed loop): the server's capacity;
- `half`: every client sends on a fixed schedule, together --half-rate values/s (default 500,000:
  half the budget), latency measured from the scheduled send time (a late answer delays the
  next send and counts in its latency: no coordinated omission).

    .venv/bin/python bench/ingest_http.py                          # both dialects
    .venv/bin/python bench/ingest_http.py --db sqlite
    .venv/bin/python bench/ingest_http.py --clients 8 --records 50 --layers 200 --seconds 15
    .venv/bin/python bench/ingest_http.py --db postgres --workers 2   # a team's deployment

The machine's load average is printed before and after each phase: on a shared machine the
figures move with it. So is the server process's CPU time (user + system, from /proc) per
request: one process serves, its threads share one GIL, so a server at ~100 % of a core is
the limit whatever the cores left; that figure moves less with the machine's other work.
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ampscope import wire

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: find bench.*
from bench import layer_values
from bench.team_server import database, free_port, wait_healthy

CLI = [sys.executable, "-m", "ampscope_server.cli"]
VALUES_PER_LAYER = len(wire.LAYER_STAT_NAMES)


@contextmanager
def serve(url: str, folder: Path, workers: int = 1) -> Iterator[tuple[int, int]]:
    """(port, pid) of a real `ampscope serve` over `url` (`--workers` processes: Postgres)."""
    subprocess.run([*CLI, "db", "upgrade", "--db", url], check=True, capture_output=True)
    port = free_port()
    with open(folder / "server.log", "ab") as log:
        proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--db", url,
                                 *(["--workers", str(workers)] if workers > 1 else []),
                                 "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def client_bodies(index: int, batches: int, records: int, layers: int,
                  first_seq: int = 0) -> list[bytes]:
    """One client's batches: its own run, the layer table in the first batch (as the hook)."""
    rng = random.Random(index)
    table = layer_values.layer_table(layers, seed=index)
    numels = [layer["numel"] for layer in table]
    run = {"id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "project": "bench",
           "name": f"client-{index}", "tags": ["bench"], "config": {"lr": 1e-3},
           "host": "bench", "rank": index, "target_format": "fp16"}
    attempt = {"id": str(uuid.uuid4()), "pid": os.getpid(), "started_at": time.time()}
    # A pool of distinct steps' statistics, cycled and rescaled per step (`varied`): drawing
    # every value afresh would take longer than the measurement.
    pool = [layer_values.stats(rng, numels) for _ in range(16)]
    out = []
    for number in range(batches):
        recs = []
        for i in range(records):
            seq = first_seq + number * records + i
            recs.append(wire.step_record(
                seq=seq, step=seq, wall_time=1.7e9 + seq, loss=2.0 - seq * 1e-6,
                scale_before=65536.0, scale_after=65536.0, growth_tracker=seq % 2000,
                found_inf=False, skipped=False, grad_norm=1.0 + rng.random(), lr=1e-3,
                duration=0.05, layers=layer_values.varied(rng, pool[seq % len(pool)])))
        payload = wire.build_payload(run=run, attempt=attempt,
                                     layers=table if number == 0 and first_seq == 0 else None,
                                     records=recs, final=False)
        out.append(wire.dumps(payload))
    return out


@dataclass
class Answer:
    sent: float
    done: float
    status: int
    values: int


def _post(conn: http.client.HTTPConnection, body: bytes) -> int:
    conn.request("POST", "/api/ingest", body=body,
                 headers={"Content-Type": "application/json", "Content-Length": str(len(body))})
    response = conn.getresponse()
    response.read()
    return response.status


def run_clients(port: int, bodies: list[list[bytes]], values_per_batch: int,
                interval_s: float | None) -> list[Answer]:
    """Every client's bodies sent in order; back to back, or one per `interval_s` (its schedule
    staggered across clients), latency then counted from the scheduled time."""
    answers: list[list[Answer]] = [[] for _ in bodies]
    start = time.perf_counter() + 0.2
    barrier = threading.Barrier(len(bodies))

    def client(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        barrier.wait()
        offset = 0.0 if interval_s is None else interval_s * index / len(bodies)
        for number, body in enumerate(bodies[index]):
            if interval_s is None:
                scheduled = time.perf_counter()
            else:
                scheduled = start + offset + number * interval_s
                pause = scheduled - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
            status = _post(conn, body)
            answers[index].append(Answer(scheduled, time.perf_counter(), status,
                                         values_per_batch))
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [answer for per_client in answers for answer in per_client]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of a process and its descendants (uvicorn's workers):
    Linux /proc; NaN elsewhere."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            stats[int(entry.parent.name)] = entry.read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
    if pid not in stats:
        return float("nan")
    tree, grew = {pid}, True
    while grew:
        more = {child for child, fields in stats.items() if int(fields[1]) in tree} - tree
        tree |= more
        grew = bool(more)
    ticks = sum(int(stats[p][11]) + int(stats[p][12]) for p in tree)
    return ticks / os.sysconf("SC_CLK_TCK")


def report(label: str, answers: list[Answer], load_before: float, server_cpu: float) -> float:
    ok = [a for a in answers if a.status == 200]
    bad = sorted({a.status for a in answers if a.status != 200})
    wall = max(a.done for a in answers) - min(a.sent for a in answers)
    latencies = sorted((a.done - a.sent) * 1000 for a in answers)
    cut = statistics.quantiles(latencies, n=100, method="inclusive")
    rate = sum(a.values for a in ok) / wall
    print(f"  {label:<5} {rate:>12,.0f} values/s  {len(ok) / wall:6.1f} req/s  latency ms "
          f"p50 {cut[49]:7.1f} p95 {cut[94]:7.1f} p99 {cut[98]:7.1f} max {latencies[-1]:7.1f}  "
          f"{len(ok)}/{len(answers)} ok{' (other: ' + str(bad) + ')' if bad else ''}  "
          f"server CPU {server_cpu / len(answers) * 1000:.0f} ms/request  "
          f"load {load_before:.2f} -> {os.getloadavg()[0]:.2f}")
    return rate


def measure(kind: str, args: argparse.Namespace) -> None:
    values_per_batch = args.records * args.layers * VALUES_PER_LAYER
    per_client = max(2, round(args.seconds * args.target / values_per_batch / args.clients))
    with tempfile.TemporaryDirectory() as tmp, database(kind, Path(tmp)) as url, \
            serve(url, Path(tmp), args.workers) as (port, pid):
        full = [client_bodies(i, per_client, args.records, args.layers)
                for i in range(args.clients)]
        size = statistics.mean(len(b) for bodies in full for b in bodies)
        print(f"{kind}: {args.clients} clients x {per_client} batches of {args.records} records x "
              f"{args.layers} layers ({values_per_batch:,} values, {size / 2**20:.2f} MiB "
              "of JSON per batch)")
        load, cpu = os.getloadavg()[0], cpu_seconds(pid)
        answers = run_clients(port, full, values_per_batch, None)
        report("full", answers, load, cpu_seconds(pid) - cpu)
        del full
        interval = args.clients * values_per_batch / args.half_rate
        count = max(2, round(args.seconds / interval))
        half = [client_bodies(i, count, args.records, args.layers,
                              first_seq=per_client * args.records)
                for i in range(args.clients)]
        load, cpu = os.getloadavg()[0], cpu_seconds(pid)
        answers = run_clients(port, half, values_per_batch, interval)
        report("half", answers, load, cpu_seconds(pid) - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--records", type=int, default=50, help="records per batch")
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=15.0,
                        help="about how long each phase runs at the target rate")
    parser.add_argument("--target", type=float, default=1_000_000,
                        help="values/s the full phase's batch count is sized for")
    parser.add_argument("--half-rate", type=float, default=500_000)
    parser.add_argument("--workers", type=int, default=1,
                        help="server processes (`ampscope serve --workers`; Postgres only)")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs, shared)")
    for kind in (["sqlite", "postgres"] if args.db == "both" else [args.db]):
        measure(kind, args)


if __name__ == "__main__":
    main()
