"""Series, events and heatmaps over HTTP (the app in process) on both dialects."""

from __future__ import annotations

import math
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.server.wire import batch, layer_stats, new_id, record, strict_json
from tests.support.ingest import post_batch


def _get(api: TestClient, path: str, status: int = 200) -> Any:
    response = api.get(path)
    assert response.status_code == status, response.text
    return strict_json(response.text)


def _post(api: TestClient, run_id: str, records: list[dict[str, Any]]) -> None:
    for start in range(0, len(records), 500):
        post_batch(api, batch(records[start:start + 500], run_id=run_id))


class TestSeries:
    def test_spike_survives_downsampling(self, api: TestClient) -> None:
        run_id = new_id()
        records = [record(i, grad_norm=1.0, with_layers=False) for i in range(2000)]
        records[1234]["grad_norm"] = "inf"
        records[777]["grad_norm"] = 1e6
        _post(api, run_id, records)
        series = _get(api, f"/api/runs/{run_id}/series/grad_norm?max_points=50")
        assert series["name"] == "grad_norm" and series["downsampled"] is True
        assert 25 <= len(series["points"]) <= 50
        maxima = [p["max"] for p in series["points"]]
        assert maxima.count("inf") == 1 and maxima.count(1e6) == 1
        assert all(p["min"] == 1.0 for p in series["points"])
        spike = next(p for p in series["points"] if p["max"] == "inf")
        assert spike["step"] <= 1234 < spike["step"] + 64

    def test_not_downsampled_is_min_max_last_equal(self, api: TestClient) -> None:
        run_id = new_id()
        _post(api, run_id, [record(0, loss=1.5), record(1, loss="nan"), record(2, loss=None),
                            record(3, loss=-0.5)])
        series = _get(api, f"/api/runs/{run_id}/series/loss")
        assert series == {"name": "loss", "downsampled": False, "points": [
            {"step": 0, "min": 1.5, "max": 1.5, "last": 1.5},
            {"step": 1, "min": "nan", "max": "nan", "last": "nan"},
            {"step": 3, "min": -0.5, "max": -0.5, "last": -0.5},
        ]}

    def test_scale_is_the_scale_in_effect_and_start_end_filter(self, api: TestClient) -> None:
        run_id = new_id()
        _post(api, run_id, [record(i, scale_before=2.0**i, scale_after=2.0**(i + 1))
                            for i in range(6)])
        series = _get(api, f"/api/runs/{run_id}/series/scale?start=2&end=4")
        assert [(p["step"], p["last"]) for p in series["points"]] == [(2, 4.0), (3, 8.0),
                                                                     (4, 16.0)]

    @pytest.mark.parametrize(("query", "status", "detail"), [
        ("series/weight", 422,
         "path.name: Input should be 'scale', 'loss', 'grad_norm', 'lr' or 'duration'"),
        ("series/loss?max_points=0", 422,
         "query.max_points: Input should be greater than or equal to 1"),
        ("series/loss?start=-3", 422, "query.start: Input should be greater than or equal to 0"),
        ("layer-stats", 422, "query.stat: field required"),
        ("layer-stats?stat=l3", 422,
         "query.stat: Input should be 'amax', 'amin_nz', 'zero_frac', 'subnormal_frac', "
         "'underflow_frac', 'nan_count', 'inf_count', 'l2', 'lost_frac', 'headroom_bits' or "
         "'swallowed_frac'"),
    ])
    def test_bad_queries(self, api: TestClient, query: str, status: int, detail: str) -> None:
        run_id = new_id()
        _post(api, run_id, [record(0)])
        assert _get(api, f"/api/runs/{run_id}/{query}", status) == {"detail": detail}


class TestEvents:
    def test_events_are_derived_and_never_downsampled(self, api: TestClient) -> None:
        run_id = new_id()
        records = [record(i, with_layers=False) for i in range(3000)]
        for i in range(0, 3000, 100):  # 30 backoffs on skipped steps, 30 growths after them
            records[i].update(skipped=True, found_inf=True, scale_after=32768.0)
            records[i + 1].update(scale_before=32768.0, scale_after=65536.0)
        _post(api, run_id, records)
        events = _get(api, f"/api/runs/{run_id}/events")["events"]
        assert len(events) == 90
        assert events[:3] == [
            {"step": 0, "kind": "skipped", "scale_before": 65536.0, "scale_after": 32768.0,
             "loss_finite": True, "layers": [], "recheck": None},
            {"step": 0, "kind": "backoff", "scale_before": 65536.0, "scale_after": 32768.0},
            {"step": 1, "kind": "growth", "scale_before": 32768.0, "scale_after": 65536.0},
        ]
        assert [e["step"] for e in events if e["kind"] == "skipped"] == list(range(0, 3000, 100))

    def test_quiet_run_has_no_events(self, api: TestClient) -> None:
        run_id = new_id()
        _post(api, run_id, [record(0), record(1)])
        assert _get(api, f"/api/runs/{run_id}/events") == {"events": [], "next_start": None}


