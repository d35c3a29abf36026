"""One long run built through HTTP ingest, then what it costs to keep and to read (issue #11:
a 1M-step x 500-layer run, storage <= 8 B/value and every chart query p95 <= 150 ms on both
dialects, the first chart in Chromium within 2 s).

Build: one run of --steps steps, the hook's real wire (`ampscope.wire.step_record`,
`build_payload`, `dumps`), POSTed to a real `ampscope serve` on 127.0.0.1 in batches of --batch
records. Scalars every step, one overflow skip every 997 steps, per-layer statistics every
--layer-every steps (the hook's default, 10) drawn as a model's would be (`layer_values`: a pool
of 64 drawn steps, amax/amin_nz/l2 rescaled per step and layer, so compression sees what a run
carries, not constants). Encoding runs in a thread ahead of the sender (a bounded queue of
batches), so the build measures the server's ingest rather than this process's JSON; the build
rate printed is records and values per second of the whole build, wall clock.

Then, against the same database:
- storage (`bench/storage.py`'s accounting): bytes per stored layer-statistic value, table by
  table, indexes and rollups included; SQLite from `dbstat`, Postgres after `VACUUM`;
- every request of the run page (`bench/query_reads.run_page`, median / p95 over --repeat,
  client-side wall clock on loopback: an upper bound of the server time) plus the heatmap and
  skip rate at a zoom of 1/100 of the run;
- Chromium's first chart, cold and warm cache (`bench/query_reads.first_paint`).

`--keep PATH` (SQLite: a file) or `--keep NAME` (Postgres: a database name) builds once and
reads back later: a build of 1M x 500 takes tens of minutes. The machine's load is printed
beside every figure; other work on the machine slows them.

    .venv/bin/python bench/long_run.py --steps 20000 --layers 50            # a quick check
    .venv/bin/python bench/long_run.py --steps 1000000 --layers 500 --keep /tmp/long.db
    .venv/bin/python bench/long_run.py --db postgres --steps 1000000 --layers 500 \\
        --keep ampscope_long
"""

from __future__ import annotations

import argparse
import os
import queue
import random
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
from sqlalchemy import text

from ampscope import wire
from ampscope_server.store import db

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: find bench.*
from bench import layer_values, query_reads, storage
from bench.team_server import PG_ADMIN, database

SKIP_EVERY = 997
RUN_NAME = "long-run"


@contextmanager
def _kept_or_fresh(kind: str, keep: str | None, folder: Path) -> Iterator[str]:
    """The database URL: kept (created when absent, never dropped) or fresh for this run."""
    if keep is None:
        with database(kind, folder) as url:
            yield url
        return
    if kind == "sqlite":
        yield f"sqlite:///{Path(keep).resolve()}"
        return
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (keep,)).fetchone()
        if exists is None:
            admin.execute(f'CREATE DATABASE "{keep}"')
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{keep}"


def _bodies(args: argparse.Namespace, out: queue.Queue[tuple[bytes, int] | None]) -> None:
    """Every batch's body and its layer-statistic values, in order, then None."""
    rng = random.Random(1)
    table = layer_values.layer_table(args.layers)
    numels = [layer["numel"] for layer in table]
    pool = [layer_values.stats(rng, numels) for _ in range(64)]
    run = {"id": str(uuid.uuid4()), "project": "bench", "name": RUN_NAME, "tags": ["bench"],
           "config": {"steps": args.steps, "layers": args.layers}, "host": "bench", "rank": 0,
           "target_format": "fp16"}
    attempt = {"id": str(uuid.uuid4()), "pid": os.getpid(), "started_at": time.time()}
    per_layer_step = args.layers * len(wire.LAYER_STAT_NAMES)
    for first in range(0, args.steps, args.batch):
        records, values = [], 0
        for step in range(first, min(args.steps, first + args.batch)):
            skipped = step % SKIP_EVERY == SKIP_EVERY - 1
            layers = (layer_values.varied(rng, pool[step % len(pool)])
                      if step % args.layer_every == 0 else None)
            values += per_layer_step if layers is not None else 0
            records.append(wire.step_record(
                seq=step, step=step, wall_time=1.7e9 + step * 0.05, loss=2.0 - step * 1e-7,
                scale_before=131072.0 if skipped else 65536.0, scale_after=65536.0,
                growth_tracker=step % 2000, found_inf=skipped, skipped=skipped,
                grad_norm=float("inf") if skipped else 1.0 + rng.random(), lr=1e-3,
                duration=0.05 + rng.random() * 1e-3, layers=layers))
        out.put((wire.dumps(wire.build_payload(
            run=run, attempt=attempt, layers=table if first == 0 else None, records=records,
            final=first + args.batch >= args.steps)), values))
    out.put(None)


