"""The skip rate of long ranges, read from the rollups' skip counts, on both dialects.

One run of 43,000 steps holds, for each window tested, a burst of `window` skipped steps and one
of 2·window - 1 (unaligned, 5,000 steps apart), a gap of 1,000 steps without any, and 500 steps
sent again by a resumed attempt as skipped (the rate counts a step number once, by its first
stored row, so they must not show). Each read is checked against a brute force over the raw
flags: the block maxima exactly (`skip_rates.blocks`' shape), the exact rolling rate for a
window under 16 steps, the tail, and the guarantees of `event_reads.skip_rate_read` for the
bursts, at several zooms and point counts.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.charts import event_reads, skip_rates
from ampscope_server.store import db, rollups
from ampscope_server.store.models import Rollup, Run
from ampscope_server.store.sql_support import run_key
from tests.server.wire import batch, new_id, record
from tests.support.ingest import ingest_payload

# A data-volume module: its one run of 43,000 steps takes 4-7 s to store per dialect. The fast
# tier reads skip rates through the API (test_event_reads) and checks their maths
# (test_skip_rates).
pytestmark = pytest.mark.slow

STEPS = 43_000
BURSTS = [(7, 7), (7, 13), (16, 16), (16, 31), (100, 100), (100, 199), (1000, 1000),
          (1000, 1999)]
"""(window, burst length), the i-th starting at step 2,037 + 5,000·i."""
GAP = range(40_000, 41_000)
RESENT = range(41_000, 41_500)


def _burst_start(index: int) -> int:
    return 2037 + 5000 * index


def _skipped(step: int) -> bool:
    return any(_burst_start(i) <= step < _burst_start(i) + length
               for i, (_, length) in enumerate(BURSTS))


def _ingest_steps(factory: sessionmaker[Session], run_id: str, steps: list[int],
                  skipped: bool | None, attempt_id: str | None = None) -> None:
    """`steps` in batches of 2,000, skipped as the bursts say (`skipped` None) or all alike."""
    for start in range(0, len(steps), 2000):
        records = [record(start + i, step=step, with_layers=False,
                          skipped=_skipped(step) if skipped is None else skipped)
                   for i, step in enumerate(steps[start:start + 2000])]
        ingest_payload(factory, batch(records, run_id=run_id, attempt_id=attempt_id))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def long_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[sessionmaker[Session], str]]:
    from tests.support.databases import migrated_database

    def build(url: str) -> Iterator[tuple[sessionmaker[Session], str]]:
        engine = db.make_engine(url)
        try:
            factory = db.make_session_factory(engine)
            run_id = new_id()
            _ingest_steps(factory, run_id, [s for s in range(STEPS) if s not in GAP], None)
            _ingest_steps(factory, run_id, list(RESENT), True, attempt_id=new_id())
            yield factory, run_id
        finally:
            engine.dispose()

    with migrated_database(request.param, tmp_path_factory.mktemp("skips")) as url:
        yield from build(url)


def _firsts(session: Session, run_id: str) -> list[tuple[int, bool]]:
    """(step, skipped) of each step number's first stored row, in step order: brute force."""
    out: dict[int, bool] = {}
    for step, skipped in session.execute(text(
            'SELECT s.step, s.skipped FROM steps s JOIN runs r ON r."key" = s.run_key '
            "WHERE r.id = :id ORDER BY s.step, s.id"), {"id": run_id}):
        out.setdefault(int(step), bool(skipped))
    return sorted(out.items())


def _exact(flags: list[tuple[int, bool]], window: int) -> list[tuple[int, float]]:
    """The rolling rate at every step, by prefix sums (independent of `RollingSkips`)."""
    steps = [step for step, _ in flags]
    prefix = [0]
    for _, skipped in flags:
        prefix.append(prefix[-1] + skipped)
    out = []
    for i, step in enumerate(steps):
        j = bisect_right(steps, step - window)
        out.append((step, (prefix[i + 1] - prefix[j]) / (i + 1 - j)))
    return out


