"""Run counters kept at ingest and the cached analysis beside them (`summary_cache`)."""

from __future__ import annotations

import math
import time
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.ingest import counters
from ampscope_server.ingest.wire import StepRecord
from ampscope_server.runs import reads as runs
from ampscope_server.runs import summary_cache
from ampscope_server.store import run_counters_repository
from ampscope_server.store.float_storage import FloatClass
from tests.server.wire import batch, new_id, record
from tests.support.ingest import ingest_payload

NOW = 1000.0
"""The clock at ingest, unless a test moves it on."""


def _counters(factory: sessionmaker[Session], run_id: str) -> dict[str, Any]:
    with factory() as session:
        row = run_counters_repository.counters_of(session, [run_id])[run_id]
        return {name: getattr(row, name) for name in (
            "version", "num_steps", "skipped_steps", "nonfinite_steps", "last_step",
            "last_scale", "last_scale_class", "last_loss", "last_loss_class")}


class TestCountersAtIngest:
    def test_counts_new_steps_only_and_keeps_the_newest(
        self, sessions: sessionmaker[Session]
    ) -> None:
        run_id = new_id()
        ingest_payload(sessions, batch([record(0), record(1, skipped=True, found_inf=True,
                                                 scale_after=32768.0)], run_id=run_id), now=NOW)
        assert _counters(sessions, run_id) == {
            "version": 1, "num_steps": 2, "skipped_steps": 1, "nonfinite_steps": 1,
            "last_step": 1, "last_scale": 32768.0, "last_scale_class": FloatClass.FINITE_OR_NULL,
            "last_loss": 2.31 - 0.01, "last_loss_class": FloatClass.FINITE_OR_NULL}
        # A resent record (a duplicate) adds nothing; a found_inf step that was not skipped
        # counts as non-finite only; a resumed lower step keeps last_step, the newest scale
        # and loss (ingest order) are its, non-finite ones kept exactly.
        ingest_payload(sessions, batch([record(1, skipped=True, found_inf=True),
                                        record(2, found_inf=True),
                                        record(3, step=0, scale_after="inf", loss="nan")],
                                       run_id=run_id), now=NOW)
        assert _counters(sessions, run_id) == {
            "version": 2, "num_steps": 4, "skipped_steps": 1, "nonfinite_steps": 2,
            "last_step": 2, "last_scale": None, "last_scale_class": FloatClass.POS_INF,
            "last_loss": None, "last_loss_class": FloatClass.NAN}
        with sessions() as session:
            summary = runs.summaries(session, [runs.load_run(session, run_id)], 300.0)[0]
        assert (summary.num_steps, summary.skipped_steps, summary.last_step) == (4, 1, 2)
        assert summary.last_scale == math.inf and summary.skip_rate == 0.25

    def test_an_all_duplicate_batch_keeps_the_version(
        self, sessions: sessionmaker[Session]
    ) -> None:
        run_id = new_id()
        payload = batch([record(0)], run_id=run_id)
        ingest_payload(sessions, payload, now=NOW)
        ingest_payload(sessions, payload, now=NOW)
        assert _counters(sessions, run_id)["version"] == 1

    def test_no_row_for_a_run_without_steps(self, sessions: sessionmaker[Session]) -> None:
        run_id = new_id()
        ingest_payload(sessions, batch([], run_id=run_id), now=NOW)
        with sessions() as session:
            assert run_counters_repository.counters_of(session, [run_id]) == {}
            summary = runs.summaries(session, [runs.load_run(session, run_id)], 300.0)[0]
        assert (summary.num_steps, summary.skip_rate, summary.summary_step) == (0, None, None)

    def test_pure_delta(self) -> None:
        assert counters.counters_delta([]) is None
        records = [StepRecord.model_validate(record(i, skipped=i == 0, found_inf=i == 0))
                   for i in range(3)]
        delta = counters.counters_delta([(12, records[2]), (10, records[0]),
                                         (11, records[1])])
        assert delta is not None
        assert (delta.num_steps, delta.skipped_steps, delta.nonfinite_steps, delta.last_step,
                delta.last_id) == (3, 1, 1, 2, 12)
        assert delta.last_loss == (2.31 - 0.02, FloatClass.FINITE_OR_NULL)


class TestCachedAnalysis:
    def test_stored_by_the_refresher_and_stale_after_new_steps(
        self, sessions: sessionmaker[Session]
    ) -> None:
        run_id = new_id()
        records = [record(i, skipped=i == 1, found_inf=i == 1) for i in range(3)]
        ingest_payload(sessions, batch(records, run_id=run_id), now=NOW)
        with sessions() as session:
            run = runs.load_run(session, run_id)
            first = runs.summaries(session, [run], 300.0, factory=sessions)[0]
        assert first.summary_step == 2  # analysed by the read itself (a stale run, one of few)
        _wait_idle()
        with sessions() as session:
            row = run_counters_repository.counters_of(session, [run_id])[run_id]
            assert (row.summary_version, row.summary_step) == (row.version, 2)
            assert summary_cache.stored(row).headroom == first.worst_headroom
            assert summary_cache.stored(row).underflow == first.worst_underflow
            assert summary_cache.stored(row).top == first.top_finding
        ingest_payload(sessions, batch([record(3)], run_id=run_id), now=NOW + 1)
        with sessions() as session:
            row = run_counters_repository.counters_of(session, [run_id])[run_id]
            assert summary_cache.is_stale(row)
            assert summary_cache.stored(row).step == 2  # shown as of step 2 until analysed

    def test_a_read_analyses_a_bounded_number_the_refresher_the_rest(
        self, sessions: sessionmaker[Session]
    ) -> None:
        ids = [new_id() for _ in range(summary_cache.SYNC_REFRESH + 3)]
        for run_id in ids:
            ingest_payload(sessions, batch([record(0), record(1)], run_id=run_id), now=NOW)
        with sessions() as session:
            loaded = [runs.load_run(session, run_id) for run_id in ids]
            shown = runs.summaries(session, loaded, 300.0, factory=sessions)
        steps = [summary.summary_step for summary in shown]
        assert steps == [1] * summary_cache.SYNC_REFRESH + [None] * 3
        _wait_idle()
        with sessions() as session:
            again = runs.summaries(session, loaded, 300.0)
        assert [summary.summary_step for summary in again] == [1] * len(ids)

    def test_stale_analysis_is_not_taken_as_current(
        self, sessions: sessionmaker[Session]
    ) -> None:
        """An answer from live_view's recent analysis (the run changed since) is shown as of its
        step but keeps the run stale."""
        run_id = new_id()
        ingest_payload(sessions, batch([record(0)], run_id=run_id), now=NOW)
        with sessions() as session:
            run = runs.load_run(session, run_id)
            counters = run_counters_repository.counters_of(session, [run_id])
            assert summary_cache.analyse(session, [run], counters)[run_id].version == 1
        ingest_payload(sessions, batch([record(1)], run_id=run_id), now=NOW + 1)
        with sessions() as session:
            run = runs.load_run(session, run_id)
            counters = run_counters_repository.counters_of(session, [run_id])
            analysis = summary_cache.analyse(session, [run], counters)[run_id]
        assert (analysis.step, analysis.version) == (0, None)


def _wait_idle() -> None:
    deadline = time.monotonic() + 10
    while not summary_cache.REFRESHER.idle():
        assert time.monotonic() < deadline, "the refresher did not finish within 10 s"
        time.sleep(0.01)
