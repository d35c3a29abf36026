"""Rollups on both dialects: equal to a brute force over the raw rows, idempotent, spike-proof."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.charts import reads as chart_reads
from ampscope_server.store import db, rollups, rollups_repository, steps_repository
from ampscope_server.store.float_storage import from_storage
from ampscope_server.store.models import LAYER_STAT_NAMES, LayerRollup, Rollup, Run, Step
from ampscope_server.store.sql_support import run_key
from tests.server.wire import LAYERS, batch, layer_stats, new_id, record
from tests.support.ingest import ingest_payload

Key = tuple[int, int]


def _random_record(rng: random.Random, seq: int, step: int) -> dict[str, Any]:
    def value() -> Any:
        return rng.choice([rng.uniform(-5, 5), rng.uniform(-5, 5), "nan", "inf", "-inf", None])

    rec = record(seq, step=step, loss=value(), grad_norm=value(), lr=value(),
                 scale_before=rng.choice([65536.0, 2.0**rng.randint(0, 20), None, "inf"]),
                 with_layers=rng.random() < 0.8)
    if rec["layers"] is not None:
        stats = rec["layers"]
        stats["amax"] = [rng.choice([rng.uniform(0, 9), 0.0, None]) for _ in range(2)]
        stats["amin_nz"] = [rng.choice([rng.uniform(1e-9, 1), None]) for _ in range(2)]
        stats["zero_frac"] = [rng.uniform(0, 0.5) for _ in range(2)]
        stats["underflow_frac"] = [rng.uniform(0, 0.5) for _ in range(2)]
        stats["nan_count"] = [rng.randint(0, 16) for _ in range(2)]
        stats["l2"] = [rng.choice([rng.uniform(0, 9), None]) for _ in range(2)]
    return rec


def _stored(session: Session, run_id: str) -> dict[Key, tuple[bytes, bytes | None]]:
    """{(level, bucket): (series blob, packed per-layer rollup or None)}."""
    layers = {
        (level, bucket): data for level, bucket, data in session.execute(
            select(LayerRollup.level, LayerRollup.bucket, LayerRollup.data)
            .where(LayerRollup.run_key == run_key(run_id)))
    }
    rows = session.execute(
        select(Rollup.level, Rollup.bucket, Rollup.series)
        .where(Rollup.run_key == run_key(run_id)))
    out = {(level, bucket): (series, layers.pop((level, bucket), None))
           for level, bucket, series in rows}
    assert layers == {}  # no per-layer rollup without its series rollup
    return out


def _stored_layer_keys(session: Session, run_id: str) -> set[Key]:
    return {(int(level), int(bucket)) for level, bucket in session.execute(
        select(LayerRollup.level, LayerRollup.bucket)
        .where(LayerRollup.run_key == run_key(run_id)))}


def _brute_force(session: Session, run_id: str) -> dict[Key, rollups.Bucket]:
    """Every level's buckets straight from the raw rows, one step at a time."""
    steps = session.execute(
        select(Step).where(Step.run_key == run_key(run_id)).order_by(Step.step, Step.id)
    ).scalars().all()
    out: dict[Key, rollups.Bucket] = {}
    for step in steps:
        values = [from_storage(getattr(step, name), getattr(step, f"{name}_class"))
                  for name in rollups.SERIES]
        stats = steps_repository.layer_stats_of(session, [step.id])
        for level in rollups.LEVELS:
            bucket = out.setdefault((level, step.step >> level), rollups.Bucket())
            for acc, value in zip(bucket.series, values, strict=True):
                if value is None:
                    continue
                acc.n += 1
                if not math.isnan(value):
                    acc.lo = value if math.isnan(acc.lo) else min(acc.lo, value)
                    acc.hi = value if math.isnan(acc.hi) else max(acc.hi, value)
                acc.last, acc.last_step = value, step.step
            if stats and level in rollups.LAYER_LEVELS:
                layers = {name: [getattr(s, name) for s in stats] for name in LAYER_STAT_NAMES}
                bucket.layers = rollups.merge_layers(
                    bucket.layers, rollups.step_layers(layers, values[0]))
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _layer_steps(session: Session, run_id: str, level: int, bucket: int) -> int:
    return len(rollups_repository.layer_steps_in(
        session, run_id, bucket << level, ((bucket + 1) << level) - 1))