def _block_points(flags: list[tuple[int, bool]], shape: skip_rates.Blocks, first: int,
                  last: int, width: int) -> list[tuple[int, float]]:
    """Brute force of the block maxima: per-bucket counts from the flags, k-bucket sums."""
    unit = shape.unit
    counts: dict[int, list[int]] = {}
    for step, skipped in flags:
        if (first >> shape.level) <= step >> shape.level <= last >> shape.level:
            pair = counts.setdefault(step >> shape.level, [0, 0])
            pair[0] += 1
            pair[1] += skipped
    final = (last - first) // width
    best: dict[int, float] = {}
    for bucket in counts:
        inside = [counts[b] for b in range(bucket - shape.units + 1, bucket + 1) if b in counts]
        rate = sum(p[1] for p in inside) / sum(p[0] for p in inside)
        column = min((bucket * unit + unit - 1 - first) // width, final)
        best[column] = max(rate, best.get(column, rate))
    return [(first + column * width, rate) for column, rate in sorted(best.items())]


def _narrow_points(flags: list[tuple[int, bool]], window: int, first: int, last: int,
                   width: int) -> list[tuple[int, float]]:
    """Brute force for a window under 16 steps: exact rates; a column shows when a 16-step
    bucket with steps ends in it or a positive rate lies in it."""
    inside = [(step, skipped) for step, skipped in flags if first <= step <= last]
    final = (last - first) // width
    level = rollups.SERIES_LEVELS[0]
    best: dict[int, float] = {
        min((((step >> level) + 1 << level) - 1 - first) // width, final): 0.0
        for step, _ in flags if (first >> level) <= step >> level <= last >> level}
    for step, rate in _exact(inside, window):
        column = (step - first) // width
        if rate > 0 or column in best:
            best[column] = max(rate, best.get(column, 0.0))
    return [(first + column * width, rate) for column, rate in sorted(best.items())]


ZOOMS = [(None, None), (20_000, 43_000), (31_500, 42_900), (2000, 12_500)]


@pytest.mark.parametrize("window", [7, 16, 40, 100, 1000])
@pytest.mark.parametrize("max_points", [2000, 50, 100_000])
def test_long_ranges_match_a_brute_force(long_run: tuple[sessionmaker[Session], str],
                                         window: int, max_points: int) -> None:
    _check_reads(long_run, window, max_points)


@pytest.mark.parametrize("window", [100, 1000])
def test_a_coarser_unit_past_the_row_bound(long_run: tuple[sessionmaker[Session], str],
                                           window: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """With at most 512 rows of a unit, 43,000 steps take 64-step units (k = 1 at a window of
    100): the guarantees hold with the coarser blocks."""
    monkeypatch.setattr(skip_rates, "MAX_BLOCK_ROWS", 1 << 9)
    assert skip_rates.blocks(window, STEPS, rollups.SERIES_LEVELS) == skip_rates.Blocks(
        6 if window == 100 else 8, window >> (6 if window == 100 else 8))
    _check_reads(long_run, window, 2000)


def _check_reads(long_run: tuple[sessionmaker[Session], str], window: int, max_points: int
                 ) -> None:
    factory, run_id = long_run
    with factory() as session:
        run = session.get(Run, run_id)
        assert run is not None
        flags = _firsts(session, run_id)
        assert len(flags) == STEPS - len(GAP)
        for start, end in ZOOMS:
            first, last = 0 if start is None else start, STEPS - 1 if end is None else min(
                end, STEPS - 1)
            got = event_reads.skip_rate_read(session, run, max_points, window, start, end)
            width = skip_rates.bucket_width(first, last, max_points)
            shape = skip_rates.blocks(window, last - first + 1, rollups.SERIES_LEVELS)
            want = (_narrow_points(flags, window, first, last, width) if shape is None
                    else _block_points(flags, shape, first, last, width))
            assert [(p.step, p.rate) for p in got.points] == want, (start, end)
            assert len(got.points) <= max_points and got.downsampled
            # The tail: the last window's first rows, as the exact read would leave it.
            assert got.tail == [(step, skipped) for step, skipped in flags
                                if last - window < step <= last and step >= first]
            _check_bursts(got.points, window, first, last, width, shape)


def _check_bursts(points: list[Any], window: int, first: int, last: int, width: int,
                  shape: skip_rates.Blocks | None) -> None:
    """A burst of `window` skipped steps shows ≥ 1/2 (≥ (2k-1)/(2k)), of 2·window - 1 shows 1.0,
    at a point within a block after the burst; elsewhere (5,000 steps away) nothing shows."""
    unit = 16 if shape is None else shape.unit
    floor = 1.0 if shape is None else (2 * shape.units - 1) / (2 * shape.units)
    for index, (burst_window, length) in enumerate(BURSTS):
        begin = _burst_start(index)
        if burst_window != window or not first <= begin or begin + 2 * length > last:
            continue
        # The points whose bucket meets the burst or the b steps after it.
        near = [p.rate for p in points
                if p.step + width > begin and p.step <= begin + length - 1 + unit]
        assert max(near) >= (1.0 if length == 2 * window - 1 else floor), (index, near)
        assert max(near) >= 0.5
    quiet = [p.rate for p in points if RESENT.start - 500 <= p.step < RESENT.stop]
    assert all(rate == 0.0 for rate in quiet)


def test_the_counts_take_each_step_number_once(long_run: tuple[sessionmaker[Session], str]
                                               ) -> None:
    """Every stored series rollup's counts equal the first rows' count by bucket: the resumed
    attempt's skipped re-sends did not count."""
    factory, run_id = long_run
    with factory() as session:
        flags = _firsts(session, run_id)
        want: dict[tuple[int, int], tuple[int, int]] = {}
        for step, skipped in flags:
            for level in rollups.SERIES_LEVELS:
                steps, skips = want.get((level, step >> level), (0, 0))
                want[(level, step >> level)] = (steps + 1, skips + skipped)
        got = {(int(level), int(bucket)): (int(steps), int(skips))
               for level, bucket, steps, skips in session.execute(
                   select(Rollup.level, Rollup.bucket, Rollup.step_count, Rollup.skip_count)
                   .where(Rollup.run_key == run_key(run_id)))}
        assert got == want
        assert got[(4, (RESENT.start + 16) >> 4)] == (16, 0)  # all re-sent as skipped
