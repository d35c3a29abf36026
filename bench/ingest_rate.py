"""SQLite ingest rate with rollups (DESIGN.md §8: ≥ 1,000,000 layer-statistic values/s).

Ingests --steps x --layers through the real ingest path (`ingest.ingest_batch` on validated
wire batches, one transaction per batch of --batch steps, rollups included) into a fresh SQLite
file, in interleaved rounds of two variants measured in this same run:

- `current`: the server as it is;
- `previous`: the same with the per-layer rollups folded as before `rollups.reduce_steps`
  (kept below as a reference copy): every step's ten rollup arrays built, then reduced. (The
  earlier baselines, a row per layer inserted as dicts and pairwise merges, no longer apply:
  since revision 0006 a step's layer statistics are one packed row.)

Prints each variant's median values/s (8 stored statistics per layer per step; validation of
the wire batch is done before the clock starts, as bench/query.py does) and the ratio.

    .venv/bin/python bench/ingest_rate.py
    .venv/bin/python bench/ingest_rate.py --steps 2000 --layers 200 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ampscope_server.ingest import batches as ingest
from ampscope_server.ingest.wire import IngestBatch
from ampscope_server.store import db, rollups

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: find bench.*
from bench.query import _batch

VALUES_PER_LAYER = 8


# --- the previous implementation (a reference copy, for the baseline) ---------------------------

def _previous_accumulate(
    steps: Iterable[rollups.StepInput],
) -> dict[tuple[int, int], rollups.Bucket]:
    """`rollups.accumulate` before `reduce_steps`: every step's ten rollup arrays built
    (`step_layers`), then reduced."""
    finest, layer_finest = rollups.LEVELS[0], rollups.LAYER_LEVELS[0]
    out: dict[tuple[int, int], rollups.Bucket] = {}
    layers: dict[int, list[rollups.LayerArrays]] = {}
    for item in steps:
        bucket = out.setdefault((finest, item.step >> finest), rollups.Bucket())
        for acc, value in zip(bucket.series, item.series, strict=True):
            if value is not None:
                acc.add(item.step, value)
        if item.layers is not None:
            layers.setdefault(item.step >> layer_finest, []).append(
                rollups.step_layers(item.layers, item.series[0]))
    for coarser, finer in zip(rollups.LEVELS[1:], rollups.LEVELS, strict=False):
        groups: dict[int, list[rollups.Bucket]] = {}
        for (level, index), bucket in sorted(out.items()):
            if level == finer:
                groups.setdefault(index >> (coarser - finer), []).append(bucket)
        for index, group in groups.items():
            target = out.setdefault((coarser, index), rollups.Bucket())
            for bucket in group:
                for mine, theirs in zip(target.series, bucket.series, strict=True):
                    mine.merge(theirs)
            if coarser == layer_finest and index in layers:
                target.layers = rollups.reduce_layers(layers[index])
            elif coarser > layer_finest:
                with_layers = [b.layers for b in group if b.layers is not None]
                if with_layers:
                    target.layers = rollups.reduce_layers(with_layers)
    return out


@contextmanager
def _previous() -> Iterator[None]:
    saved = rollups.accumulate
    rollups.accumulate = _previous_accumulate
    try:
        yield
    finally:
        rollups.accumulate = saved


@contextmanager
def _current() -> Iterator[None]:
    yield


# --- the measurement -----------------------------------------------------------------------------

def _round(steps: int, layers: int, per_batch: int) -> float:
    """Values/s of one ingest of a fresh run into a fresh database."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'ingest.db'}"
        db.upgrade(url)
        engine = db.make_engine(url)
        factory = db.make_session_factory(engine)
        run_id, attempt_id = str(uuid.uuid4()), str(uuid.uuid4())
        batches = [
            IngestBatch.model_validate(_batch(run_id, attempt_id, first,
                                              min(per_batch, steps - first), layers, -1))
            for first in range(0, steps, per_batch)
        ]
        began = time.perf_counter()
        for payload in batches:
            with factory() as session, session.begin():
                ingest.ingest_batch(session, payload)
        elapsed = time.perf_counter() - began
        engine.dispose()
    return steps * layers * VALUES_PER_LAYER / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--batch", type=int, default=100, help="steps per ingest batch")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    variants: dict[str, Callable[[], Any]] = {"previous": _previous, "current": _current}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):  # interleaved: machine noise hits both alike
        for name, variant in variants.items():
            with variant():
                rates[name].append(_round(args.steps, args.layers, args.batch))
    print(f"SQLite ingest, {args.steps} steps x {args.layers} layers, batches of {args.batch}, "
          f"{args.rounds} rounds (median, min-max), layer-stat values/s:")
    for name, values in rates.items():
        print(f"  {name:9} {statistics.median(values):>12,.0f}   "
              f"({min(values):,.0f} - {max(values):,.0f})")
    ratio = statistics.median(rates["current"]) / statistics.median(rates["previous"])
    print(f"  current / previous = {ratio:.2f}x; budget 1,000,000/s: "
          f"{statistics.median(rates['current']) / 1e6:.2f}x of it")


if __name__ == "__main__":
    main()
