"""`steps_repository.insert_steps` on both dialects: rows that differ in which fields are None go
in together and read back as sent, already stored (run, attempt, seq) are skipped, and every new
row's id comes back by its seq."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.ingest import batches as ingest
from ampscope_server.ingest.wire import IngestBatch
from ampscope_server.store import runs_repository, steps_repository
from ampscope_server.store.models import Step
from tests.server.wire import batch, new_id

FIELDS = ("seq", "step", "loss", "grad_norm", "found_inf", "skipped", "nonfinite_count",
          "misuse_count", "captured")


def _row(key: int, seq: int) -> dict[str, Any]:
    """A `steps` row whose None fields change from row to row: a skipped step with non-finite
    layers every third, no loss every other, a misuse every fifth."""
    skipped = seq % 3 == 0
    return {
        "run_key": key, "attempt": 1, "seq": seq, "step": 10 * seq, "wall_time": 1.0 + seq,
        "loss": None if seq % 2 else 0.5 * seq, "loss_class": 1 if seq % 2 else 0,
        "scale_before": 1024.0, "scale_before_class": 0, "scale_after": 1024.0,
        "scale_after_class": 0, "growth_tracker": seq, "found_inf": skipped, "skipped": skipped,
        "grad_norm": None if skipped else 2.0 + seq, "grad_norm_class": 2 if skipped else 0,
        "lr": None, "lr_class": 0, "duration": None, "duration_class": 0,
        "captured": "after_unscale" if seq % 4 else None,
        "nonfinite_count": 2 if skipped else None, "misuse_count": 1 if seq % 5 == 0 else None,
    }


def _run_key(session: Session) -> int:
    payload = batch([], run_id=new_id())
    ingest.ingest_batch(session, IngestBatch.model_validate(payload))
    key = runs_repository.key_of(session, payload["run"]["id"])
    assert key is not None
    return key


@contextmanager
def _statements(session: Session) -> Iterator[list[str]]:
    """The SQL statements the session's connection runs meanwhile."""
    seen: list[str] = []
    connection = session.connection()

    def record(*args: Any) -> None:
        seen.append(args[2])

    event.listen(connection, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(connection, "before_cursor_execute", record)


def _stored(session: Session, key: int) -> dict[int, tuple[Any, ...]]:
    columns = [getattr(Step, name) for name in FIELDS]
    rows = session.execute(select(Step.id, *columns).where(Step.run_key == key)).all()
    return {row[0]: tuple(row[1:]) for row in rows}


def test_rows_with_different_none_fields_go_in_together(sessions: sessionmaker[Session]) -> None:
    with sessions() as session, session.begin():
        key = _run_key(session)
        rows = [_row(key, seq) for seq in range(600)]
        with _statements(session) as seen:
            ids = steps_repository.insert_steps(session, rows)
    assert sorted(ids) == list(range(600)) and len(set(ids.values())) == 600
    # One statement for all (an ORM bulk insert made one per change in the None fields: ~500).
    assert len([sql for sql in seen if "steps" in sql]) == 1, seen[:3]
    with sessions() as session:
        stored = _stored(session, key)
    assert stored == {ids[row["seq"]]: tuple(row[name] for name in FIELDS) for row in rows}


def test_stored_seqs_are_skipped_and_only_new_ids_returned(
    sessions: sessionmaker[Session],
) -> None:
    with sessions() as session, session.begin():
        key = _run_key(session)
        first = steps_repository.insert_steps(session, [_row(key, seq) for seq in range(10)])
        again = [_row(key, seq) for seq in range(5, 15)]
        again[0]["loss"] = 99.0  # a resent seq: the stored row stays as it was
        second = steps_repository.insert_steps(session, again)
    assert sorted(second) == list(range(10, 15)) and not set(second.values()) & set(first.values())
    with sessions() as session:
        stored = _stored(session, key)
        assert steps_repository.insert_steps(session, []) == {}
    assert len(stored) == 15 and stored[first[5]][2] is None  # seq 5 is odd: no loss, as first sent
