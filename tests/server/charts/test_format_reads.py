"""`GET /api/runs/{id}/formats` and `/formats/trend` (#33) on both dialects: the sampled steps
thinned to `limit` with the first and the last, one step's full matrix nested in the wire's
order with the layers' names (NaN and ±inf tagged), `step=` picking the sampled step at or
before it, one (layer, operand, recipe) over the same steps, what is refused (422, 404), what
is an empty answer, and that neither read takes a blob whole but the one step it shows."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from ampscope_server.charts import format_reads
from ampscope_server.store import formats_repository, runs_repository
from ampscope_server.store.format_packing import thinned
from tests.server.wire import (
    LAYERS,
    batch_v2,
    f64le,
    format_values,
    formats,
    new_id,
    record_v2,
    scale_values,
    strict_json,
)
from tests.support.ingest import ingest_payload, post_batch

SAMPLED = 9
RECIPES = ["mxfp8", "nvfp4"]


def _payload(steps: list[int], blocks: dict[int, dict[str, Any] | None],
             run_id: str | None = None) -> dict[str, Any]:
    records = []
    for seq, step in enumerate(steps):
        record = record_v2(seq, step=step, with_layers=False)
        if blocks.get(step) is not None:
            record["formats"] = blocks[step]
        records.append(record)
    return dict(batch_v2(records, run_id=run_id or new_id()), schema_version=8)


def _sampled(steps: int = SAMPLED) -> dict[str, Any]:
    """Sampled steps 0, 10, …; layer 1 listed before layer 0; the last step's first value NaN,
    its first operand statistic -inf and its first scale exponents not measured (all NaN)."""
    blocks: dict[int, dict[str, Any] | None] = {
        10 * k: formats([1, 0], RECIPES, seed=float(k), scales=True) for k in range(steps)}
    values, operands = format_values([1, 0], RECIPES, seed=float(steps - 1))
    values[0], operands[0] = math.nan, -math.inf
    scales = scale_values([1, 0], RECIPES, seed=steps - 1)
    scales[:17] = [math.nan] * 17
    blocks[10 * (steps - 1)] = {"recipes": RECIPES, "layers": [1, 0], "values": f64le(values),
                                "operands": f64le(operands), "scales": f64le(scales)}
    return _payload([10 * k + d for k in range(steps) for d in (0, 5)], blocks)


@pytest.fixture
def run_id(api: TestClient) -> str:
    payload = _sampled()
    assert post_batch(api, payload)["accepted"] == 2 * SAMPLED
    return str(payload["run"]["id"])


def _get(api: TestClient, path: str, status: int = 200) -> Any:
    response = api.get(path)
    assert response.status_code == status, response.text
    return strict_json(response.text)


def _expected_matrix(seed: float) -> tuple[list[Any], list[Any]]:
    """`format_values([1, 0], RECIPES, seed)` nested [layer][operand][recipe][stat] and
    [layer][operand][stat]."""
    values = [[[[seed + p + o / 10 + r / 100 + s / 1000 for s in range(5)] for r in range(2)]
                for o in range(3)] for p in range(2)]
    operands = [[[seed + p + o / 10 + k / 100 + 0.5 for k in range(4)] for o in range(3)]
                for p in range(2)]
    return values, operands


class TestFormats:
    def test_every_sampled_step_and_the_last_ones_matrix(self, api: TestClient, run_id: str
                                                         ) -> None:
        body = _get(api, f"/api/runs/{run_id}/formats")
        assert body["operand_names"] == ["input", "weight", "grad_output"]
        assert body["stat_names"] == ["underflow_frac", "saturated_frac", "rel_rmse",
                                      "scale_min_frac", "scale_max_frac"]
        assert body["operand_stat_names"] == ["amax", "rms", "kurtosis", "nonfinite_frac"]
        assert (body["sampled"], body["downsampled"]) == (SAMPLED, False)
        assert [s["step"] for s in body["steps"]] == [10 * k for k in range(SAMPLED)]
        ids = [s["id"] for s in body["steps"]]
        assert ids == [ids[0] + 2 * k for k in range(SAMPLED)]  # every other step was sampled
        matrix = body["matrix"]
        values, operands = _expected_matrix(float(SAMPLED - 1))
        values[0][0][0][0], operands[0][0][0] = "nan", "-inf"
        assert matrix == {
            "id": ids[-1], "step": 10 * (SAMPLED - 1), "recipes": RECIPES,
            "layers": [{"index": 1, "name": LAYERS[1]["name"]},
                       {"index": 0, "name": LAYERS[0]["name"]}],
            "values": values, "operands": operands, "trained": None}
        # The made-up values' errors are all above 1 (`format_values`): every gradient drowns
        # in its noise, so each recipe keeps the weight in BF16 (findings/recipe_fit.py). The
        # 1-D row is judged as a norm's affine weight, apart: its underflow is above 0.
        assert [(v["recipe"], v["step"], v["measured"], [k["layer"] for k in v["keep"]],
                 {k["operand"] for k in v["keep"]}, v["norms_measured"],
                 [(k["layer"], k["stat"]) for k in v["norms"]]) for v in body["verdicts"]] == [
            (recipe, 10 * (SAMPLED - 1), 1, [LAYERS[0]["name"]], {"grad_output"}, 1,
             [(LAYERS[1]["name"], "underflow_frac")]) for recipe in RECIPES]

    @pytest.mark.parametrize("limit", [2, 3, 4, 8])
    def test_thinned_to_the_limit_first_and_last_kept(self, api: TestClient, run_id: str,
                                                      limit: int) -> None:
        body = _get(api, f"/api/runs/{run_id}/formats?limit={limit}")
        assert (body["sampled"], body["downsampled"]) == (SAMPLED, True)
        assert [s["step"] for s in body["steps"]] == [10 * p for p in thinned(SAMPLED, limit)]
        assert len(body["steps"]) == limit

    @pytest.mark.parametrize(("step", "shown"), [(0, 0), (9, 0), (10, 10), (45, 40),
                                                 (80, 80), (10**15, 80)])
    def test_step_picks_the_sampled_step_at_or_before(self, api: TestClient, run_id: str,
                                                      step: int, shown: int) -> None:
        matrix = _get(api, f"/api/runs/{run_id}/formats?step={step}")["matrix"]
        assert matrix["step"] == shown
        if shown < 80:
            values, operands = _expected_matrix(shown / 10)
            assert (matrix["values"], matrix["operands"]) == (values, operands)

    def test_what_the_modules_trained_in(self, api: TestClient) -> None:
        """`trained` nested per layer and operand, as the matrix's other arrays."""
        amax = [1.0, 2.0, 3.0, 4.0, 5.0, math.nan]
        scale = [448.0, 224.0, 149.25, 112.0, 89.6, math.nan]
        block = {**formats([1, 0], RECIPES), "trained": {
            "recipes": ["fp8_tensorwise", None], "amax": f64le(amax), "scale": f64le(scale)}}
        payload = _payload([0], {0: block})
        post_batch(api, payload)
        trained = _get(api, f"/api/runs/{payload['run']['id']}/formats")["matrix"]["trained"]
        assert trained == {"recipes": ["fp8_tensorwise", None],
                           "amax": [[1.0, 2.0, 3.0], [4.0, 5.0, "nan"]],
                           "scale": [[448.0, 224.0, 149.25], [112.0, 89.6, "nan"]]}

    def test_none_sampled_or_none_that_early(self, api: TestClient) -> None:
        plain = _payload([0, 1], {})
        late = _payload([5, 6], {6: formats([0], RECIPES)})
        for payload in (plain, late):
            post_batch(api, payload)
        assert _get(api, f"/api/runs/{plain['run']['id']}/formats") == {
            "operand_names": ["input", "weight", "grad_output"],
            "stat_names": ["underflow_frac", "saturated_frac", "rel_rmse", "scale_min_frac",
                           "scale_max_frac"],
            "operand_stat_names": ["amax", "rms", "kurtosis", "nonfinite_frac"],
            "sampled": 0, "downsampled": False, "steps": [], "matrix": None, "verdicts": []}
        body = _get(api, f"/api/runs/{late['run']['id']}/formats?step=5")
        assert ([s["step"] for s in body["steps"]], body["matrix"], body["verdicts"]) == (
            [6], None, [])

    @pytest.mark.parametrize(("query", "detail"), [
        ("limit=1", "query.limit: Input should be greater than or equal to 2"),
        ("limit=2001", "query.limit: Input should be less than or equal to 2000"),
        ("step=-1", "query.step: Input should be greater than or equal to 0"),
    ])
    def test_bad_parameters_are_422(self, api: TestClient, run_id: str, query: str,
                                    detail: str) -> None:
        assert _get(api, f"/api/runs/{run_id}/formats?{query}", 422) == {"detail": detail}