class TestHeatmap:
    def _seed(self, api: TestClient) -> str:
        run_id = new_id()
        records = [record(0), record(1, with_layers=False), record(2, scale_before=2.0**10)]
        records[2]["layers"]["amax"] = [0.0, None]
        _post(api, run_id, records)
        return run_id

    def test_stored_stat(self, api: TestClient) -> None:
        run_id = self._seed(api)
        heat = _get(api, f"/api/runs/{run_id}/layer-stats?stat=nan_count")
        assert heat == {"stat": "nan_count", "source": "param",
                        "layers": ["fc1.weight", "fc1.bias"], "steps": [0, 2],
                        "z": [[0, 0], [3, 3]], "downsampled": False, "rows": None}

    def test_lost_frac(self, api: TestClient) -> None:
        run_id = self._seed(api)
        heat = _get(api, f"/api/runs/{run_id}/layer-stats?stat=lost_frac&start=1")
        assert heat["steps"] == [2]
        assert heat["z"] == [[0.0], [0.125 + 0.03125]]

    def test_headroom_bits(self, api: TestClient) -> None:
        run_id = self._seed(api)
        heat = _get(api, f"/api/runs/{run_id}/layer-stats?stat=headroom_bits")
        amax0 = layer_stats(1.0)["amax"]
        expected_0 = [math.log2(65504.0 / (a * 65536.0)) for a in amax0]
        assert heat["z"][0][0] == pytest.approx(expected_0[0])
        assert heat["z"][1][0] == pytest.approx(expected_0[1])
        assert heat["z"][0][1] == "inf"  # amax 0: nothing can overflow
        assert heat["z"][1][1] is None  # no finite element


def _zoom_layers(step: int) -> dict[str, list[Any]]:
    """Per-layer statistics that change from step to step (deterministic), a null amax now and
    then, so every fold has something to pick."""
    a, b = (step * 7919 % 1000) / 1000.0, (step * 104729 % 997) / 997.0
    return {
        "amax": [0.5 + a, None if step % 11 == 0 else b],
        "amin_nz": [1e-9 * (1 + b), 1e-7 * (1 + a)],
        "zero_frac": [a / 4, b / 8],
        "subnormal_frac": [0.0, 0.01],
        "underflow_frac": [b / 16, a / 32],
        "nan_count": [step % 5, 0],
        "inf_count": [0, step % 3],
        "l2": [1.0 + a, 0.5],
    }


ZOOM_STEPS = 3072
"""48 whole 64-step buckets: the last (and the 1024-step bucket 2) ends at the run's last step,
so it is open (no stored row) and folded when read."""
DENSE_UNTIL = 2000
"""Steps below carry layer statistics two steps in three (64-step buckets with a stored row),
those from here on every 10th (sparse buckets, folded from their raw steps when read)."""


def _zoom_records() -> list[dict[str, Any]]:
    records = []
    for step in range(ZOOM_STEPS):
        layered = step % 3 != 1 if step < DENSE_UNTIL else step % 10 == 0
        rec = record(step, with_layers=False, scale_before=2.0 ** (10 + step % 7))
        rec["layers"] = _zoom_layers(step) if layered else None
        records.append(rec)
    return records


def _brute_force(records: list[dict[str, Any]], stat: str, start: int, end: int,
                 width: int | None) -> tuple[list[int], list[list[Any]]]:
    """(steps, z) of a heatmap over [start, end] folded straight from the raw records: one
    column per step (width None) or per `width`-step bucket aligned to multiples of `width`,
    each layer's worst value in it, as the JSON shows it ("inf", null)."""
    columns: dict[int, list[tuple[dict[str, list[Any]], float]]] = {}
    for rec in records:
        if rec["layers"] is not None and start <= rec["step"] <= end:
            key = rec["step"] if width is None else rec["step"] // width
            columns.setdefault(key, []).append((rec["layers"], rec["scale_before"]))
    steps: list[int] = []
    z: list[list[Any]] = [[], []]
    for key in sorted(columns):
        steps.append(key if width is None else max(start, key * width))
        for layer, row in enumerate(z):
            row.append(_worst(stat, [(layers, scale, layer) for layers, scale in columns[key]],
                              raw=width is None))
    return steps, z


