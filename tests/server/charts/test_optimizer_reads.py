"""Per-optimizer charts (`charts.optimizer_reads`, `GET /api/runs/{id}/optimizers`): each
optimizer's skips (count and steps) and each parameter group's lr, NaN/±inf kept, on both
dialects."""

from __future__ import annotations

import math
from typing import Any

import pytest
from starlette.testclient import TestClient

from ampscope_server.charts import optimizer_reads
from ampscope_server.charts.schemas import OptimizerGroupRead, OptimizersRead, SeriesPointRead
from ampscope_server.store.rank_packing import Optimizer
from tests.server.wire import batch, new_id, record, strict_json


def _point(step: int, value: float) -> SeriesPointRead:
    return SeriesPointRead(step=step, min=value, max=value, last=value)


class TestTracks:
    def test_no_rows_no_optimizers(self) -> None:
        assert optimizer_reads.tracks([], 10) == OptimizersRead(optimizers=[], last_step=None)

    def test_skips_and_each_groups_lr(self) -> None:
        rows = [
            (0, [Optimizer(False, [1e-3, 5e-4]), Optimizer(None, [0.1])]),
            (1, [Optimizer(True, [math.nan, 5e-4]), Optimizer(True, [None])]),
            (2, [Optimizer(False, [math.inf])]),  # the second optimizer is not in this step
            (3, [Optimizer(False, [2e-3, -math.inf, 7.0]), Optimizer(True, [0.2])]),
        ]
        read = optimizer_reads.tracks(rows, 10)
        assert read.last_step == 3
        first, second = read.optimizers
        assert (first.optimizer, first.steps, first.skipped, first.unknown, first.skipped_steps,
                first.groups) == (0, 4, 1, 0, [1], 3)
        assert [group.group for group in first.lr] == [0, 1, 2]
        assert [(p.step, p.last) for p in first.lr[1].points] == [
            (0, 5e-4), (1, 5e-4), (3, -math.inf)]
        assert first.lr[2] == OptimizerGroupRead(group=2, downsampled=False,
                                                 points=[_point(3, 7.0)])
        lr0 = [(p.step, p.last) for p in first.lr[0].points]
        assert lr0[0] == (0, 1e-3) and lr0[2:] == [(2, math.inf), (3, 2e-3)]
        assert lr0[1][0] == 1 and lr0[1][1] is not None and math.isnan(lr0[1][1])
        # A group's None is no point: step 1 is not on the second optimizer's line.
        assert (second.optimizer, second.steps, second.skipped, second.unknown,
                second.skipped_steps, second.groups) == (1, 3, 2, 1, [1, 3], 1)
        assert second.lr == [OptimizerGroupRead(group=0, downsampled=False,
                                                points=[_point(0, 0.1), _point(3, 0.2)])]

    def test_downsampling_keeps_every_buckets_min_and_max(self) -> None:
        rows = [(step, [Optimizer(False, [1e-3 if step != 5 else math.inf])])
                for step in range(8)]
        (track,) = optimizer_reads.tracks(rows, 2).optimizers
        assert track.lr[0].downsampled is True
        assert [(p.step, p.min, p.max, p.last) for p in track.lr[0].points] == [
            (0, 1e-3, 1e-3, 1e-3), (4, 1e-3, math.inf, 1e-3)]

    def test_listed_skips_and_charted_groups_are_capped(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(optimizer_reads, "OPTIMIZER_SKIPS_LISTED", 2)
        monkeypatch.setattr(optimizer_reads, "OPTIMIZER_GROUPS_CHARTED", 1)
        rows = [(step, [Optimizer(True, [1.0, 2.0])]) for step in range(4)]
        (track,) = optimizer_reads.tracks(rows, 10).optimizers
        assert (track.skipped, track.skipped_steps, track.groups) == (4, [0, 1], 2)
        assert [group.group for group in track.lr] == [0]


def _v4(records: list[dict[str, Any]], run_id: str) -> dict[str, Any]:
    payload = batch(records, run_id=run_id, layers=None)
    payload["schema_version"] = 4
    return payload


def _get(api: TestClient, path: str) -> Any:
    response = api.get(path)
    assert response.status_code == 200, response.text
    return strict_json(response.text)


def _points(*pairs: tuple[int, Any]) -> list[dict[str, Any]]:
    return [{"step": step, "min": value, "max": value, "last": value} for step, value in pairs]


class TestOptimizersRoute:
    def test_two_optimizers_as_sent(self, api: TestClient) -> None:
        run_id = new_id()
        records = [record(i, with_layers=False, optimizers=[
            {"skipped": False, "lr": [1e-3, "nan" if i == 2 else 5e-4]},
            {"skipped": i in (1, 3), "lr": ["inf" if i == 3 else 0.01]},
        ]) for i in range(5)]
        response = api.post("/api/ingest", json=_v4(records, run_id))
        assert response.status_code == 200, response.text
        body = _get(api, f"/api/runs/{run_id}/optimizers")
        assert body == {"optimizers": [
            {"optimizer": 0, "steps": 5, "skipped": 0, "unknown": 0, "skipped_steps": [],
             "groups": 2, "lr": [
                 {"group": 0, "downsampled": False,
                  "points": _points(*((i, 1e-3) for i in range(5)))},
                 {"group": 1, "downsampled": False, "points": [
                     *_points((0, 5e-4), (1, 5e-4)),
                     {"step": 2, "min": "nan", "max": "nan", "last": "nan"},
                     *_points((3, 5e-4), (4, 5e-4))]},
             ]},
            {"optimizer": 1, "steps": 5, "skipped": 2, "unknown": 0, "skipped_steps": [1, 3],
             "groups": 1, "lr": [{"group": 0, "downsampled": False, "points": _points(
                 (0, 0.01), (1, 0.01), (2, 0.01), (3, "inf"), (4, 0.01))}]},
        ], "last_step": 4}
        ranged = _get(api, f"/api/runs/{run_id}/optimizers?start=2&end=3")
        assert [(o["steps"], o["skipped_steps"]) for o in ranged["optimizers"]] == [
            (2, []), (2, [3])]
        assert ranged["last_step"] == 3

    def test_a_run_without_the_block_has_none(self, api: TestClient) -> None:
        run_id = new_id()
        response = api.post("/api/ingest", json=batch([record(0), record(1)], run_id=run_id))
        assert response.status_code == 200, response.text
        assert _get(api, f"/api/runs/{run_id}/optimizers") == {"optimizers": [], "last_step": None}

    def test_an_unknown_run_is_404(self, api: TestClient) -> None:
        run_id = new_id()
        response = api.get(f"/api/runs/{run_id}/optimizers")
        assert response.status_code == 404
        assert response.json() == {"detail": f"run '{run_id}' not found"}
