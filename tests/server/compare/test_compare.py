"""Run comparison: the pure math (comparison_math) and GET /api/compare on both dialects."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from ampscope_server.compare import divergence_search
from ampscope_server.compare import reads as comparison_reads
from ampscope_server.compare.maths import (
    Divergence,
    LayerAt,
    LayerDiff,
    bucket_layer_diffs,
    by_step,
    earliest,
    first_divergence,
    layer_diffs,
    relative_difference,
    suspect_buckets,
)
from ampscope_server.store import steps_repository
from ampscope_server.store.rollups import SeriesAcc
from tests.server.wire import LAYERS, batch, layer_stats, new_id, record, strict_json
from tests.support.ingest import ingest_payload, post_batch

INF, NAN = math.inf, math.nan


def _finite(stats: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """`stats` with no NaN or inf in any layer (wire.layer_stats puts some in fc1.bias): a step
    with NaN/inf in a layer is left out of that layer's comparison (TestNonFiniteLayers)."""
    stats["nan_count"] = [0] * len(stats["nan_count"])
    stats["inf_count"] = [0] * len(stats["inf_count"])
    return stats


def _record(seq: int, **overrides: Any) -> dict[str, Any]:
    """`wire.record` with finite layers (`_finite`) unless `layers` is given."""
    rec = record(seq, **overrides)
    if "layers" not in overrides and rec["layers"] is not None:
        rec["layers"] = _finite(rec["layers"])
    return rec


class TestRelativeDifference:
    @pytest.mark.parametrize(("a", "b", "expected"), [
        (2.0, 2.0, 0.0), (2.0, 2.2, abs(2.2 - 2.0) / 2.0), (2.0, 1.0, 0.5),
        (-4.0, -3.0, 0.25), (0.0, 0.0, 0.0), (0.0, 1e-30, INF), (NAN, NAN, 0.0),
        (INF, INF, 0.0), (-INF, INF, INF), (1.0, NAN, INF), (NAN, 1.0, INF), (1.0, INF, INF),
    ])
    def test_values(self, a: float, b: float, expected: float) -> None:
        assert relative_difference(a, b) == expected


class TestFirstDivergence:
    def test_first_common_step_beyond_the_tolerance(self) -> None:
        a = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 5: 1.0}
        b = {0: 1.0, 1: 1.04, 3: 1.5, 4: 9.0, 5: 2.0}  # step 2 and 4 are not common
        assert first_divergence("loss", a, b, 0.05) == Divergence("loss", 3, 1.0, 1.5, 0.5)
        assert first_divergence("loss", a, b, 0.03) == Divergence(
            "loss", 1, 1.0, 1.04, abs(1.04 - 1.0))
        assert first_divergence("loss", a, b, 1.0) is None

    def test_the_tolerance_is_exclusive(self) -> None:
        assert first_divergence("loss", {0: 2.0}, {0: 3.0}, 0.5) is None
        assert first_divergence("loss", {0: 2.0}, {0: 3.0}, 0.49) == Divergence(
            "loss", 0, 2.0, 3.0, 0.5)

    def test_a_nan_in_one_run_only_diverges(self) -> None:
        a = {0: 1.0, 1: NAN, 2: 1.0}
        assert first_divergence("grad_norm", a, {0: 1.0, 1: NAN, 2: 1.0}, 0.05) is None
        found = first_divergence("grad_norm", a, {0: 1.0, 1: 1.0, 2: 1.0}, 0.05)
        assert found is not None and (found.step, found.relative) == (1, INF)

    def test_no_common_steps(self) -> None:
        assert first_divergence("loss", {0: 1.0}, {1: 5.0}, 0.05) is None

    def test_a_negative_tolerance_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"tolerance must be a number ≥ 0, got -0\.1"):
            first_divergence("loss", {}, {}, -0.1)

    def test_earliest(self) -> None:
        loss = Divergence("loss", 5, 1.0, 2.0, 1.0)
        grad = Divergence("grad_norm", 5, 1.0, 2.0, 1.0)
        assert earliest(loss, grad) is loss
        assert earliest(None, grad) is grad
        assert earliest(Divergence("loss", 7, 1.0, 2.0, 1.0), grad) is grad
        assert earliest(None, None) is None


