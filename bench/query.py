"""Chart query times on a long run (DESIGN.md §8: ≤ 150 ms server time, any zoom).

Builds a run of --steps x --layers through the real ingest path (`ingest.ingest_batch` on
validated wire batches, one transaction per batch, rollups included): in-process rather than
over HTTP so that the build measures the server's ingest work, not JSON encoding in this
process, and stays a few minutes long. Then times each chart query two ways: the service
function (`chart_reads.series_read` / `heatmap_read`, a fresh session each time) and a full HTTP
request through the ASGI app in process (routing, validation, JSON), printing median and p95 ms
and the rows read (counted at the repository functions the charts call).

The comparison (GET /api/compare) needs a second run as long: a copy of the first made in SQL
(steps, layer statistics, rollups; building it through ingest would double the build), whose
loss drifts 20 % up from 80 % of the run, the raw steps and their rollups alike, so the
divergence search has a real divergence to find.

    .venv/bin/python bench/query.py                      # SQLite, 100k x 200
    .venv/bin/python bench/query.py --db postgresql+psycopg://postgres@127.0.0.1/bench
    .venv/bin/python bench/query.py --steps 20000 --layers 50 --repeat 10

`bench/query.py reads` measures the other reads of issue #11 through a real server instead: the
runs list (2,000 runs x 1,000 steps by default), its socket, the run page's requests and a
Chromium first paint, with data built through HTTP ingest (`bench/query_reads.py`).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from fastapi.testclient import TestClient
from sqlalchemy import Engine, Table, func, insert, literal, select, update
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.api.app import create_app
from ampscope_server.charts import event_reads
from ampscope_server.charts import reads as chart_reads
from ampscope_server.compare import reads as comparison_reads
from ampscope_server.config import Settings
from ampscope_server.ingest import batches as ingest
from ampscope_server.ingest.wire import IngestBatch
from ampscope_server.store import db, rollups, rollups_repository, steps_repository
from ampscope_server.store.models import Attempt, Layer, LayerRollup, LayerStat, Rollup, Run, Step

ROWS = {"n": 0}


def _counting(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        ROWS["n"] += len(result)
        return result
    return wrapper


for _module, _names in ((steps_repository, ("series_rows", "heatmap_rows", "event_rows")),
                        (rollups_repository, ("rollup_pieces", "rollup_rows", "layer_rollup_arrays",
                                              "layer_steps_in"))):
    for _name in _names:
        setattr(_module, _name, _counting(getattr(_module, _name)))


def _batch(
    run_id: str, attempt_id: str, first: int, count: int, layers: int, spike_step: int,
    skip_every: int = 0,
) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    for step in range(first, first + count):
        # One isolated overflow in the run, and with skip_every one every skip_every steps.
        spike = step == spike_step or (skip_every > 0 and step % skip_every == skip_every - 1)
        records.append({
            "seq": step, "step": step, "wall_time": 1.7e9 + step, "loss": 2.0 - step * 1e-6,
            "scale_before": 65536.0, "scale_after": 32768.0 if spike else 65536.0,
            "growth_tracker": 0, "found_inf": spike, "skipped": spike,
            "grad_norm": "inf" if spike else 1.0 + (step % 7) * 0.01, "lr": 1e-3,
            "duration": 0.01,
            "layers": {
                "amax": [0.5 + (i % 5) * 0.1 for i in range(layers)],
                "amin_nz": [1e-8] * layers,
                "zero_frac": [0.01 * (i % 3) for i in range(layers)],
                "subnormal_frac": [0.001] * layers,
                "underflow_frac": [0.5 if spike and i == 3 else 0.0001 for i in range(layers)],
                "nan_count": [0] * layers, "inf_count": [0] * layers,
                "l2": [1.0] * layers,
            },
        })
        if skip_every > 0:  # wire v2: the layers that went non-finite, which /events reads
            records[-1]["nonfinite"] = (
                [{"layer": 3 % layers, "kind": "inf"}, {"layer": 7 % layers, "kind": "nan"}]
                if spike and layers > 7 else [])
    return {
        "schema_version": 2 if skip_every > 0 else 1,
        "run": {"id": run_id, "project": "bench", "name": "long", "tags": [], "config": {},
                "host": "bench", "rank": 0, "target_format": "fp16"},
        "attempt": {"id": attempt_id, "pid": 1, "started_at": 1.7e9},
        "layers": [{"index": i, "name": f"layer{i}.weight", "shape": [64, 64],
                    "dtype": "float32", "numel": 4096, "module_type": "Linear"}
                   for i in range(layers)],
        "records": records, "final": False,
    }


def build(factory: sessionmaker[Session], steps: int, layers: int, per_batch: int,
          skip_every: int = 0) -> str:
    run_id, attempt_id = str(uuid.uuid4()), str(uuid.uuid4())
    ingest_s = 0.0
    for first in range(0, steps, per_batch):
        payload = IngestBatch.model_validate(
            _batch(run_id, attempt_id, first, min(per_batch, steps - first), layers,
                   int(steps * 0.618), skip_every))
        began = time.perf_counter()
        with factory() as session, session.begin():
            ingest.ingest_batch(session, payload)
        ingest_s += time.perf_counter() - began
    values = steps * layers * 8
    print(f"built {steps} steps x {layers} layers in batches of {per_batch}: ingest "
          f"{ingest_s:.1f} s, {values / ingest_s:,.0f} layer-stat values/s")
    return run_id


DRIFT = 1.2
"""The copy's loss is the original's times this from its drift step on."""


def copy_run(engine: Engine, run_id: str, drift_step: int) -> str:
    """A copy of `run_id` (new ids) whose loss is DRIFT x the original's from `drift_step` on."""
    new_id, attempt_id = str(uuid.uuid4()), str(uuid.uuid4())
    began = time.perf_counter()
    steps, stats = cast(Table, Step.__table__), cast(Table, LayerStat.__table__)
    with engine.begin() as conn:
        offset = conn.execute(select(func.max(steps.c.id))).scalar_one()

        def copy(table: Any, where: Any, values: dict[str, Any]) -> None:
            """Copy `table`'s rows matching `where`, `values` replacing columns (None: left out,
            for the database to fill)."""
            columns = [c for c in table.columns if values.get(c.name, c) is not None]
            conn.execute(insert(table).from_select([c.name for c in columns], select(*[
                values[c.name].label(c.name) if c.name in values else c
                for c in columns]).where(where)))

        runs = cast(Table, Run.__table__)
        # The copy's integer key (revision 0010): Postgres' identity fills it, SQLite takes the
        # largest + 1 as the server does.
        key = (None if engine.dialect.name == "postgresql"
               else select(func.max(runs.c.key) + 1).scalar_subquery())
        copy(runs, runs.c.id == run_id,
             {"id": literal(new_id), "name": literal("long-copy"), "status": literal("finished"),
              "key": key})
        old_key = select(runs.c.key).where(runs.c.id == run_id).scalar_subquery()
        new_key = select(runs.c.key).where(runs.c.id == new_id).scalar_subquery()
        attempts = cast(Table, Attempt.__table__)
        copy(attempts, attempts.c.run_id == run_id,
             {"id": literal(attempt_id), "run_id": literal(new_id)})
        layers = cast(Table, Layer.__table__)
        copy(layers, layers.c.run_id == run_id, {"run_id": literal(new_id)})
        drifted = (steps.c.step >= drift_step)
        # Steps keep their attempt ordinal; the copy's one attempt has the original's ordinal.
        copy(steps, steps.c.run_key == old_key, {"id": steps.c.id + offset, "run_key": new_key})
        conn.execute(update(steps).where(steps.c.run_key == new_key, drifted)
                     .values(loss=steps.c.loss * DRIFT))
        source_ids = select(steps.c.id).where(steps.c.run_key == old_key)
        copy(stats, stats.c.step_id.in_(source_ids),
             {"step_id": stats.c.step_id + offset, "run_key": new_key})
        layer_rollups = cast(Table, LayerRollup.__table__)
        copy(layer_rollups, layer_rollups.c.run_key == old_key, {"run_key": new_key})
        table = cast(Table, Rollup.__table__)
        copy(table, table.c.run_key == old_key, {"run_key": new_key})
        # The copy's rollups follow its loss: buckets past the drift scaled, those across it
        # widened to both (min/max over all of the bucket's values, as ingest keeps them).
        index = rollups.SERIES.index("loss")
        rows = conn.execute(select(table.c.level, table.c.bucket, table.c.series)
                            .where(table.c.run_key == new_key)).all()
        for level, bucket, blob in rows:
            first, last = bucket << level, ((bucket + 1) << level) - 1
            if last < drift_step:
                continue
            accs = rollups.unpack_series(blob)
            acc = accs[index]
            if first >= drift_step:
                acc.lo, acc.hi = acc.lo * DRIFT, acc.hi * DRIFT
            else:
                acc.lo, acc.hi = min(acc.lo, acc.lo * DRIFT), max(acc.hi, acc.hi * DRIFT)
            acc.last *= DRIFT
            conn.execute(update(table).where(
                table.c.run_key == new_key, table.c.level == level, table.c.bucket == bucket,
            ).values(series=rollups.pack_series(accs)))
    print(f"copied it as run {new_id[:8]} (loss x{DRIFT} from step {drift_step}) in "
          f"{time.perf_counter() - began:.1f} s")
    return new_id


