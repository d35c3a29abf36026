"""`rank_nonfinite`: a distributed run's first step where some, not all, ranks went non-finite,
as a pure detector over `RunData` and through `GET /api/runs/{id}/findings` on each dialect."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pytest
from starlette.testclient import TestClient

from ampscope_server.findings import RankStep, RunData, analyze
from ampscope_server.findings.ranks import rank_nonfinite
from ampscope_server.store import rank_packing
from tests.server.findings.synthetic import run_data
from tests.server.wire import batch, new_id, record, strict_json

NAN, INF = math.nan, math.inf


def _with(first: RankStep | None) -> RunData:
    return dataclasses.replace(run_data([]), first_rank=first)


def _step(loss: Sequence[float | None], nonfinite: Sequence[int | None],
          step: int = 812) -> RankStep:
    return RankStep(world_size=len(loss), step=step,
                    ranks=tuple(rank_packing.origin_ranks(loss, nonfinite)), loss=tuple(loss),
                    nonfinite=tuple(nonfinite))


class TestDetector:
    def test_one_rank_with_a_nan_loss(self) -> None:
        """DDP: rank 1's NaN loss, and after the all-reduce every rank's gradients are NaN."""
        (found,) = rank_nonfinite(_with(_step([2.0, NAN, 2.1, 1.9], [4, 4, 4, 4])))
        assert (found.kind, found.severity, found.step_start, found.step_end) == (
            "rank_nonfinite", "error", 812, 812)
        assert found.title == ("Rank 1 went non-finite first, at step 812, while the losses "
                               "of ranks 0, 2 and 3 were finite")
        assert found.explanation.startswith(
            "At step 812, rank 1's loss was NaN, while ranks 0, 2 and 3 computed a finite "
            "loss: the first step of the run where any rank's loss or gradients were "
            "non-finite. The NaN/inf reached the gradients of ranks 0, 1, 2 and 3 through the "
            "all-reduce at that same step.")
        assert found.recommendation.startswith(
            "Inspect that rank's batch at step 812 (the shard of the data loader rank 1 read)")
        assert found.evidence == {"world_size": 4, "nonfinite_ranks": 1, "first_rank": 1}

    def test_two_ranks_and_one_finite(self) -> None:
        (found,) = rank_nonfinite(_with(_step([-INF, 1.0, NAN], [0, 0, 0], step=40)))
        assert found.title == ("Ranks 0 and 2 went non-finite first, at step 40, while the loss "
                               "of rank 1 was finite")
        assert found.explanation.startswith(
            "At step 40, rank 0's loss was -inf, rank 2's loss was NaN, while rank 1 computed "
            "a finite loss: the first step of the run where any rank's loss or gradients were "
            "non-finite. The ranks share")
        assert found.recommendation.startswith("Inspect those ranks' batches at step 40")

    def test_many_ranks_are_listed_up_to_eight(self) -> None:
        (found,) = rank_nonfinite(_with(_step([NAN] * 10 + [1.0] * 54, [0] * 64)))
        assert found.title == ("Ranks 0, 1, 2, 3, 4, 5, 6, 7 and 2 more went non-finite "
                               "first, at step 812, while the losses of ranks 10, 11, 12, 13, "
                               "14, 15, 16, 17 and 46 more were finite")
        assert "rank 7's loss was NaN, and 2 more ranks' were too, while" in found.explanation

    @pytest.mark.parametrize("first", [
        None,
        _step([NAN, NAN], [0, 0]),  # every rank at once: no rank singled out
        _step([1.0, 1.0, None], [None, 3, 1]),  # gradients only (FSDP shards): no origin
        _step([NAN, None], [2, None]),  # the other rank's loss unknown: nothing to compare
        RankStep(world_size=1, step=3, ranks=(0,), loss=(NAN,), nonfinite=(0,)),
    ])
    def test_nothing_to_say(self, first: RankStep | None) -> None:
        assert rank_nonfinite(_with(first)) == []

    def test_analyze_lists_it(self) -> None:
        kinds = [f.kind for f in analyze(_with(_step([1.0, NAN], [0, 0])))]
        assert kinds == ["rank_nonfinite"]


class TestApi:
    def test_the_finding_of_a_distributed_run(self, api: TestClient) -> None:
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
            ("error", "Rank 1 went non-finite first, at step 3, while the losses of ranks 0 and 2 "
                      "were finite",
             3, {"world_size": 3, "nonfinite_ranks": 1, "first_rank": 1})]