def test_by_step_keeps_the_last_value_of_a_repeated_step_and_skips_nulls() -> None:
    assert by_step([(0, 1.0), (1, 2.0), (1, 3.0), (2, None), (3, 4.0)]) == {
        0: 1.0, 1: 3.0, 3: 4.0}


class TestLayerDiffs:
    def test_ratio_median_and_underflow_in_one_run_only(self) -> None:
        ref = {
            "w": {0: LayerAt(1.0, 0.0), 1: LayerAt(2.0, 0.0), 2: LayerAt(4.0, 0.0),
                  3: LayerAt(1.0, 0.0)},
            "b": {0: LayerAt(1.0, 0.5), 1: LayerAt(1.0, 0.5), 2: LayerAt(1.0, 0.0),
                  3: LayerAt(1.0, 0.5)},
            "only_ref": {0: LayerAt(1.0, 0.0)},
        }
        other = {
            # step 3 is not in `other`: common steps are 0, 1, 2
            "w": {0: LayerAt(3.0, 0.0), 1: LayerAt(2.0, 0.0), 2: LayerAt(2.0, 0.0)},
            "b": {0: LayerAt(1.0, 0.0), 1: LayerAt(1.0, 0.0), 2: LayerAt(1.0, 0.0)},
            "only_other": {0: LayerAt(1.0, 0.0)},
        }
        diffs = layer_diffs(ref, other, ["w", "b", "only_ref"], threshold=0.01)
        assert diffs == [
            LayerDiff("w", 3, 1.0, 3, 0.0, 0.0, None),  # median of 3, 1, 0.5
            LayerDiff("b", 3, 1.0, 3, 0.5, 0.0, "reference"),
        ]

    def test_unknown_or_zero_reference_norms_are_left_out_of_the_ratio(self) -> None:
        ref = {"w": {0: LayerAt(0.0, 1.0), 1: LayerAt(None, 0.0), 2: LayerAt(2.0, 0.0),
                     3: LayerAt(2.0, 0.0)}}
        other = {"w": {0: LayerAt(5.0, 0.0), 1: LayerAt(1.0, 0.0), 2: LayerAt(1.0, 0.5),
                       3: LayerAt(None, 0.5)}}
        # ratio only at step 2 (0.5); lost_frac medians: ref (1, 0, 0, 0) → 0, other → 0.25
        assert layer_diffs(ref, other, ["w"], threshold=0.1) == [
            LayerDiff("w", 4, 0.5, 1, 0.0, 0.25, "other")]

    def test_steps_with_nan_or_inf_are_left_out_and_counted(self) -> None:
        """A diverged run: from step 2 its layer is all NaN (norm 0 over no finite element, the
        optimizer's NaN-born zeros in lost_frac). Neither a "0x" ratio nor "underflow only in"."""
        ref = {"w": {s: LayerAt(2.0, 0.0) for s in range(5)}}
        other = {"w": {0: LayerAt(4.0, 0.0), 1: LayerAt(4.0, 0.0),
                       **{s: LayerAt(0.0, 1.0, nonfinite=True) for s in range(2, 5)}}}
        assert layer_diffs(ref, other, ["w"], threshold=0.01) == [
            LayerDiff("w", 5, 2.0, 2, 0.0, 0.0, None, nonfinite_steps=3)]
        # NaN in the reference only, all steps: no ratio, no medians, every step counted.
        bad = {"w": {s: LayerAt(1.0, 0.5, nonfinite=True) for s in range(5)}}
        assert layer_diffs(bad, ref, ["w"], threshold=0.01) == [
            LayerDiff("w", 5, None, 0, None, None, None, nonfinite_steps=5)]

    def test_no_common_steps(self) -> None:
        ref = {"w": {0: LayerAt(1.0, 1.0)}}
        other = {"w": {1: LayerAt(1.0, 0.0)}}
        assert layer_diffs(ref, other, ["w"], 0.01) == [
            LayerDiff("w", 0, None, 0, None, None, None)]


# --- GET /api/compare ------------------------------------------------------------------------

