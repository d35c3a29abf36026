"""Events of a long run: more skipped steps than a database takes bound parameters in one
statement (SQLite's default limit is 32,766), read whole, by window and page by page (each page
with its own skipped steps' layers), on both dialects."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.charts import event_reads
from ampscope_server.charts import reads as chart_reads
from ampscope_server.charts.schemas import AnyEventRead, SkippedEventRead
from ampscope_server.ingest import batches as ingest
from ampscope_server.ingest.wire import IngestBatch
from ampscope_server.runs import reads as runs
from ampscope_server.store import runs_repository, steps_repository
from ampscope_server.store.models import StepNonfinite
from tests.server.wire import batch, batch_v2, new_id, record, record_v2
from tests.support.databases import Dialect, migrated_database, query_plan
from tests.support.ingest import ingest_payload

SKIPPED = 33_000


def _step_row(key: int | None, seq: int, step: int, **fields: Any) -> dict[str, Any]:
    """A `steps` row of the run `key` for `steps_repository.insert_steps`: a skipped overflow
    step with one non-finite layer, unless `fields` say otherwise."""
    return {
        "run_key": key, "attempt": 1, "seq": seq, "step": step, "wall_time": 1.0 + seq,
        "loss": 1.0, "loss_class": 0, "scale_before": 1.0, "scale_before_class": 0,
        "scale_after": 1.0, "scale_after_class": 0, "growth_tracker": 0, "found_inf": True,
        "skipped": True, "grad_norm": None, "grad_norm_class": 2, "lr": None, "lr_class": 0,
        "duration": None, "duration_class": 0, "captured": None, "nonfinite_count": 1,
        "misuse_count": None, **fields,
    }


@pytest.mark.slow
def test_events_of_a_run_with_33k_skipped_steps(sessions: sessionmaker[Session]) -> None:
    payload = batch([], run_id=new_id())
    with sessions() as session, session.begin():
        ingest.ingest_batch(session, IngestBatch.model_validate(payload))
        key = runs_repository.key_of(session, payload["run"]["id"])
        rows = [_step_row(key, i, i, loss=None, loss_class=1) for i in range(SKIPPED)]
        ids = steps_repository.insert_steps(session, rows)
        steps_repository.insert_rows(session, StepNonfinite, [
            {"step_id": ids[seq], "position": 0, "layer_index": seq % 2, "kind": "inf"}
            for seq in (5, 20_000, 32_999)])
    with sessions() as session:
        run = runs.load_run(session, payload["run"]["id"])
        every = chart_reads.events_read(session, run).events
        assert len(every) == SKIPPED and {event.kind for event in every} == {"skipped"}
        named = {event.step: [layer.name for layer in event.layers]  # type: ignore[union-attr]
                 for event in every if event.layers}  # type: ignore[union-attr]
        assert named == {5: ["fc1.bias"], 20_000: ["fc1.weight"], 32_999: ["fc1.bias"]}
        window = chart_reads.events_read(session, run, 19_990, 20_009).events
        assert [event.step for event in window] == list(range(19_990, 20_010))
        assert [len(event.layers) for event in window].count(1) == 1  # type: ignore[union-attr]


PAGED_SKIPS = 40_500
"""Past the 32,766 bound parameters SQLite takes in one statement."""


def _kind(step: int) -> str:
    return "nan" if step % 3 == 0 else "inf"


@pytest.mark.slow
def test_pages_of_40k_skipped_steps_each_with_its_layers(
    sessions: sessionmaker[Session],
) -> None:
    payload = batch([], run_id=new_id())
    with sessions() as session, session.begin():
        ingest.ingest_batch(session, IngestBatch.model_validate(payload))
        key = runs_repository.key_of(session, payload["run"]["id"])
        rows = [_step_row(key, i, 2 * i, found_inf=i % 2 == 0, skipped=i % 2 == 0,
                          nonfinite_count=1 if i % 2 == 0 else None)
                for i in range(2 * PAGED_SKIPS)]  # every other step skipped, steps 0, 2, 4, ...
        ids = steps_repository.insert_steps(session, rows)
        steps_repository.insert_rows(session, StepNonfinite, [
            {"step_id": ids[seq], "position": 0, "layer_index": seq // 2 % 2,
             "kind": _kind(2 * seq)} for seq in range(0, 2 * PAGED_SKIPS, 2)])
    with sessions() as session:
        run = runs.load_run(session, payload["run"]["id"])
        pages: list[list[AnyEventRead]] = []
        start = None
        while True:
            page = event_reads.events_page(session, run, start, None, limit=7_000)
            pages.append(page.events)
            if page.next_start is None:
                break
            assert page.next_start > page.events[-1].step  # disjoint: the next page starts after
            start = page.next_start
    assert [len(events) for events in pages] == [7_000] * 5 + [5_500]
    steps = [event.step for events in pages for event in events]
    assert steps == list(range(0, 4 * PAGED_SKIPS, 4))  # complete and in order
    names = ["fc1.weight", "fc1.bias"]
    for events in pages:
        for event in events:
            assert isinstance(event, SkippedEventRead) and event.kind == "skipped"
            layers = [(layer.index, layer.name, layer.kind) for layer in event.layers]
            index = event.step // 4 % 2
            assert layers == [(index, names[index], _kind(event.step))], event.step


@pytest.fixture
def migrated_url(dialect: Dialect, tmp_path: Path) -> Iterator[str]:
    """This file's databases are fresh copies: its plan tests read the planner's choice
    (`query_plan` says why)."""
    with migrated_database(dialect, tmp_path, fresh=True) as url:
        yield url


def test_event_steps_are_read_from_their_partial_index(sessions: sessionmaker[Session]) -> None:
    """The first page of a long run's events reads the event steps' own index (revision 0014),
    not the run's steps from its start: the query holds the index's condition as written."""
    run_id = new_id()
    records = [record(i, with_layers=False) for i in range(40)]
    for rec in records[5::10]:
        rec.update(skipped=True, found_inf=True, scale_after=rec["scale_before"] / 2)
    ingest_payload(sessions, batch(records, run_id=run_id))
    with sessions() as session, session.begin():
        assert [row.step for row in steps_repository.event_rows(session, run_id)] == [
            5, 15, 25, 35]
        plan = query_plan(session, steps_repository.event_rows_statement(run_id, limit=1000))
    assert any("ix_steps_run_key_event_step" in line for line in plan), plan


def test_misuse_steps_are_read_from_their_partial_index(sessions: sessionmaker[Session]) -> None:
    """An events page's misuse rows come from the index of the steps that reported misuse
    (revision 0016), not from every step of its range: the query holds the index's condition
    as written."""
    run_id = new_id()
    records = [record_v2(i, with_layers=False) for i in range(40)]
    for rec in records[7::10]:
        rec["misuse"] = [{"kind": "unscale_twice", "detail": f"step {rec['step']}"}]
    ingest_payload(sessions, batch_v2(records, run_id=run_id, modules=None))
    with sessions() as session, session.begin():
        assert [(row.step, row.detail) for row in steps_repository.misuse_rows(
            session, run_id, 10, 30)] == [(17, "step 17"), (27, "step 27")]
        plan = query_plan(session, steps_repository.misuse_rows_statement(run_id, 10, 30))
    assert any("ix_steps_run_key_misuse_step" in line for line in plan), plan