def _compare(session: Session, run: Run, *, other: str) -> Any:
    return comparison_reads.compare_runs(session, [run.id, other], 0.05, 0.01, 300.0)


def _series(session: Session, run: Run, *, name: Any, start: int | None,
            end: int | None) -> Any:
    return chart_reads.series_read(session, run, name, 2000, start, end)


def _skip_rate(session: Session, run: Run, *, start: int | None, end: int | None) -> Any:
    return event_reads.skip_rate_read(session, run, 2000, 100, start, end)


def _heatmap(session: Session, run: Run, *, stat: Any, start: int | None,
             end: int | None) -> Any:
    return chart_reads.heatmap_read(session, run, stat, start, end)


EVENT_PAGE_STEPS = 1000
"""Event steps per page, as the run page asks (web/js/run.js)."""


def _events(session: Session, run: Run, *, start: int | None, end: int | None) -> Any:
    return event_reads.events_page(session, run, start, end, EVENT_PAGE_STEPS)


def _points(result: Any) -> int:
    if hasattr(result, "events"):
        return len(result.events)
    if hasattr(result, "points"):
        return len(result.points)
    if hasattr(result, "steps"):
        return len(result.steps)
    return sum(len(c.layers) for c in result.comparisons)  # compare: layers compared


def _stats(times: list[float]) -> str:
    times = sorted(times)
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return f"{statistics.median(times) * 1e3:7.1f} {p95 * 1e3:7.1f}"


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f} on {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="SQLAlchemy URL (default: a fresh SQLite file)")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--batch", type=int, default=100, help="steps per ingest batch")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--only", help="time only the queries whose label holds this text "
                                       "(e.g. skip-rate; the build is the same)")
    parser.add_argument("--skip-every", type=int, default=0,
                        help="also skip every Nth step, with two non-finite layers (wire v2), "
                             "so /events has pages to read (default: one skipped step)")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory()
    url = args.db or f"sqlite:///{Path(tmp.name) / 'bench.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    factory = db.make_session_factory(engine)
    print(f"before the build: {_load()}")
    run_id = build(factory, args.steps, args.layers, args.batch, args.skip_every)
    n = args.steps
    other = copy_run(engine, run_id, int(n * 0.8))
    zooms = {"full": (None, None), "zoom 1/10": (n // 3, n // 3 + n // 10),
             "zoom 1/100": (n // 2, n // 2 + n // 100), "zoom 1/1000": (n // 5, n // 5 + n // 1000)}
    queries: list[tuple[str, Callable[[Session, Run], Any], str]] = []
    for zoom, (start, end) in zooms.items():
        qs = "" if start is None else f"&start={start}&end={end}"
        for name in ("scale", "loss", "grad_norm"):
            queries.append((
                f"series {name:9} {zoom}",
                functools.partial(_series, name=name, start=start, end=end),
                f"/api/runs/{run_id}/series/{name}?max_points=2000{qs}"))
        for stat in ("lost_frac", "headroom_bits"):
            queries.append((
                f"heatmap {stat:13} {zoom}",
                functools.partial(_heatmap, stat=stat, start=start, end=end),
                f"/api/runs/{run_id}/layer-stats?stat={stat}{qs}"))
        # The first page of events (EVENT_PAGE_STEPS event steps) of the range, as the run
        # page asks at load (full) and for a zoomed range.
        queries.append((
            f"events {'':16} {zoom}",
            functools.partial(_events, start=start, end=end),
            f"/api/runs/{run_id}/events?limit={EVENT_PAGE_STEPS}{qs}"))
        # The skip rate: every step's flag up to 10,000 steps, the rollups' skip counts past
        # that (revision 0013); its rows are not counted.
        queries.append((
            f"skip-rate {'':13} {zoom}",
            functools.partial(_skip_rate, start=start, end=end),
            f"/api/runs/{run_id}/skip-rate?max_points=2000{qs}"))
    queries.append(("compare 2 runs", functools.partial(_compare, other=other),
                    f"/api/compare?runs={run_id},{other}"))
    if args.only:
        queries = [query for query in queries if args.only in query[0]]
    print(f"before the queries: {_load()}")
    print(f"{'query':36} {'service ms':>15} {'HTTP ms':>15} {'rows':>7} {'points':>7}")
    print(f"{'':36} {'median    p95':>15} {'median    p95':>15}")
    # Loopback, as `ampscope serve`'s default: the gate answers only the hosts it is bound to.
    with TestClient(create_app(Settings(db_url=url)), base_url="http://127.0.0.1") as client:
        for label, call, path in queries:
            service: list[float] = []
            for _ in range(args.repeat):
                with factory() as session:
                    run = session.get(Run, run_id)
                    assert run is not None
                    ROWS["n"] = 0
                    began = time.perf_counter()
                    result = call(session, run)
                    service.append(time.perf_counter() - began)
            rows = ROWS["n"]
            points = _points(result)
            http: list[float] = []
            for _ in range(args.repeat):
                began = time.perf_counter()
                response = client.get(path)
                http.append(time.perf_counter() - began)
                assert response.status_code == 200, response.text
            print(f"{label:36} {_stats(service)} {_stats(http)} {rows:7} {points:7}")
    print(f"after the queries: {_load()}")
    engine.dispose()
    tmp.cleanup()


if __name__ == "__main__":
    if sys.argv[1:2] == ["reads"]:  # the runs list, its socket, the run page, Chromium
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import query_reads  # type: ignore[import-not-found]

        query_reads.main(sys.argv[2:])
    else:
        main()