def _get(api: TestClient, path: str, status: int = 200) -> Any:
    response = api.get(path)
    assert response.status_code == status, response.text
    return strict_json(response.text)


def _run_b_stats(seq: int) -> dict[str, list[Any]]:
    """Run A's statistics at `seq` with fc1.weight's norm doubled and nothing lost in fc1.bias."""
    stats = _finite(layer_stats(1.0 + seq))
    stats["l2"][0] *= 2
    stats["zero_frac"][1] = stats["underflow_frac"][1] = 0.0
    return stats


def _seed_pair(api: TestClient) -> tuple[str, str]:
    """A: steps 0-3 as `record` makes them. B: steps 0-4, its loss 10 % higher from step 2, its
    grad norm 4 % higher at step 1, fc1.weight's norm doubled, no loss in fc1.bias."""
    a, b = new_id(), new_id()
    post_batch(api, batch([_record(i) for i in range(4)], run_id=a, name="fp32 baseline"))
    records = []
    for i in range(5):
        rec = _record(i, layers=_run_b_stats(i))
        if i >= 2:
            rec["loss"] = (2.31 - 0.01 * i) * 1.1
        if i == 1:
            rec["grad_norm"] = 0.75 * 1.04
        records.append(rec)
    post_batch(api, batch(records, run_id=b, name="<img src=x onerror=alert(1)>"))
    return a, b


