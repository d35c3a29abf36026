"""The keyed reads of rollup rows on both dialects: every asked key that is stored, none other,
whether the keys fit one statement or need several."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.store import rollups, rollups_repository, stat_packing
from ampscope_server.store.models import LayerRollup, Rollup
from ampscope_server.store.sql_support import run_key
from tests.server.wire import batch, new_id, record
from tests.support.ingest import ingest_payload

STEPS = 600


@pytest.fixture
def run_id(sessions: sessionmaker[Session]) -> str:
    run_id = new_id()
    ingest_payload(sessions, batch([record(seq) for seq in range(STEPS)], run_id=run_id))
    return run_id


def _asked() -> list[tuple[int, int]]:
    """Every bucket of every level up to twice the run's length: stored and absent ones."""
    return [(level, bucket) for level in rollups.LEVELS
            for bucket in range(((2 * STEPS) >> level) + 1)]


@pytest.mark.parametrize("per_statement", [1000, 3])
def test_get_rollups_reads_exactly_the_stored_keys(
    sessions: sessionmaker[Session], run_id: str, per_statement: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rollups_repository, "KEYS_PER_STATEMENT", per_statement)
    with sessions() as session:
        stored = {(level, bucket): (series, steps) for level, bucket, series, steps in
                  session.execute(select(Rollup.level, Rollup.bucket, Rollup.series,
                                         Rollup.step_count)
                                  .where(Rollup.run_key == run_key(run_id)))}
        got = rollups_repository.get_rollups(session, run_id, _asked(),
                                             ("series", "step_count"))
    assert len(stored) == 38 + 10 + 3 + 4  # 600 steps in buckets of 16, 64, 256, 1024 and up
    assert sorted(got) == sorted((level, bucket, *value)
                                 for (level, bucket), value in stored.items())


@pytest.mark.parametrize("per_statement", [1000, 3])
def test_get_layer_rollups_reads_exactly_the_stored_keys(
    sessions: sessionmaker[Session], run_id: str, per_statement: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rollups_repository, "KEYS_PER_STATEMENT", per_statement)
    with sessions() as session:
        stored = dict(((level, bucket), data) for level, bucket, data in session.execute(
            select(LayerRollup.level, LayerRollup.bucket, LayerRollup.data)
            .where(LayerRollup.run_key == run_key(run_id))).all())
        got = rollups_repository.get_layer_rollups(session, run_id, _asked())
    # Closed buckets only: 9 of 64 steps, 2 of 256 (every step has layer statistics).
    assert sorted(stored) == [(6, bucket) for bucket in range(9)] + [(8, 0), (8, 1)]
    assert got == stored


STORED_RANGES = [(6, 0, 8), (8, 0, 1)]  # the closed buckets of the fixture's run: stored rows


@pytest.mark.slow
@pytest.mark.parametrize("rows", [None, [1, 0], [1, 40]], ids=["all", "picked", "past"])
@pytest.mark.parametrize("names", [["amax"], ["inf_count", "l2", "amin_nz"],
                                   list(rollups.ROLLUP_STATS)])
def test_some_statistics_of_stored_rows_equal_the_whole_rows(
    sessions: sessionmaker[Session], run_id: str, names: list[str], rows: list[int] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On Postgres the database cuts the asked statistics' segments out of each blob; what is
    decoded from them is what the whole blob gives, and no whole blob is decoded. Picked rows
    are those layers' values in the asked order; a layer past the table holds MISSING."""
    with sessions() as session:
        whole = rollups_repository.layer_rollup_arrays(session, run_id, STORED_RANGES)
        postgres = session.get_bind().dialect.name == "postgresql"
        if postgres:
            monkeypatch.setattr(rollups, "unpack_layers", _never)
        some = rollups_repository.layer_rollup_arrays(session, run_id, STORED_RANGES, names,
                                                      rows)
    assert sorted(whole) == [(6, bucket) for bucket in range(9)] + [(8, 0), (8, 1)]
    assert some == {key: {name: arrays[name] if rows is None else [
        arrays[name][row] if row < len(arrays[name]) else rollups.MISSING[name] for row in rows]
        for name in names} for key, arrays in whole.items()}


def _never(*args: object) -> None:
    raise AssertionError("a whole blob was decoded")


def test_a_row_of_the_first_version_is_read_whole(
    sessions: sessionmaker[Session], run_id: str,
) -> None:
    """A blob written before revision 0015 (version 1, no segments) still reads right."""
    with sessions() as session, session.begin():
        blob = session.scalars(select(LayerRollup.data).where(
            LayerRollup.run_key == run_key(run_id), LayerRollup.level == 8,
            LayerRollup.bucket == 1)).one()
        arrays = rollups.unpack_layers(blob)
        first = stat_packing.pack([arrays[name] for name in rollups.ROLLUP_STATS],
                                  "".join("q" if name in rollups.INT_STATS else "d"
                                          for name in rollups.ROLLUP_STATS))
        assert first[0] == stat_packing.VERSION
        session.execute(update(LayerRollup).where(
            LayerRollup.run_key == run_key(run_id), LayerRollup.level == 8,
            LayerRollup.bucket == 1).values(data=first))
    with sessions() as session:
        got = rollups_repository.layer_rollup_arrays(session, run_id, STORED_RANGES,
                                                     ["l2", "nan_count"])
    assert got[(8, 1)] == {"l2": arrays["l2"], "nan_count": arrays["nan_count"]}
    assert len(got) == 11
