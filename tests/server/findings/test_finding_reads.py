"""The snapshot loader's read bounds and the findings cache, on a real migrated database of
each dialect (runs ingested through the ingest service)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.orm import Session

from ampscope_server.findings import analyze
from ampscope_server.findings import reads as finding_reads
from ampscope_server.findings.thresholds import EDGE_STEPS
from ampscope_server.store import findings_repository, runs_repository
from tests.server.findings.conftest import Database
from tests.server.findings.payloads import records, troubled_batch
from tests.server.findings.synthetic import fits_below, scaler_steps
from tests.server.wire import batch_v2, new_id
from tests.support.ingest import ingest_payload


def _long_run(run_id: str, n: int = 2000) -> dict[str, Any]:
    return batch_v2(records(scaler_steps(n, fits_below(2**10))), run_id=run_id)


class TestLoader:
    def test_reads_only_the_notable_steps(self, database: Database) -> None:
        run_id = ingest_payload(database.sessions, _long_run(new_id())).run_id
        with database.sessions() as session:
            run = runs_repository.get_run(session, run_id)
            assert run is not None
            data = finding_reads.load_run_data(session, run)
        # Calibration skips 0-5 and the step after the last one, within the first and last
        # EDGE_STEPS steps (the run's healthy magnitude and where it is now).
        edges = EDGE_STEPS
        assert [p.step for p in data.steps] == [*range(edges), *range(2000 - edges, 2000)]
        assert sorted({s.step for s in data.layer_samples}) == list(range(1920, 2000, 10))
        assert len(data.layer_samples) == finding_reads.RECENT_LAYER_STEPS * 2

    def test_baseline_reads_the_notable_steps_and_the_window_before_the_divergence(
        self, database: Database
    ) -> None:
        run_id = ingest_payload(database.sessions, _long_run(new_id())).run_id
        with database.sessions() as session:
            run = runs_repository.get_run(session, run_id)
            assert run is not None
            data = finding_reads.load_run_data(session, run, for_baseline=True, divergence=1000)
            quiet = finding_reads.load_run_data(session, run, for_baseline=True)
        window = list(range(1000 - finding_reads.BASELINE_WINDOW, 1001))
        edges = EDGE_STEPS
        first, last = list(range(edges)), list(range(2000 - edges, 2000))
        assert [p.step for p in data.steps] == [*first, *window, *last]
        assert [p.step for p in quiet.steps] == [*first, *last]
        assert len({s.step for s in data.layer_samples}) == 200  # all 200 (fewer than 256)

    def test_a_baseline_comparison_reads_no_run_whole(
        self, database: Database, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Both sides read their notable steps and a window found by the bounded divergence
        search (a step-by-step search here: 2000 common steps), never every step."""
        ids = [ingest_payload(database.sessions, _long_run(new_id())).run_id for _ in range(2)]
        asked: list[bool] = []
        whole = findings_repository.findings_steps

        def spy(session: Session, run_id: str, every_step: bool) -> list[tuple[Any, ...]]:
            asked.append(every_step)
            return whole(session, run_id, every_step)

        monkeypatch.setattr(findings_repository, "findings_steps", spy)
        with database.sessions() as session:
            run, baseline = (runs_repository.get_run(session, run_id) for run_id in ids)
            assert run is not None and baseline is not None
            findings = finding_reads.findings_of(session, run, baseline.id)
        assert asked == [False, False]
        assert "baseline_divergence" not in {f.kind for f in findings}  # the same training

    def test_nonfinite_layers_and_nan_context(self, database: Database) -> None:
        run_id = ingest_payload(database.sessions, troubled_batch(new_id())).run_id
        with database.sessions() as session:
            run = runs_repository.get_run(session, run_id)
            assert run is not None
            data = finding_reads.load_run_data(session, run)
        assert data.nonfinite[0].step == 0
        assert data.nonfinite[0].layers == ((1, "inf"), (0, "inf"))
        assert [(m.step, m.kind) for m in data.misuse] == [
            (300, "clip_before_unscale"), (301, "clip_before_unscale")]
        assert data.nan_context == {}  # the NaN step's loss is NaN: forward, not a NaN origin

    def test_misuse_is_counted_beyond_the_events_read(
        self, database: Database, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Clipping before unscale_ on every step: the finding counts every step, also past
        the first MISUSE_EVENTS events the snapshot reads (#30)."""
        clip = [{"kind": "clip_before_unscale", "detail": "4 of 4 gradients were modified"}]
        payload = batch_v2(records(scaler_steps(300, fits_below(2**10)),
                                   extra=lambda p: {"misuse": clip if p.step >= 20 else []}),
                           run_id=new_id())
        run_id = ingest_payload(database.sessions, payload).run_id
        monkeypatch.setattr(finding_reads, "MISUSE_EVENTS", 10)
        with database.sessions() as session:
            run = runs_repository.get_run(session, run_id)
            assert run is not None
            data = finding_reads.load_run_data(session, run)
        assert len(data.misuse) == 10
        assert data.misuse_totals == {"clip_before_unscale": (280, 20, 299)}
        found = [f for f in analyze(data) if f.kind == "amp_misuse"]
        assert [(f.title, f.step_start, f.step_end, f.evidence) for f in found] == [
            ("Gradients clipped while still scaled (280 step(s))", 20, 299, {"steps": 280})]


    def test_the_last_shadow_steps_that_ran_bit_exact(self, database: Database) -> None:
        """Wire v6 shadows: the failed one is not read; NaN and None rel_err come back as
        sent, and only the last SHADOW_STEPS are read."""
        payload = _long_run(new_id(), 200)
        payload["schema_version"] = 6
        for i, record in enumerate(payload["records"]):
            if i % 2:
                record["shadow"] = {"status": "ok", "loss": 1.0 + i,
                                    "rel_err": [0.25, "nan" if i % 4 == 1 else None],
                                    "cosine": [0.9, None],
                                    "norm": [1.0, 0.0 if i % 4 == 1 else None],
                                    "detail": None}
        payload["records"][199]["shadow"] = {
            "status": "failed", "loss": None, "rel_err": None, "cosine": None, "norm": None,
            "detail": "ValueError: bad batch"}
        run_id = ingest_payload(database.sessions, payload).run_id
        with database.sessions() as session:
            run = runs_repository.get_run(session, run_id)
            assert run is not None
            data = finding_reads.load_run_data(session, run)
        n = finding_reads.SHADOW_STEPS
        assert [s.step for s in data.shadows] == list(range(197 - 2 * (n - 1), 199, 2))
        assert data.shadows[-1].loss == 198.0
        assert data.shadows[-2].rel_err == (0.25, None)  # step 195
        nan = data.shadows[-1].rel_err  # step 197 (199's failed)
        assert nan[0] == 0.25 and nan[1] is not None and nan[1] != nan[1]
        found = [f for f in analyze(data) if f.kind == "precision_sensitive"]
        assert [f.layers for f in found] == [["fc1.weight"]]


def test_spread_keeps_first_and_last() -> None:
    assert finding_reads._spread(list(range(10)), 4) == [0, 3, 6, 9]
    assert finding_reads._spread([1, 2], 4) == [1, 2]


def test_spread_by_step_lines_up_runs() -> None:
    steps = [(100 + i, i * 10) for i in range(1000)]
    chosen = finding_reads._spread_by_step(steps, 5)
    assert chosen == [100, 350, 600, 850, 1099]  # the first step at or after each target


class TestCache:
    def test_analysed_again_once_changed_and_at_most_every_refresh(
        self, database: Database
    ) -> None:
        payload = _long_run(new_id(), n=300)
        first_half = dict(payload, records=payload["records"][:150])
        run_id = ingest_payload(database.sessions, first_half).run_id
        t0 = 1000.0
        with database.sessions() as session:
            run = runs_repository.get_run(session, run_id)
            assert run is not None
            once = finding_reads.run_findings(session, run, now=t0)
            assert finding_reads.run_findings(session, run, now=t0 + 3600) is once  # unchanged
            assert finding_reads.live_view(session, run, now=t0).step == 149
        ingest_payload(database.sessions, payload)
        with database.sessions() as session:
            run = runs_repository.get_run(session, run_id)
            assert run is not None
            # Changed, but analysed less than LIVE_REFRESH_S ago: the same analysis serves.
            soon = t0 + finding_reads.LIVE_REFRESH_S / 2
            assert finding_reads.run_findings(session, run, now=soon) is once
            later = t0 + finding_reads.LIVE_REFRESH_S
            assert finding_reads.run_findings(session, run, now=later) is not once
            assert finding_reads.live_view(session, run, now=later).step == 299

    def test_a_finished_run_is_analysed_again_at_once(self, database: Database) -> None:
        """The last batch of a run (final) is not served the analysis of the one before: a
        report or an alert right after training ends sees the whole run."""
        payload = _long_run(new_id(), n=300)
        run_id = ingest_payload(database.sessions,
                                dict(payload, records=payload["records"][:150])).run_id
        t0 = 1000.0
        with database.sessions() as session:
            run = runs_repository.get_run(session, run_id)
            assert run is not None
            once = finding_reads.run_findings(session, run, now=t0)
        ingest_payload(database.sessions, dict(payload, final=True))
        with database.sessions() as session:
            run = runs_repository.get_run(session, run_id)
            assert run is not None and run.status == "finished"
            soon = t0 + finding_reads.LIVE_REFRESH_S / 2
            assert finding_reads.run_findings(session, run, now=soon) is not once
            assert finding_reads.live_view(session, run, now=soon).step == 299