def _trend(api: TestClient, run_id: str, query: str, status: int = 200) -> Any:
    return _get(api, f"/api/runs/{run_id}/formats/trend?{query}", status)


class TestTrend:
    def test_one_layer_operand_and_recipe_over_the_steps(self, api: TestClient, run_id: str
                                                         ) -> None:
        body = _trend(api, run_id, "layer=1&operand=input&recipe=mxfp8")
        listed = _get(api, f"/api/runs/{run_id}/formats")["steps"]
        # Layer 1 is listed first (position 0), mxfp8 first (recipe 0), input operand 0.
        assert body == {
            "layer": 1, "name": LAYERS[1]["name"], "operand": "input", "recipe": "mxfp8",
            "sampled": SAMPLED, "downsampled": False,
            "steps": [10 * k for k in range(SAMPLED)],
            "ids": [s["id"] for s in listed],
            "values": {name: [k + s / 1000 for k in range(SAMPLED)] for s, name in enumerate(
                ["underflow_frac", "saturated_frac", "rel_rmse", "scale_min_frac",
                 "scale_max_frac"])} | {"underflow_frac": [*range(SAMPLED - 1), "nan"]},
            "operand_values": {name: [k + j / 100 + 0.5 for k in range(SAMPLED)]
                               for j, name in enumerate(["amax", "rms", "kurtosis",
                                                         "nonfinite_frac"])}
            | {"amax": [k + 0.5 for k in range(SAMPLED - 1)] + ["-inf"]},
            "scales": [{"top": k, "counts": [1] + [0] * 15} for k in range(SAMPLED - 1)]
            + [None],
        }

    def test_another_cut(self, api: TestClient, run_id: str) -> None:
        body = _trend(api, run_id, "layer=0&operand=grad_output&recipe=nvfp4&limit=3")
        kept = thinned(SAMPLED, 3)
        assert (body["downsampled"], body["steps"]) == (True, [10 * p for p in kept])
        assert body["values"]["rel_rmse"] == [p + 1 + 2 / 10 + 1 / 100 + 2 / 1000 for p in kept]
        assert body["operand_values"]["kurtosis"] == [p + 1 + 2 / 10 + 2 / 100 + 0.5
                                                      for p in kept]
        # Position 1, operand 2, recipe 1: top p - 12, counts 2, 2, 1.
        assert body["scales"] == [{"top": p - 12, "counts": [2, 2, 1] + [0] * 13}
                                  for p in kept]

    def test_a_step_from_a_client_before_v8_has_no_scales(self, api: TestClient) -> None:
        """A v7 sample, then a v8 one whose cut had no block holding a value (nan top)."""
        scales = scale_values([0], RECIPES)
        scales[:17] = [math.nan] + [0.0] * 16
        old = dict(_payload([0], {0: formats([0], RECIPES)}), schema_version=7)
        new = _payload([10], {10: {**formats([0], RECIPES), "scales": f64le(scales)}},
                       run_id=old["run"]["id"])
        new["attempt"] = {**old["attempt"], "id": new_id()}
        for payload in (old, new):
            post_batch(api, payload)
        body = _trend(api, old["run"]["id"], "layer=0&operand=input&recipe=mxfp8")
        assert body["steps"] == [0, 10]
        assert body["scales"] == [None, {"top": None, "counts": [0] * 16}]

    @pytest.mark.parametrize(("query", "name"), [
        ("layer=1&operand=weight&recipe=fp8_rowwise", LAYERS[1]["name"]),
        ("layer=2&operand=weight&recipe=mxfp8", None),
        ("layer=2147483647&operand=weight&recipe=mxfp8", None),
    ])
    def test_never_recorded_is_an_empty_series(self, api: TestClient, run_id: str, query: str,
                                               name: str | None) -> None:
        body = _trend(api, run_id, query)
        assert (body["name"], body["sampled"], body["steps"], body["ids"]) == (
            name, SAMPLED, [], [])
        assert list(body["values"]) == ["underflow_frac", "saturated_frac", "rel_rmse",
                                        "scale_min_frac", "scale_max_frac"]
        assert list(body["operand_values"]) == ["amax", "rms", "kurtosis", "nonfinite_frac"]
        assert all(series == [] for series in [*body["values"].values(),
                                               *body["operand_values"].values()])

    @pytest.mark.parametrize(("query", "detail"), [
        ("layer=0&operand=output&recipe=mxfp8",
         "query.operand: Input should be 'input', 'weight' or 'grad_output'"),
        ("layer=0&operand=input&recipe=mx,fp8",
         "query.recipe: String should match pattern '^[a-z][a-z0-9_]{0,31}$'"),
        ("layer=0&operand=input&recipe=MXFP8",
         "query.recipe: String should match pattern '^[a-z][a-z0-9_]{0,31}$'"),
        ("layer=-1&operand=input&recipe=mxfp8",
         "query.layer: Input should be greater than or equal to 0"),
        ("operand=input&recipe=mxfp8", "query.layer: field required"),
        ("layer=0&operand=input&recipe=mxfp8&limit=1",
         "query.limit: Input should be greater than or equal to 2"),
    ])
    def test_bad_parameters_are_422(self, api: TestClient, run_id: str, query: str,
                                    detail: str) -> None:
        assert _trend(api, run_id, query, 422) == {"detail": detail}


