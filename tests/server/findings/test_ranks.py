"""`rank_nonfinite`: a distributed run's first step where some, not all, ranks went non-finite,
as a pure detector over `RunData` and through `GET /api/runs/{id}/findings` on each dialect."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import httpx
import pytest

from ampscope_server.findings import RankStep, RunData, analyze
from ampscope_server.findings.ranks import rank_nonfinite
from tests.server.findings.synthetic import run_data
from tests.server.wire import batch, new_id, record, strict_json

NAN, INF = math.nan, math.inf


def _with(first: RankStep | None) -> RunData:
    return dataclasses.replace(run_data([]), first_rank=first)


def _step(loss: Sequence[float | None], nonfinite: Sequence[int | None],
          step: int = 812) -> RankStep:
    bad = tuple(r for r, (value, count) in enumerate(zip(loss, nonfinite, strict=True))
                if (value is not None and not math.isfinite(value)) or (count or 0) > 0)
    return RankStep(world_size=len(loss), step=step, ranks=bad, loss=tuple(loss),
                    nonfinite=tuple(nonfinite))


class TestDetector:
    def test_one_rank_with_a_nan_loss(self) -> None:
        (found,) = rank_nonfinite(_with(_step([2.0, NAN, 2.1, 1.9], [0, 0, 0, 0])))
        assert (found.kind, found.severity, found.step_start, found.step_end) == (
            "rank_nonfinite", "error", 812, 812)
        assert found.title == ("Rank 1 went non-finite first, at step 812, while ranks 0, 2 "
                               "and 3 were finite")
        assert found.explanation.startswith(
            "At step 812, rank 1's loss was NaN, while ranks 0, 2 and 3 were finite: the first "
            "step of the run where any rank's loss or gradients were non-finite.")
        assert found.recommendation.startswith(
            "Inspect that rank's batch at step 812 (the shard of the data loader rank 1 read)")
        assert found.evidence == {"world_size": 4, "nonfinite_ranks": 1, "first_rank": 1}

    def test_gradients_only_is_a_warning(self) -> None:
        (found,) = rank_nonfinite(_with(_step([1.0, 1.0, None], [None, 3, 1], step=40)))
        assert found.severity == "warning"
        assert found.title == ("Ranks 1 and 2 went non-finite first, at step 40, while rank 0 "
                               "was finite")
        assert found.explanation.startswith(
            "At step 40, rank 1's gradients held NaN/inf in 3 layers; rank 2's gradients held "
            "NaN/inf in 1 layer, while rank 0 was finite")
        assert found.recommendation.startswith("Inspect those ranks' batches at step 40")

    def test_loss_and_gradients_of_one_rank(self) -> None:
        (found,) = rank_nonfinite(_with(_step([-INF, 1.0], [2, 0])))
        assert found.explanation.startswith(
            "At step 812, rank 0's loss was -inf and its gradients held NaN/inf in 2 layers, "
            "while rank 1 was finite")

    def test_many_ranks_are_listed_up_to_eight(self) -> None:
        (found,) = rank_nonfinite(_with(_step([NAN] * 10 + [1.0] * 54, [0] * 64)))
        assert found.title == ("Ranks 0, 1, 2, 3, 4, 5, 6, 7 and 2 more went non-finite "
                               "first, at step 812, while ranks 10, 11, 12, 13, 14, 15, 16, 17 "
                               "and 46 more were finite")

    @pytest.mark.parametrize("first", [
        None,
        _step([NAN, NAN], [0, 0]),  # every rank at once: no rank singled out
        RankStep(world_size=1, step=3, ranks=(0,), loss=(NAN,), nonfinite=(0,)),
    ])
    def test_nothing_to_say(self, first: RankStep | None) -> None:
        assert rank_nonfinite(_with(first)) == []

    def test_analyze_lists_it(self) -> None:
        kinds = [f.kind for f in analyze(_with(_step([1.0, NAN], [0, 0])))]
        assert kinds == ["rank_nonfinite"]


class TestApi:
    def test_the_finding_of_a_distributed_run(self, api: httpx.Client) -> None:
        run_id = new_id()
        records = [record(i, with_layers=False, ranks={
            "loss": [2.0, "nan" if i >= 3 else 2.0, 2.0], "nonfinite": [0, 0, 0]})
            for i in range(5)]
        payload = batch(records, run_id=run_id, world_size=3)
        payload["schema_version"] = 4
        assert api.post("/api/ingest", json=payload).status_code == 200
        response = api.get(f"/api/runs/{run_id}/findings")
        assert response.status_code == 200, response.text
        found = [f for f in strict_json(response.text)["findings"]
                 if f["kind"] == "rank_nonfinite"]
        assert [(f["severity"], f["title"], f["step_start"], f["evidence"]) for f in found] == [
            ("error", "Rank 1 went non-finite first, at step 3, while ranks 0 and 2 were finite",
             3, {"world_size": 3, "nonfinite_ranks": 1, "first_rank": 1})]