class TestCompareEndpoint:
    def test_divergence_and_layer_differences(self, api: TestClient) -> None:
        a, b = _seed_pair(api)
        body = _get(api, f"/api/compare?runs={a},{b}")
        assert (body["tolerance"], body["underflow_threshold"], body["reference"]) == (
            0.05, 0.01, a)
        assert [(r["id"], r["name"]) for r in body["runs"]] == [
            (a, "fp32 baseline"), (b, "<img src=x onerror=alert(1)>")]
        [comparison] = body["comparisons"]
        loss_2 = 2.31 - 0.01 * 2
        expected_loss = {"metric": "loss", "step": 2, "reference_value": loss_2,
                         "value": loss_2 * 1.1, "relative": abs(loss_2 * 1.1 - loss_2) / loss_2}
        assert comparison == {
            "run": b, "reference": a, "common_steps": 4, "layer_steps": 4,
            "divergence": expected_loss, "loss_divergence": expected_loss,
            "grad_norm_divergence": None,
            "layers": [
                {"layer": "fc1.weight", "steps": 4, "l2_ratio": 2.0, "ratio_steps": 4,
                 "lost_frac_reference": 0.0, "lost_frac": 0.0, "underflow_only_in": None,
                 "nonfinite_steps": 0},
                {"layer": "fc1.bias", "steps": 4, "l2_ratio": 1.0, "ratio_steps": 4,
                 "lost_frac_reference": 0.15625, "lost_frac": 0.0, "underflow_only_in": a,
                 "nonfinite_steps": 0},
            ],
            "divergence_exact": True, "layer_bucket_width": 1,
        }

    def test_a_tighter_tolerance_finds_the_grad_norm_first(self, api: TestClient) -> None:
        a, b = _seed_pair(api)
        [comparison] = _get(api, f"/api/compare?runs={a},{b}&tolerance=0.03")["comparisons"]
        assert comparison["divergence"] == comparison["grad_norm_divergence"] == {
            "metric": "grad_norm", "step": 1, "reference_value": 0.75, "value": 0.75 * 1.04,
            "relative": abs(0.75 * 1.04 - 0.75) / 0.75}
        assert comparison["loss_divergence"]["step"] == 2

    def test_a_calibration_overflow_is_not_a_divergence(self, api: TestClient) -> None:
        """Run B's scaler starts too high: steps 0 and 1 overflow and are skipped (grad norm
        inf), then it trains exactly as A. The grad norms of skipped steps are not compared."""
        a, b = new_id(), new_id()
        post_batch(api, batch([_record(i) for i in range(6)], run_id=a))
        post_batch(api, batch([_record(i, skipped=i < 2, found_inf=i < 2,
                                 grad_norm="inf" if i < 2 else 0.75) for i in range(6)],
                         run_id=b))
        [comparison] = _get(api, f"/api/compare?runs={a},{b}")["comparisons"]
        assert comparison["divergence"] is None
        assert comparison["grad_norm_divergence"] is None and comparison["common_steps"] == 6

    def test_the_reference_is_the_first_run_given(self, api: TestClient) -> None:
        a, b = _seed_pair(api)
        body = _get(api, f"/api/compare?runs={b},{a}&underflow_threshold=0.5")
        assert body["reference"] == b
        [comparison] = body["comparisons"]
        assert (comparison["run"], comparison["reference"]) == (a, b)
        assert [d["l2_ratio"] for d in comparison["layers"]] == [0.5, 1.0]
        assert [d["underflow_only_in"] for d in comparison["layers"]] == [None, None]

    def test_three_runs_and_layers_matched_by_name(self, api: TestClient) -> None:
        a, b = _seed_pair(api)
        c = new_id()
        layers = copy.deepcopy(LAYERS)
        layers[1]["name"] = "fc2.bias"
        post_batch(api, batch([_record(0)], run_id=c, layers=layers))
        body = _get(api, f"/api/compare?runs={a},{b},{c}")
        assert [x["run"] for x in body["comparisons"]] == [b, c]
        third = body["comparisons"][1]
        assert [d["layer"] for d in third["layers"]] == ["fc1.weight"]
        assert (third["common_steps"], third["layer_steps"], third["divergence"]) == (1, 1, None)

    def test_wrapped_and_plain_runs_match_layer_for_layer(self, api: TestClient) -> None:
        """Layers match by canonical name: a run stored before issue #13 by a DDP model
        (`module.x.weight` as its names) and one of a newer hook (canonical names, the raw ones
        beside) both meet the plain run's layers, as two plain runs would."""
        a, b = _seed_pair(api)
        plain = _get(api, f"/api/compare?runs={a},{b}")["comparisons"][0]
        old_ddp, new_compiled = new_id(), new_id()
        records = [_record(i, layers=_run_b_stats(i)) for i in range(4)]
        for i in (2, 3):
            records[i]["loss"] = (2.31 - 0.01 * i) * 1.1
        records[1]["grad_norm"] = 0.75 * 1.04
        old_layers = [{**layer, "name": f"module.{layer['name']}"} for layer in LAYERS]
        post_batch(api, batch(records, run_id=old_ddp, layers=old_layers))
        new_layers = [{**layer, "raw_name": f"_orig_mod.{layer['name']}"} for layer in LAYERS]
        post_batch(api, batch(records, run_id=new_compiled, layers=new_layers))
        expected_layers = plain["layers"]
        assert [d["layer"] for d in expected_layers] == ["fc1.weight", "fc1.bias"]

        body = _get(api, f"/api/compare?runs={a},{old_ddp},{new_compiled}")
        for comparison in body["comparisons"]:
            assert comparison["layers"] == expected_layers
            assert comparison["layer_steps"] == 4
        # The wrapped run as the reference: its layers under their canonical names.
        [reverse] = _get(api, f"/api/compare?runs={old_ddp},{a}")["comparisons"]
        assert [(d["layer"], d["l2_ratio"]) for d in reverse["layers"]] == [
            ("fc1.weight", 0.5), ("fc1.bias", 1.0)]

    @pytest.mark.parametrize(("query", "detail"), [
        ("runs=only-one", "runs: give 2 to 8 run ids separated by commas, got 1"),
        ("runs=x,,x", "runs: each run may appear once, got 'x,,x'"),
        ("runs=" + ",".join(f"r{i}" for i in range(9)),
         "runs: give 2 to 8 run ids separated by commas, got 9"),
    ])
    def test_bad_run_lists_are_422(self, api: TestClient, query: str, detail: str) -> None:
        assert _get(api, f"/api/compare?{query}", 422) == {"detail": detail}

    def test_bad_numbers_are_422(self, api: TestClient) -> None:
        a, b = _seed_pair(api)
        for query in ("tolerance=-0.1", "tolerance=abc", "underflow_threshold=2"):
            response = api.get(f"/api/compare?runs={a},{b}&{query}")
            assert response.status_code == 422, (query, response.text)

    def test_an_unknown_run_is_404(self, api: TestClient) -> None:
        a, _ = _seed_pair(api)
        missing = new_id()
        assert _get(api, f"/api/compare?runs={a},{missing}", 404) == {
            "detail": f"run '{missing}' not found"}

    def test_the_compare_page_is_served(self, api: TestClient) -> None:
        response = api.get("/compare?runs=a,b")
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/html; charset=utf-8"
        assert '<script type="module" src="/static/js/compare.js"></script>' in response.text