def _check_against_brute_force(sessions: sessionmaker[Session], run_id: str) -> None:
    """Series rollups stored for every bucket of `SERIES_LEVELS`; per-layer rows for exactly
    the closed buckets that keep one (`rollups.keeps_row`); every read equal to the brute
    force, at every level."""
    with sessions() as session:
        stored = _stored(session, run_id)
        expected = _brute_force(session, run_id)
        extent = rollups_repository.step_extent(session, run_id)
        assert extent is not None
        assert set(stored) == {key for key in expected if key[0] in rollups.SERIES_LEVELS}
        for key, bucket in expected.items():
            level, index = key
            read_series = rollups_repository.rollup_rows(session, run_id, level, index, index,
                                                         ["series"])
            series_blob, layers_blob = stored.get(key, (read_series[0][1], None))
            assert read_series == [(index, series_blob)], key
            for mine, theirs in zip(rollups.unpack_series(series_blob), bucket.series,
                                    strict=True):
                assert (mine.n, mine.last_step) == (theirs.n, theirs.last_step), key
                assert all(_same(x, y) for x, y in ((mine.lo, theirs.lo), (mine.hi, theirs.hi),
                                                    (mine.last, theirs.last))), key
            if level not in rollups.LAYER_LEVELS:
                assert layers_blob is None, key
                continue
            keeps = rollups.is_closed(level, index, extent[1]) and rollups.keeps_row(
                level, bucket.layers, _layer_steps(session, run_id, level, index))
            assert (layers_blob is not None) == keeps, key
            if layers_blob is not None:
                assert rollups.unpack_layers(layers_blob) == bucket.layers, key
            read = rollups_repository.layer_rollup_arrays(session, run_id, [(level, index, index)])
            assert read.get(key) == bucket.layers, key
            # One heatmap's statistics only: a stored row decodes just those, a fold holds all.
            names = [rollups.ROLLUP_STATS[0], rollups.ROLLUP_STATS[-1]]
            part = rollups_repository.layer_rollup_arrays(
                session, run_id, [(level, index, index)], names)
            if bucket.layers is None:
                assert key not in part, key
                continue
            assert {n: part[key][n] for n in names} == {n: bucket.layers[n] for n in names}, key
            assert set(part[key]) == (set(names) if layers_blob is not None
                                      else set(rollups.ROLLUP_STATS)), key


