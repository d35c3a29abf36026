"""The findings' reads of a run's steps on both dialects: the notable steps exactly, from their
partial index (revision 0017), not from a scan of every step of the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.store import findings_repository
from ampscope_server.store.float_storage import FloatClass
from tests.server.wire import batch, new_id, record
from tests.support.databases import Dialect, migrated_database, query_plan
from tests.support.ingest import ingest_payload


@pytest.fixture
def migrated_url(dialect: Dialect, tmp_path: Path) -> Iterator[str]:
    """Fresh copies: a test here reads the planner's choice (`query_plan` says why)."""
    with migrated_database(dialect, tmp_path, fresh=True) as url:
        yield url


SKIPPED = (5, 6, 15)  # two in a row: the step after the first is also skipped


def _run(sessions: sessionmaker[Session]) -> str:
    run_id = new_id()
    records = [record(i, with_layers=False) for i in range(40)]
    for step in SKIPPED:
        records[step].update(skipped=True, found_inf=True,
                             scale_after=records[step]["scale_before"] / 2)
    records[22]["loss"] = "nan"
    records[25]["scale_after"] = records[25]["scale_before"] * 2  # growth
    records[30]["found_inf"] = True  # not skipped: a step that bypassed the scaler
    records[33]["grad_norm"] = "inf"
    ingest_payload(sessions, batch(records, run_id=run_id))
    return run_id


def test_notable_steps_are_exactly_what_the_detectors_read(
    sessions: sessionmaker[Session],
) -> None:
    run_id = _run(sessions)
    with sessions() as session:
        every = findings_repository.findings_steps(session, run_id, True)
        notable = findings_repository.findings_steps(session, run_id, False)
    # The reference, from every step: the condition of the docstring, row for row.
    skipped = {row[1] for row in every if row[7]}
    expected = [row for row in every if (
        row[7] or row[6] or row[2] != row[4] or row[3] != row[5] or row[9] != 0
        or row[11] != 0 or row[1] - 1 in skipped or row[1] in (0, 39))]
    assert notable == expected
    assert [row[1] for row in notable] == [0, 5, 6, 7, 15, 16, 22, 25, 30, 33, 39]
    assert notable[6][8:10] == (None, FloatClass.NAN)  # step 22's loss, stored by its class


def test_notable_steps_are_read_from_their_partial_index(
    sessions: sessionmaker[Session],
) -> None:
    run_id = _run(sessions)
    with sessions() as session, session.begin():
        plan = query_plan(session, findings_repository.findings_steps_statement(run_id, False))
    assert any("ix_steps_run_key_notable_step" in line for line in plan), plan