def build(base: str, args: argparse.Namespace) -> int:
    """The run through HTTP ingest; the layer-statistic values stored."""
    bodies: queue.Queue[tuple[bytes, int] | None] = queue.Queue(maxsize=4)
    encoder = threading.Thread(target=_bodies, args=(args, bodies), daemon=True)
    began, values, sent = time.perf_counter(), 0, 0
    encoder.start()
    with httpx.Client(base_url=base, timeout=120) as client:
        while (item := bodies.get()) is not None:
            body, batch_values = item
            client.post("/api/ingest", content=body,
                        headers={"Content-Type": "application/json"}).raise_for_status()
            values += batch_values
            sent += 1
            if sent % 200 == 0:
                took = time.perf_counter() - began
                print(f"  ... {sent * args.batch:,} steps in {took:.0f} s "
                      f"({values / took:,.0f} values/s, {query_reads._load()})", flush=True)
    took = time.perf_counter() - began
    print(f"built {args.steps:,} steps x {args.layers} layers (layer statistics every "
          f"{args.layer_every}) through HTTP ingest in {took:.0f} s: "
          f"{args.steps / took:,.0f} records/s, {values / took:,.0f} values/s "
          f"({query_reads._load()})")
    return values


def stored_values(url: str, layers: int) -> int:
    """The layer-statistic values a kept database holds (its layer steps x layers x 8)."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            steps = conn.execute(text("SELECT COUNT(*) FROM layer_stats")).scalar_one()
    finally:
        engine.dispose()
    return int(steps) * layers * len(wire.LAYER_STAT_NAMES)


def sizes(kind: str, url: str, values: int) -> None:
    engine = db.make_engine(url)
    try:
        if kind == "sqlite":
            tables = storage.sqlite_sizes(engine)  # checkpoints the WAL into the file first
            file_bytes = Path(url.removeprefix("sqlite:///")).stat().st_size
            storage.report(kind, tables, values, file_bytes)
        else:
            storage.report(kind + " after VACUUM", storage.postgres_sizes(engine), values, None)
    finally:
        engine.dispose()


def the_run(base: str) -> dict[str, Any]:
    with httpx.Client(base_url=base, timeout=60) as client:
        runs = client.get("/api/runs", params={"q": RUN_NAME}).json()
        if not runs:
            raise SystemExit(f"no run named {RUN_NAME!r} in this database")
        detail: dict[str, Any] = client.get(f"/api/runs/{runs[0]['id']}").json()
        return detail


def zoomed(base: str, detail: dict[str, Any], repeat: int) -> None:
    """The heatmap and the skip rate over the last 1/100 of the run (a typical zoom)."""
    run, last = detail["id"], detail["last_step"]
    start = max(0, last - (last + 1) // 100)
    with httpx.Client(base_url=base, timeout=60) as client:
        for label, path in [
            ("layer-stats lost_frac, 1/100 zoom",
             f"/api/runs/{run}/layer-stats?stat=lost_frac&start={start}&end={last}"),
            ("skip-rate, 1/100 zoom",
             f"/api/runs/{run}/skip-rate?max_points=2400&start={start}&end={last}"),
        ]:
            times, _ = query_reads._time(client, path, repeat)
            print(f"{'run page: ' + label:58} {query_reads._stats(times)}  "
                  f"({query_reads._load()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--layers", type=int, default=500)
    parser.add_argument("--layer-every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=500, help="records per ingest request")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--paint-repeat", type=int, default=5)
    parser.add_argument("--keep", metavar="PATH_OR_NAME",
                        help="SQLite file / Postgres database to build once and read back")
    args = parser.parse_args()
    print(f"{args.db}: {query_reads._load()}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp, \
            _kept_or_fresh(args.db, args.keep, Path(tmp)) as url, \
            query_reads._server(url, Path(tmp)) as base:
        with httpx.Client(base_url=base, timeout=60) as client:
            built = bool(client.get("/api/runs", params={"q": RUN_NAME}).json())
        values = stored_values(url, args.layers) if built else build(base, args)
        sizes(args.db, url, values)
        detail = the_run(base)
        print(f"run {detail['id']}: {detail['num_steps']:,} steps ({query_reads._load()})")
        with httpx.Client(base_url=base, timeout=60) as client:
            query_reads.run_page(client, detail["id"], args.repeat)
        zoomed(base, detail, args.repeat)
        query_reads.first_paint(base, detail["id"], args.paint_repeat)


if __name__ == "__main__":
    main()