# --- long runs: bounded reads through the rollups ----------------------------------------------

class TestSuspectBuckets:
    def test_last_min_max_and_step_mismatches(self) -> None:
        same = SeriesAcc(4, 1.0, 2.0, 1.5, 3)
        ref = {0: same, 1: same, 2: same, 3: same, 4: same, 5: same}
        other = {
            0: same,
            1: SeriesAcc(4, 1.0, 2.0, 1.7, 7),    # last 13 % apart
            2: SeriesAcc(4, 1.0, 9.0, 1.5, 11),   # a spike: the max parts
            3: SeriesAcc(4, 1.0, 2.0, 1.5, 14),   # last taken at another step
            4: SeriesAcc(0, NAN, NAN, NAN, -1),   # nothing to compare
            6: same,                              # not in the reference
        }
        assert suspect_buckets(ref, other, 0.05) == [1, 2, 3]
        assert suspect_buckets(ref, {0: SeriesAcc(4, 1.0, INF, 1.5, 3)}, 0.05) == [0]


class TestBucketLayerDiffs:
    def test_the_same_medians_as_per_step_with_layers_matched_by_name(self) -> None:
        m = -INF  # rollups.MISSING: no value in the bucket
        ok = [False, False]
        ref = {0: ([1.0, 2.0], [0.0, 0.5], ok), 4: ([2.0, m], [0.0, m], ok),
               8: ([0.0, 4.0], [0.0, 0.5], ok)}
        other = {0: ([9.0, 3.0], [0.0, 0.0], ok), 4: ([8.0, 5.0], [0.0, 0.0], ok),
                 8: ([9.0, 8.0], [0.0, 0.0], ok), 12: ([1.0, 1.0], [0.0, 0.0], ok)}
        # The other run lists the layers the other way round, and one more.
        other_order = ["b", "a", "c"]
        swapped = {k: ([l2[1], l2[0], 1.0], [lost[1], lost[0], 0.0], [False] * 3)
                   for k, (l2, lost, _) in other.items()}
        found = bucket_layer_diffs(ref, ["a", "b"], swapped, other_order, 0.01)
        per_step = layer_diffs(
            {"a": {0: LayerAt(1.0, 0.0), 4: LayerAt(2.0, 0.0), 8: LayerAt(0.0, 0.0)},
             "b": {0: LayerAt(2.0, 0.5), 8: LayerAt(4.0, 0.5)}},
            {"a": {k: LayerAt(v[0][0], v[1][0]) for k, v in other.items()},
             "b": {k: LayerAt(v[0][1], v[1][1]) for k, v in other.items()}},
            ["a", "b"], 0.01)
        assert found == per_step
        assert [(d.name, d.steps, d.l2_ratio, d.underflow_only_in) for d in found] == [
            ("a", 3, 6.5, None), ("b", 2, 1.75, "reference")]

    def test_no_common_bucket(self) -> None:
        assert bucket_layer_diffs({0: ([1.0], [0.0], [False])}, ["a"],
                                  {4: ([1.0], [0.0], [False])}, ["a"],
                                  0.01) == [LayerDiff("a", 0, None, 0, None, None, None)]

    def test_buckets_with_nan_or_inf_are_left_out_and_counted(self) -> None:
        """A diverged run's NaN buckets: norm 0 (no finite element), every value a zero."""
        ref = {0: ([2.0], [0.0], [False]), 4: ([2.0], [0.0], [False]), 8: ([2.0], [0.0], [False])}
        other = {0: ([4.0], [0.0], [False]), 4: ([0.0], [1.0], [True]), 8: ([0.0], [1.0], [True])}
        assert bucket_layer_diffs(ref, ["a"], other, ["a"], 0.01) == [
            LayerDiff("a", 3, 2.0, 1, 0.0, 0.0, None, nonfinite_steps=2)]