class TestMaintainedAtIngest:
    @pytest.mark.slow
    def test_equal_to_brute_force_with_nonfinite_out_of_order_and_resumed_steps(
        self, sessions: sessionmaker[Session]
    ) -> None:
        rng = random.Random(7)
        run_id = new_id()
        steps = list(range(300))
        rng.shuffle(steps)  # spool replay: batches arrive out of step order
        records = [_random_record(rng, seq, step) for seq, step in enumerate(steps)]
        for start in range(0, 300, 37):
            ingest_payload(sessions, batch(records[start:start + 37], run_id=run_id))
        # a resumed attempt repeats steps 100..139 with new values
        resumed = [_random_record(rng, seq, 100 + seq) for seq in range(40)]
        ingest_payload(sessions, batch(resumed, run_id=run_id, attempt_id=new_id()))
        _check_against_brute_force(sessions, run_id)

    @pytest.mark.slow
    def test_sparse_cadence_and_resumes_into_closed_buckets(
        self, sessions: sessionmaker[Session]
    ) -> None:
        """Layer statistics every 10th step (the hook's default): no 64-step row (6 or 7 layer
        steps each), every wider closed bucket a row; a resumed attempt re-sending old steps
        into closed buckets, sparse or not, and one that makes a sparse bucket dense."""
        rng = random.Random(11)
        run_id = new_id()
        records = [dict(_random_record(rng, step, step), **(
            {} if step % 10 == 0 else {"layers": None})) for step in range(1400)]
        for start in range(0, 1400, 100):
            ingest_payload(sessions, batch(records[start:start + 100], run_id=run_id))
        with sessions() as session:
            levels = {level for level, _ in _stored_layer_keys(session, run_id)}
        assert levels == {8, 10}  # closed: 256-step buckets 0..4, the 1024-step bucket 0
        _check_against_brute_force(sessions, run_id)
        resumed = [dict(rec, layers=rec["layers"] or layer_stats(seed=2.0))  # dense now
                   for rec in (_random_record(rng, seq, 130 + seq) for seq in range(30))]
        resumed += [dict(_random_record(rng, 30 + seq, 900 + seq * 10), layers=layer_stats(
            seed=float(seq))) for seq in range(5)]
        ingest_payload(sessions, batch(resumed, run_id=run_id, attempt_id=new_id()))
        with sessions() as session:
            assert (6, 2) in _stored_layer_keys(session, run_id)  # 7 + 30 layer steps > 16
        _check_against_brute_force(sessions, run_id)

    def test_a_row_is_written_when_its_bucket_closes(
        self, sessions: sessionmaker[Session]
    ) -> None:
        run_id = new_id()
        ingest_payload(sessions, batch([record(i, layers=layer_stats(seed=float(i % 7)))
                                 for i in range(100)], run_id=run_id))
        with sessions() as session:
            assert _stored_layer_keys(session, run_id) == {(6, 0)}
        # A batch inside the open buckets writes no per-layer row (on Postgres: no dead one).
        ingest_payload(sessions, batch([record(i) for i in range(100, 120)], run_id=run_id))
        with sessions() as session:
            assert _stored_layer_keys(session, run_id) == {(6, 0)}
        # A gap: the bucket holding the old last step closes with no new step of its own.
        ingest_payload(sessions, batch([record(i, step=i * 300) for i in range(120, 125)],
                                run_id=run_id))
        with sessions() as session:
            keys = _stored_layer_keys(session, run_id)
        assert {(6, 1), (8, 0), (10, 0), (12, 0), (14, 0)} <= keys
        assert not {key for key in keys if key[0] == 16}
        _check_against_brute_force(sessions, run_id)

    def test_duplicates_do_not_double_count(self, sessions: sessionmaker[Session]) -> None:
        run_id = new_id()
        payload = batch([record(i, loss=float(i)) for i in range(50)], run_id=run_id)
        ingest_payload(sessions, payload)
        with sessions() as session:
            before = _stored(session, run_id)
        ingest_payload(sessions, payload)
        ingest_payload(sessions, batch([record(i) for i in range(40, 60)], run_id=run_id))
        with sessions() as session:
            after = _stored(session, run_id)
            assert after[(4, 0)] == before[(4, 0)]
            counts = rollups.unpack_series(after[(16, 0)][0])
            assert [acc.n for acc in counts] == [60, 60, 60, 60, 59]  # duration null at seq 0

    def test_a_failed_batch_leaves_no_rollup(self, sessions: sessionmaker[Session]) -> None:
        run_id = new_id()
        bad = batch([record(0), record(1, layers=layer_stats(n=3))], run_id=run_id)
        with pytest.raises(Exception, match="layer"):
            ingest_payload(sessions, bad)
        with sessions() as session:
            assert _stored(session, run_id) == {}


STEPS = 20_000
SPIKE = 13_337


@pytest.fixture
def long_run(sessions: sessionmaker[Session]) -> str:
    """20k steps x 2 layers, one overflow spike (grad_norm inf, layer 1 all lost)."""
    run_id = new_id()
    base = record(0)
    for start in range(0, STEPS, 5000):
        records = []
        for i in range(start, start + 5000):
            rec = dict(base, seq=i, step=i, grad_norm=1.0, duration=0.01)
            if i == SPIKE:
                rec = dict(rec, grad_norm="inf", layers=dict(
                    base["layers"], zero_frac=[0.0, 0.5], underflow_frac=[0.0, 0.5],
                    amax=[0.5, 60000.0]))
            records.append(rec)
        ingest_payload(sessions, batch(records, run_id=run_id, layers=LAYERS))
    return run_id


ZOOMS = [(None, None, 2000), (None, None, 7), (0, 19_999, 300), (13_000, 13_700, 50),
         (13_330, 13_345, 4), (SPIKE, SPIKE, 10), (1, 19_998, 1000), (9_999, 15_003, 3)]


