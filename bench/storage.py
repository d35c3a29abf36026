"""Bytes per stored layer-statistic value (DESIGN.md §8: ≤ 8, indexes and rollups included), table
by table, on SQLite and Postgres.

Builds one run of --steps steps x --layers layers through the real ingest path: the hook's wire
(`ampscope.wire.step_record`, `build_payload`, `dumps`), validated as the server validates a
body (`IngestBatch.model_validate_json`) and stored by `ingest.ingest_batch`, a transaction per
batch of --batch records, rollups included. Per-layer statistics come every --layer-every steps
(1: every step; the hook's default is 10), drawn as a model's would be (`layer_values`) from a
pool of 64 distinct steps, cycled, amax/amin_nz/l2 scaled afresh per step and layer
(`layer_values.varied`): each row is packed and compressed on its own and neither database
compresses across rows (Postgres stores the blobs EXTERNAL, uncompressed), so the pool changes
no row's size. `--worst` draws every fraction non-zero.

Then measures, after the build (Postgres: after `VACUUM`, which autovacuum would run, and
again after `VACUUM FULL`, the live rows without the reusable space of rewritten rollups):
SQLite from `dbstat` (pages in use per table and per index; the file size beside), Postgres
from `pg_relation_size` (heap), the TOAST table and `pg_indexes_size`. Bytes per value divide
by the layer-statistic values stored: steps with layer statistics x layers x 8.

    .venv/bin/python bench/storage.py                           # 100k x 200, both dialects
    .venv/bin/python bench/storage.py --db sqlite --steps 20000 --layer-every 10
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import Engine, text

from ampscope import wire
from ampscope_server.ingest import batches as ingest
from ampscope_server.ingest.wire import IngestBatch
from ampscope_server.store import db

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: find bench.*
from bench import layer_values
from bench.team_server import database

VALUES_PER_LAYER = len(wire.LAYER_STAT_NAMES)
LAYER_TABLES = ("layer_stats", "layer_rollups")


def build(engine: Engine, args: argparse.Namespace) -> int:
    """Ingest the run; the number of layer-statistic values stored."""
    factory = db.make_session_factory(engine)
    rng = random.Random(1)
    table = layer_values.layer_table(args.layers)
    numels = [layer["numel"] for layer in table]
    pool = [layer_values.stats(rng, numels, worst=args.worst) for _ in range(64)]
    run = {"id": str(uuid.uuid4()), "project": "bench", "name": "storage", "tags": [],
           "config": {}, "host": "bench", "rank": 0, "target_format": "fp16"}
    attempt = {"id": str(uuid.uuid4()), "pid": os.getpid(), "started_at": time.time()}
    values = 0
    began = time.perf_counter()
    for first in range(0, args.steps, args.batch):
        records = []
        for step in range(first, min(args.steps, first + args.batch)):
            with_layers = step % args.layer_every == 0
            skipped = step % 997 == 0
            records.append(wire.step_record(
                seq=step, step=step, wall_time=1.7e9 + step * 0.05, loss=2.0 - step * 1e-6,
                scale_before=65536.0 if not skipped else 131072.0,
                scale_after=65536.0, growth_tracker=step % 2000, found_inf=skipped,
                skipped=skipped, grad_norm=float("inf") if skipped else 1.0 + rng.random(),
                lr=1e-3, duration=0.05 + rng.random() * 1e-3,
                layers=layer_values.varied(rng, pool[step % len(pool)]) if with_layers
                else None))
            values += args.layers * VALUES_PER_LAYER if with_layers else 0
        body = wire.dumps(wire.build_payload(run=run, attempt=attempt,
                                             layers=table if first == 0 else None,
                                             records=records, final=False))
        with factory() as session, session.begin():
            ingest.ingest_batch(session, IngestBatch.model_validate_json(body))
    print(f"  built {args.steps:,} steps x {args.layers} layers (layer statistics every "
          f"{args.layer_every}) in {time.perf_counter() - began:.0f} s, load "
          f"{os.getloadavg()[0]:.2f}")
    return values


def sqlite_sizes(engine: Engine) -> dict[str, tuple[int, int, int]]:
    """{table: (data bytes, 0, index bytes)} from dbstat's pages in use."""
    with engine.connect() as conn:
        conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))  # the file then holds every page
        owner: dict[str, str] = {str(name): str(table) for name, table in conn.execute(text(
            "SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')"))}
        sizes: dict[str, list[int]] = {}
        for name, size in conn.execute(text("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")):
            table = owner.get(name, name)
            entry = sizes.setdefault(table, [0, 0, 0])
            entry[0 if name == table else 2] += int(size)
    return {table: (a, b, c) for table, (a, b, c) in sizes.items()}


def postgres_sizes(engine: Engine, full: bool = False) -> dict[str, tuple[int, int, int]]:
    """{table: (heap bytes, TOAST and other forks, index bytes)} after VACUUM (space of dead
    row versions kept for reuse) or VACUUM FULL (live rows only)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM FULL" if full else "VACUUM"))
        rows = conn.execute(text(
            "SELECT relname, pg_relation_size(oid), pg_total_relation_size(oid) "
            "- pg_relation_size(oid) - pg_indexes_size(oid), pg_indexes_size(oid) "
            "FROM pg_class WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace"))
        return {name: (int(a), int(b), int(c)) for name, a, b, c in rows}


def report(kind: str, sizes: dict[str, tuple[int, int, int]], values: int,
           file_bytes: int | None) -> None:
    print(f"  {'table':<18} {'data':>12} {'toast/other':>12} {'indexes':>12} {'total':>12} "
          f"{'B/value':>8}")
    for table, (data, other, index) in sorted(sizes.items(), key=lambda kv: -sum(kv[1])):
        total = data + other + index
        if total:
            print(f"  {table:<18} {data:>12,} {other:>12,} {index:>12,} {total:>12,} "
                  f"{total / values:>8.3f}")
    layer = sum(sum(sizes.get(table, (0, 0, 0))) for table in LAYER_TABLES)
    everything = sum(sum(v) for v in sizes.values())
    print(f"  {kind}: {values:,} layer-statistic values; layer tables (layer_stats + "
          f"layer_rollups, indexes included) {layer / values:.3f} B/value; the whole database "
          f"(steps, series rollups and all) {everything / values:.3f} B/value"
          + (f"; file {file_bytes / values:.3f} B/value" if file_bytes else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--layer-every", type=int, default=1)
    parser.add_argument("--batch", type=int, default=100, help="records per ingest batch")
    parser.add_argument("--worst", action="store_true",
                        help="every fraction non-zero (the least compressible statistics)")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs, shared)")
    for kind in (["sqlite", "postgres"] if args.db == "both" else [args.db]):
        print(f"{kind}:")
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp, \
                database(kind, Path(tmp)) as url:
            db.upgrade(url)
            engine = db.make_engine(url)
            try:
                values = build(engine, args)
                if kind == "sqlite":
                    sizes = sqlite_sizes(engine)
                    file_bytes: int | None = Path(url.removeprefix("sqlite:///")).stat().st_size
                else:
                    sizes, file_bytes = postgres_sizes(engine), None
                    report(kind + " after VACUUM", sizes, values, None)
                    # The rollups of the open buckets are rewritten by every batch: the space
                    # of their old versions is reused after each VACUUM, so it grows with the
                    # time between vacuums, not with the run. VACUUM FULL shows the live rows.
                    sizes, kind = postgres_sizes(engine, full=True), kind + " after VACUUM FULL"
            finally:
                engine.dispose()
            report(kind, sizes, values, file_bytes)


if __name__ == "__main__":
    main()