@pytest.mark.parametrize("path", ["formats", "formats/trend?layer=0&operand=input&recipe=a"])
def test_an_unknown_run_is_404(api: TestClient, path: str) -> None:
    run_id = new_id()
    assert _get(api, f"/api/runs/{run_id}/{path}", 404) == {
        "detail": f"run '{run_id}' not found"}


@pytest.fixture
def statements(sessions: sessionmaker[Session]) -> Iterator[list[str]]:
    """The SQL text of every statement the sessions' engine runs meanwhile."""
    engine = sessions.kw["bind"]
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


def _whole_blobs(statements: list[str]) -> int:
    """How many times the statements select `step_formats.data` whole (not cut by substr)."""
    return sum(s.count("step_formats.data") - s.count("substr(step_formats.data")
               for s in statements)


def test_the_reads_take_no_blob_whole_but_the_one_shown(
    sessions: sessionmaker[Session], statements: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """23 sampled steps read with a limit of 5: the list and the trend read 5 rows each (the
    rows the database returns), and only the matrix's row and the two before it, which the
    verdicts take, are read whole (one statement, LIMIT 3)."""
    payload = _sampled(23)
    ingest_payload(sessions, payload)
    run = str(payload["run"]["id"])
    returned: list[int] = []
    original = formats_repository.trend_rows

    def counted(*args: Any, **kwargs: Any) -> tuple[int, list[formats_repository.TrendRow]]:
        count, rows = original(*args, **kwargs)
        returned.append(len(rows))
        return count, rows

    monkeypatch.setattr(formats_repository, "trend_rows", counted)
    statements.clear()
    with sessions() as session:
        model = runs_repository.get_run(session, run)
        assert model is not None
        listed = format_reads.formats_read(session, model, None, 5)
        trend = format_reads.trend_read(session, model, 0, "weight", "nvfp4", 5)
    assert len(listed.steps) == len(trend.steps) == returned[0] == 5
    assert [s.step for s in listed.steps] == trend.steps == [10 * p for p in thinned(23, 5)]
    assert _whole_blobs(statements) == 1
    (whole,) = [s for s in statements if _whole_blobs([s])]
    assert "LIMIT" in whole
    # The block scale exponents are cut by the trend alone: no read takes them whole.
    assert sum(s.count("step_formats.scales") - s.count("substr(step_formats.scales")
               for s in statements) == 0
    assert [v.step for v in listed.verdicts] == [220] * 2