@pytest.mark.slow
class TestSpikeSurvivesEveryZoom:
    def test_series_and_heatmaps(self, sessions: sessionmaker[Session], long_run: str) -> None:
        for start, end, max_points in ZOOMS:
            self._check(sessions, long_run, start, end, max_points)

    def _check(
        self, sessions: sessionmaker[Session], long_run: str, start: int | None,
        end: int | None, max_points: int,
    ) -> None:
        with sessions() as session:
            run = session.get(Run, long_run)
            assert run is not None
            series = chart_reads.series_read(session, run, "grad_norm", max_points, start, end)
            assert len(series.points) <= max_points
            spikes = [p for p in series.points if p.max == math.inf]
            assert len(spikes) == 1
            assert all(p.min == 1.0 for p in series.points if p not in spikes)
            steps = [p.step for p in series.points]
            assert steps == sorted(steps) and steps[0] == (start or 0)
            assert spikes[0].step <= SPIKE
            lost = chart_reads.heatmap_read(session, run, "lost_frac", start, end,
                                       max_points=max_points)
            assert len(lost.steps) <= max_points
            assert max(v for v in lost.z[1] if v is not None) == 1.0
            assert lost.z[1].count(1.0) == 1
            assert max(v for v in lost.z[0] if v is not None) == 0.0
            head = chart_reads.heatmap_read(session, run, "headroom_bits", start, end,
                                       max_points=max_points)
            worst = min(v for v in head.z[1] if v is not None)
            assert worst == pytest.approx(math.log2(65504.0 / (60000.0 * 65536.0)))

    def test_full_range_reads_a_bounded_number_of_rows(self) -> None:
        plan = rollups.plan(0, STEPS - 1, 200)
        assert plan is not None
        read = sum(last - first + 1 for _, first, last in plan.ranges)
        assert read <= 200 and sum(b - a + 1 for a, b in plan.raw) < 2 * rollups.FINEST_WIDTH


class TestBackfill:
    @pytest.mark.slow
    def test_upgrade_backfills_what_ingest_maintains(
        self, sessions: sessionmaker[Session], migrated_url: str
    ) -> None:
        run_id = new_id()
        rng = random.Random(3)
        ingest_payload(sessions, batch([_random_record(rng, i, i * 3) for i in range(200)],
                                run_id=run_id))
        with sessions() as session:
            expected = _stored(session, run_id)
        engine = sessions.kw["bind"]
        engine.dispose()
        db.downgrade(migrated_url, "0002")
        db.upgrade(migrated_url)
        with sessions() as session:
            assert _stored(session, run_id) == expected
            assert rollups_repository.step_extent(session, run_id) == (0, 597)


class TestReduceSteps:
    def test_equal_to_reducing_each_step_in_rollup_form(self) -> None:
        rng = random.Random(19)
        for trial in range(200):
            layers = rng.randint(1, 6)
            steps: list[tuple[dict[str, list[float | None]], float | None]] = []
            for _ in range(rng.randint(1, 9)):
                stats: dict[str, list[float | None]] = {
                    "amax": [rng.choice([rng.lognormvariate(0, 20), 0.0, None])
                             for _ in range(layers)],
                    "amin_nz": [rng.choice([rng.random() * 1e-6, None]) for _ in range(layers)],
                    "zero_frac": [rng.choice([0.0, rng.random()]) for _ in range(layers)],
                    "subnormal_frac": [rng.random() for _ in range(layers)],
                    "underflow_frac": [rng.choice([0.0, rng.random() / 7]) for _ in range(layers)],
                    "nan_count": [rng.randint(0, 3) for _ in range(layers)],
                    "inf_count": [rng.randint(0, 2**62) for _ in range(layers)],
                    "l2": [rng.choice([rng.random() * 9, None]) for _ in range(layers)],
                }
                # a few scales shared between steps, and the ones that give no headroom
                scale = rng.choice([65536.0, 65536.0, 2.0**-3, 3.0, None, math.inf, math.nan,
                                    0.0, -1.0, 1e308])
                steps.append((stats, scale))
            want = rollups.reduce_layers([rollups.step_layers(s, scale) for s, scale in steps])
            got = rollups.reduce_steps(steps)
            assert got == want, trial