LONG = 600
SPIKE, DRIFT = 357, 500


def _long_loss(step: int) -> float:
    return 1.0 + 0.01 * (step % 7)


@pytest.fixture
def long_pair(sessions: sessionmaker[Session]) -> tuple[str, str]:
    """A and B over LONG steps: B's loss spikes x3 at SPIKE alone and drifts 20 % up from DRIFT,
    its fc1.weight norm is doubled everywhere."""
    a, b = new_id(), new_id()
    records_a = [_record(i, loss=_long_loss(i)) for i in range(LONG)]
    records_b = []
    for i in range(LONG):
        rec = _record(i, layers=_run_b_stats(i), loss=_long_loss(i))
        rec["layers"]["zero_frac"][1] = 0.125  # as A's: only the norm differs
        rec["layers"]["underflow_frac"][1] = 0.03125
        if i == SPIKE:
            rec["loss"] *= 3
        if i >= DRIFT:
            rec["loss"] *= 1.2
        records_b.append(rec)
    for first in range(0, LONG, 200):
        ingest_payload(sessions, batch(records_a[first:first + 200], run_id=a))
        ingest_payload(sessions, batch(records_b[first:first + 200], run_id=b))
    return a, b


def _counting(monkeypatch: pytest.MonkeyPatch, name: str, seen: list[int]) -> None:
    original: Callable[..., Any] = getattr(steps_repository, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        rows = original(*args, **kwargs)
        seen.append(len(rows))
        return rows
    monkeypatch.setattr(steps_repository, name, counted)


class TestLongRuns:
    def test_bucketed_search_finds_the_exact_first_divergence(
        self, sessions: sessionmaker[Session], long_pair: tuple[str, str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        a, b = long_pair
        with sessions() as session:
            exact = comparison_reads.compare_runs(session, [a, b], 0.05, 0.01, 300).comparisons[0]
        assert exact.divergence_exact and exact.layer_bucket_width == 1
        assert exact.divergence is not None and exact.divergence.step == SPIKE

        # The same runs as if they were long: 64-step buckets, rows read counted.
        monkeypatch.setattr(divergence_search, "SCALAR_RAW_STEPS", 64)
        monkeypatch.setattr(divergence_search, "SCALAR_BUCKETS", 16)
        monkeypatch.setattr(comparison_reads, "LAYER_RAW_ROWS", 100)
        monkeypatch.setattr(comparison_reads, "LAYER_BUCKETS", 16)
        series_rows: list[int] = []
        _counting(monkeypatch, "series_rows", series_rows)
        _counting(monkeypatch, "heatmap_rows", [])
        with sessions() as session:
            found = comparison_reads.compare_runs(session, [a, b], 0.05, 0.01, 300).comparisons[0]
        assert not found.divergence_exact and found.layer_bucket_width == 64
        assert found.divergence == exact.divergence == found.loss_divergence
        assert found.common_steps == exact.common_steps == LONG
        # Raw steps read: the suspect bucket and the one before it, per run and metric.
        assert series_rows and max(series_rows) <= 2 * 64 and sum(series_rows) <= 8 * 2 * 64
        # Per-layer medians over the buckets: the doubled norm, the same lost share.
        buckets = -(-LONG // 64)
        assert found.layer_steps == buckets
        assert [(d.layer, d.steps, d.l2_ratio, d.underflow_only_in) for d in found.layers] == [
            ("fc1.weight", buckets, 2.0, None), ("fc1.bias", buckets, 1.0, None)]
        assert found.layers[1].lost_frac == found.layers[1].lost_frac_reference == 0.15625

        # Looser tolerances: the spike (3x) alone, then nothing; as step by step.
        for tolerance, step in ((1.5, SPIKE), (2.5, None)):
            with sessions() as session:
                loose = comparison_reads.compare_runs(session, [a, b], tolerance, 0.01, 300)
            divergence = loose.comparisons[0].divergence
            assert (divergence and divergence.step) == step, tolerance