def _worst(stat: str, cells: list[tuple[dict[str, list[Any]], float, int]], raw: bool) -> Any:
    """One layer's value over a column's steps ((stats, scale, layer) each), as the JSON shows it.

    headroom_bits: one step's from its amax and scale (series_math.headroom_bits); a bucket's
    from its largest amax · scale (chart_reads._display)."""
    if stat == "headroom_bits":
        present = [(layers["amax"][i], scale) for layers, scale, i in cells
                   if layers["amax"][i] is not None]
        if not present:
            return None
        if raw:  # one step
            amax, scale = present[0]
            return ("inf" if amax == 0
                    else math.log2(65504.0) - math.log2(amax) - math.log2(scale))
        product = max(amax * scale for amax, scale in present)
        return "inf" if product == 0 else math.log2(65504.0) - math.log2(product)
    if stat == "lost_frac":
        values = [layers["zero_frac"][i] + layers["underflow_frac"][i] for layers, _, i in cells]
    else:
        values = [layers[stat][i] for layers, _, i in cells if layers[stat][i] is not None]
    if not values:
        return None
    return min(values) if stat == "amin_nz" else max(values)


@pytest.fixture(scope="module")
def zoom_run(module_app: TestClient) -> str:
    """A run of `_zoom_records`, sent once per app (dialect)."""
    run_id = new_id()
    _post(module_app, run_id, _zoom_records())
    return run_id


class TestHeatmapByZoom:
    """The heatmap's columns follow the zoom (raw steps up to RAW_FOLD_STEPS, stored per-layer
    rollups past it) and always equal a fold of the raw steps in the same buckets."""

    @pytest.mark.parametrize(("start", "end", "max_points", "width"), [
        (0, ZOOM_STEPS - 1, 250, 64),      # 48 64-step buckets: rows, sparse and open folded
        (1234, 2233, 250, 64),             # 1/3 zoom: 64-step rows, partial edges folded raw
        (300, 2700, 20, 256),              # 256-step rows
        (0, ZOOM_STEPS - 1, 2, 4096),      # one column: 1024-step rows, the open one folded
        (1000, 1255, 100, 4),              # 256 steps: 4-step buckets folded raw
        (1500, 1699, 250, None),           # fewer steps than columns: one column per step
        # 271 steps across the dense/sparse boundary: none of the five 64-step buckets kept a
        # row, so the 256-step level (chart_reads._layer_levels), not five raw folds.
        (1990, 2260, 250, 256),
        (2100, 3071, 250, 256),            # sparse only: 256-step rows, the open one folded
    ])
    @pytest.mark.parametrize("stat", ["amax", "amin_nz", "lost_frac", "nan_count",
                                      "headroom_bits"])
    def test_equals_a_fold_of_the_raw_steps(
        self, api: TestClient, zoom_run: str, stat: str, start: int, end: int,
        max_points: int, width: int | None,
    ) -> None:
        heat = _get(api, f"/api/runs/{zoom_run}/layer-stats?stat={stat}&start={start}"
                         f"&end={end}&max_points={max_points}")
        steps, z = _brute_force(_zoom_records(), stat, start, end, width)
        assert heat["downsampled"] is (width is not None)
        assert heat["steps"] == steps
        assert heat["z"] == z

    @pytest.mark.parametrize(("start", "end", "max_points"), [
        (0, ZOOM_STEPS - 1, 250),   # 64-step rows, sparse and open buckets folded
        (300, 2700, 20),            # 256-step rows
        (1000, 1255, 100),          # 4-step buckets folded raw
        (1500, 1699, 250),          # a column per step
    ])
    @pytest.mark.parametrize("layers", ["1", "1,0", "0"])
    @pytest.mark.parametrize("stat", ["amin_nz", "headroom_bits"])
    def test_picked_rows_are_those_rows_of_the_whole_heatmap(
        self, api: TestClient, zoom_run: str, stat: str, layers: str, start: int, end: int,
        max_points: int,
    ) -> None:
        query = f"stat={stat}&start={start}&end={end}&max_points={max_points}"
        whole = _get(api, f"/api/runs/{zoom_run}/layer-stats?{query}")
        picked = _get(api, f"/api/runs/{zoom_run}/layer-stats?{query}&layers={layers}")
        rows = [int(row) for row in layers.split(",")]
        assert picked == {**whole, "rows": rows, "layers": [whole["layers"][i] for i in rows],
                          "z": [whole["z"][i] for i in rows]}

    @pytest.mark.parametrize(("layers", "message"), [
        ("2", "layers: 2 is past the table of 2 entries"),
        ("0,2", "layers: 2 is past the table of 2 entries"),
        ("1,1", "layers: each index may appear once, got '1,1'"),
        ("-1", "layers: give table indices separated by commas, got '-1'"),
        ("0,,1", "layers: give table indices separated by commas, got '0,,1'"),
        (",".join(map(str, range(65))), "layers: at most 64 indices, got 65"),
    ])
    @pytest.mark.parametrize("max_points", [250, 10])
    def test_bad_rows_are_refused(self, api: TestClient, zoom_run: str, layers: str,
                                  message: str, max_points: int) -> None:
        body = _get(api, f"/api/runs/{zoom_run}/layer-stats?stat=amax&layers={layers}"
                         f"&max_points={max_points}", 422)
        assert body["detail"] == message
