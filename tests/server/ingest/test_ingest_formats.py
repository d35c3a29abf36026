"""Wire v7 `records[].formats` (#33), on both dialects: a sampled step's scaled-format what-ifs
are stored as sent, packed or as JSON arrays, and read back bit for bit (NaN, ±inf, -0.0 and
the smallest subnormal; a NaN's payload in the stored bytes); a batch sent again stores them
once; a v6 batch carrying them is refused by name; every malformed block is a 422 naming its
field, a layer past the table too."""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from ampscope_server.store.models import StepFormats
from tests.server.wire import (
    RECIPES,
    batch_v2,
    f64le,
    format_values,
    formats,
    new_id,
    record_v2,
    scale_values,
    strict_json,
    tagged,
)
from tests.support.ingest import ingest_payload, post_batch

TINY = 2.0**-1074
MAX = 1.7976931348623157e308
PAYLOAD_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0123))[0]
"""A quiet NaN with a payload: stored as sent, its bits kept."""
SPECIAL = [math.nan, math.inf, -math.inf, -0.0, TINY, MAX, PAYLOAD_NAN]


def _special(layers: list[int], recipes: list[str]) -> tuple[list[float], list[float]]:
    """`format_values` with the special values at the start of both arrays."""
    values, operands = format_values(layers, recipes, seed=1.0)
    values[:len(SPECIAL)] = SPECIAL
    operands[:len(SPECIAL)] = SPECIAL
    return values, operands


def _batch(version: int, *blocks: dict[str, Any] | None, with_layers: bool = True,
           **kwargs: Any) -> dict[str, Any]:
    records = []
    for seq, block in enumerate(blocks):
        rec = record_v2(seq, with_layers=with_layers)
        if block is not None:
            rec["formats"] = block
        records.append(rec)
    return dict(batch_v2(records, run_id=new_id(), **kwargs), schema_version=version)


def _get(api: TestClient, path: str) -> Any:
    response = api.get(path)
    assert response.status_code == 200, response.text
    return strict_json(response.text)


def _bits(values: list[Any]) -> list[Any]:
    """Floats by their bits (NaN equals NaN, -0.0 is not 0.0), tags as themselves."""
    return [struct.pack("<d", v) if isinstance(v, float) else v for v in values]


class TestStored:
    @pytest.mark.parametrize("packed", [True, False], ids=["packed", "json"])
    def test_read_back_bit_exact_through_the_export(self, api: TestClient, packed: bool
                                                    ) -> None:
        values, operands = _special([1, 0], ["mxfp8", "nvfp4"])
        encode = f64le if packed else tagged
        block = {"recipes": ["mxfp8", "nvfp4"], "layers": [1, 0], "values": encode(values),
                 "operands": encode(operands)}
        payload = _batch(7, None, block)
        run_id = payload["run"]["id"]
        assert post_batch(api, payload)["accepted"] == 2
        steps = _get(api, f"/api/runs/{run_id}/export")["steps"]
        # A step without one carries no key, as the hook sends it; the other the JSON form.
        assert "formats" not in steps[0]
        got = steps[1]["formats"]
        assert (got["recipes"], got["layers"]) == (["mxfp8", "nvfp4"], [1, 0])
        assert _bits(got["values"]) == _bits(tagged(values))
        assert _bits(got["operands"]) == _bits(tagged(operands))
        assert math.copysign(1.0, got["values"][3]) == -1.0

    @pytest.mark.parametrize("packed", [True, False], ids=["packed", "json"])
    def test_what_a_module_trained_in_is_read_back_bit_exact(self, api: TestClient,
                                                            packed: bool) -> None:
        """`trained`: the first listed layer trains in fp8_tensorwise, the second in none."""
        encode = f64le if packed else tagged
        amax = [448.0, 2.5, SPECIAL[0], SPECIAL[1], -0.0, TINY]
        scale = [1.0, 179.2, PAYLOAD_NAN, 0.0, MAX, math.nan]
        block = {**formats([1, 0]), "trained": {"recipes": ["fp8_tensorwise", None],
                                                "amax": encode(amax), "scale": encode(scale)}}
        payload = _batch(7, block)
        assert post_batch(api, payload)["accepted"] == 1
        got = _get(api, f"/api/runs/{payload['run']['id']}/export")["steps"][0]["formats"]
        trained = got["trained"]
        assert trained["recipes"] == ["fp8_tensorwise", None]
        assert _bits(trained["amax"]) == _bits(tagged(amax))
        assert _bits(trained["scale"]) == _bits(tagged(scale))

    def test_both_forms_store_the_same_bytes_as_sent(
        self, sessions: sessionmaker[Session]
    ) -> None:
        """The packed block's bytes are the row's, a NaN's payload included; the JSON arrays
        give the same row (their "nan" is the quiet NaN without payload)."""
        values, operands = _special([0, 1], RECIPES)
        packed = {"recipes": RECIPES, "layers": [0, 1], "values": f64le(values),
                  "operands": f64le(operands)}
        plain = {**packed, "values": tagged(values), "operands": tagged(operands)}
        for block in (packed, plain):
            ingest_payload(sessions, _batch(7, block))
        with sessions() as session:
            rows = session.execute(select(StepFormats.recipes, StepFormats.layers,
                                          StepFormats.data).order_by(StepFormats.step_id)).all()
        sent = struct.pack(f"<{len(values) + len(operands)}d", *values, *operands)
        assert [(recipes, layers) for recipes, layers, _ in rows] == [
            (",".join(RECIPES), "0,1")] * 2
        assert bytes(rows[0].data) == sent
        without_payload = sent.replace(struct.pack("<d", PAYLOAD_NAN), struct.pack("<d", math.nan))
        assert bytes(rows[1].data) == without_payload != sent

    def test_a_batch_sent_again_stores_them_once(self, sessions: sessionmaker[Session]) -> None:
        payload = _batch(7, formats([0, 1]), None, formats([1], seed=2.0))
        first = ingest_payload(sessions, payload)
        again = ingest_payload(sessions, payload)
        assert (first.accepted, again.accepted, again.duplicates) == (3, 0, 3)
        with sessions() as session:
            assert session.scalar(select(func.count()).select_from(StepFormats)) == 2

    @pytest.mark.parametrize("packed", [True, False], ids=["packed", "json"])
    def test_the_scale_exponents_are_read_back_as_sent(self, api: TestClient, packed: bool
                                                       ) -> None:
        """v8: a measured cut, one with no block holding a value (nan top, counts 0) and one
        not measured (all nan), as sent; a v7 step beside it has none."""
        encode = f64le if packed else tagged
        scales = scale_values([1, 0], ["mxfp8", "nvfp4"], seed=-3)
        scales[17:34] = [math.nan] + [0.0] * 16
        scales[34:51] = [math.nan] * 17
        block = {**formats([1, 0], ["mxfp8", "nvfp4"]), "scales": encode(scales)}
        payload = _batch(8, block, formats([0]))
        assert post_batch(api, payload)["accepted"] == 2
        steps = _get(api, f"/api/runs/{payload['run']['id']}/export")["steps"]
        assert _bits(steps[0]["formats"]["scales"]) == _bits(tagged(scales))
        assert "scales" not in steps[1]["formats"]

    def test_a_v7_batch_without_them_is_accepted(self, api: TestClient) -> None:
        payload = _batch(7, None, None)
        assert post_batch(api, payload)["accepted"] == 2
        steps = _get(api, f"/api/runs/{payload['run']['id']}/export")["steps"]
        assert ["formats" in step for step in steps] == [False, False]


def _valid() -> dict[str, Any]:
    return formats([0], ["fp8_tensorwise", "mxfp8"])


def _without_last(name: str, count: int) -> dict[str, Any]:
    """A valid block whose `name` array lacks its last `count` values."""
    block = _valid()
    values, operands = format_values(block["layers"], block["recipes"])
    block[name] = f64le((values if name == "values" else operands)[:-count])
    return block


REFUSED: list[tuple[dict[str, Any], str]] = [
    (_without_last("values", 1), "records[0].formats.values has 29 entries, expected 30: "
                                 "1 layers x 3 operands x 2 recipes x 5 statistics"),
    (_without_last("operands", 2), "records[0].formats.operands has 10 entries, expected 12: "
                                   "1 layers x 3 operands x 4 statistics"),
    ({**_valid(), "layers": [0, 1]}, "records[0].formats.values has 30 entries, expected 60: "
                                     "2 layers x 3 operands x 2 recipes x 5 statistics"),
    ({**_valid(), "values": {"f64le": "AAAA*AAA"}},
     "records[0].formats.values: f64le is not valid base64"),
    ({**_valid(), "operands": {"f64le": "AAAAAAAAAAAAAAAA"}},
     "records[0].formats.operands: f64le holds 12 bytes, not a whole number of float64s"),
    ({**_valid(), "values": {"f64le": 3}}, "records[0].formats.values: f64le must be a base64 "
                                           "string"),
    ({**_valid(), "values": {**_valid()["values"], "f32le": ""}},
     "records[0].formats.values: a packed block has the one key 'f64le', got ['f32le', "
     "'f64le']"),
    ({**_valid(), "values": {"F64LE": ""}}, 'records[0].formats.values: expected {"f64le": '
                                            '"<base64>"} or an array of numbers'),
    ({**_valid(), "values": "nan"}, 'records[0].formats.values: expected {"f64le": '
                                    '"<base64>"} or an array of numbers'),
    ({**_valid(), "operands": [0.5, None] + [0.0] * 10},
     'records[0].formats.operands: entry 1 is null: a value not measured is "nan"'),
    ({**_valid(), "operands": [0.5, "NaN"] + [0.0] * 10},
     'records[0].formats.operands: entry 1: expected a number or one of "nan", "inf", "-inf", '
     "got the string 'NaN'"),
    ({**_valid(), "operands": [True] + [0.0] * 11},
     "records[0].formats.operands: entry 0: expected a number, got a boolean"),
    ({**_valid(), "operands": [10**400] + [0.0] * 11},
     "records[0].formats.operands: entry 0: int too large to convert to float"),
    ({**_valid(), "recipes": ["mxfp8", "mxfp8"]},
     "records[0].formats.recipes[1] 'mxfp8' appears more than once"),
    ({**formats([0, 0])}, "records[0].formats.layers[1] 0 appears more than once"),
    ({**_valid(), "recipes": ["MXFP8", "mxfp8"]},
     "records[0].formats.recipes[0]: String should match pattern '^[a-z][a-z0-9_]{0,31}$'"),
    ({**_valid(), "recipes": ["fp8," + "a", "mxfp8"]},
     "records[0].formats.recipes[0]: String should match pattern '^[a-z][a-z0-9_]{0,31}$'"),
    ({**_valid(), "recipes": ["a" * 33, "mxfp8"]},
     "records[0].formats.recipes[0]: String should match pattern '^[a-z][a-z0-9_]{0,31}$'"),
    ({**_valid(), "recipes": []},
     "records[0].formats.recipes: List should have at least 1 item after validation, not 0"),
    ({**_valid(), "recipes": [f"r{i}" for i in range(17)]},
     "records[0].formats.recipes: List should have at most 16 items after validation, not 17"),
    ({**_valid(), "layers": []},
     "records[0].formats.layers: List should have at least 1 item after validation, not 0"),
    ({**_valid(), "layers": [-1]},
     "records[0].formats.layers[0]: Input should be greater than or equal to 0"),
    ({key: value for key, value in _valid().items() if key != "operands"},
     "records[0].formats.operands: field required"),
    ({**_valid(), "extra": 1}, "records[0].formats.extra: unknown field"),
    ({**_valid(), "trained": {"recipes": ["fp8_tensorwise", None], "amax": [0.0] * 3,
                              "scale": [1.0] * 3}},
     "records[0].formats.trained.recipes has 2 entries, expected 1: one per layer"),
    ({**_valid(), "trained": {"recipes": ["fp8_tensorwise"], "amax": [0.0] * 3,
                              "scale": [1.0] * 2}},
     "records[0].formats.trained.scale has 2 entries, expected 3: 1 layers x 3 operands"),
    ({**_valid(), "trained": {"recipes": ["FP8"], "amax": [0.0] * 3, "scale": [1.0] * 3}},
     "records[0].formats.trained.recipes[0]: String should match pattern "
     "'^[a-z][a-z0-9_]{0,31}$'"),
]


def _scales(at: int, value: float) -> dict[str, Any]:
    """A valid v8 block (one layer, two recipes) whose scales hold `value` at `at`."""
    block = _valid()
    scales = scale_values(block["layers"], block["recipes"])
    scales[at] = value
    return {**block, "scales": tagged(scales)}


WHOLE = ("each 17 values are a whole exponent from -1074 to 1023 (nan: no block held a value, "
         "then counts of 0) and 16 whole counts from 0 to 2^53, or all nan (not measured)")
SCALES_REFUSED: list[tuple[dict[str, Any], str]] = [
    ({**_valid(), "scales": [0.0] * 101}, "records[0].formats.scales has 101 entries, expected "
                                          "102: 1 layers x 3 operands x 2 recipes x 17 values"),
    (_scales(1, 1.5), f"records[0].formats.scales[1] is 1.5: {WHOLE}"),
    (_scales(2, -1.0), f"records[0].formats.scales[2] is -1.0: {WHOLE}"),
    (_scales(20, math.inf), f"records[0].formats.scales[20] is inf: {WHOLE}"),
    (_scales(21, math.nan), f"records[0].formats.scales[21] is nan: {WHOLE}"),
    (_scales(17, 2.5), f"records[0].formats.scales[17] is 2.5: {WHOLE}"),
    (_scales(17, -math.inf), f"records[0].formats.scales[17] is -inf: {WHOLE}"),
    (_scales(17, 1024.0), f"records[0].formats.scales[17] is 1024.0: {WHOLE}"),
    (_scales(18, 2.0**53 + 2), f"records[0].formats.scales[18] is 9007199254740994.0: {WHOLE}"),
    (_scales(34, math.nan), f"records[0].formats.scales[34] is nan: {WHOLE}"),  # counts 1, 1
]


class TestRefused:
    def test_a_v6_batch_carrying_them_is_422_naming_them(self, api: TestClient) -> None:
        payload = _batch(6, None, formats([0]))
        assert post_batch(api, payload, status=422) == {
            "detail": "records[1].formats: unknown field in schema_version 6"}
        assert api.get(f"/api/runs/{payload['run']['id']}").status_code == 404

    def test_a_v7_batch_carrying_scales_is_422_naming_them(self, api: TestClient) -> None:
        payload = _batch(7, formats([0], scales=True))
        assert post_batch(api, payload, status=422) == {
            "detail": "records[0].formats.scales: unknown field in schema_version 7"}
        assert api.get(f"/api/runs/{payload['run']['id']}").status_code == 404

    @pytest.mark.parametrize(("block", "detail"), SCALES_REFUSED,
                             ids=[f"scales-{i}" for i in range(len(SCALES_REFUSED))])
    def test_malformed_scales_are_422_naming_the_entry(
        self, api: TestClient, block: dict[str, Any], detail: str
    ) -> None:
        payload = _batch(8, block)
        assert post_batch(api, payload, status=422) == {"detail": detail}
        assert api.get(f"/api/runs/{payload['run']['id']}").status_code == 404

    @pytest.mark.parametrize(("block", "detail"), REFUSED,
                             ids=[f"refused-{i}" for i in range(len(REFUSED))])
    def test_a_malformed_block_is_422_naming_its_field(
        self, api: TestClient, block: dict[str, Any], detail: str
    ) -> None:
        payload = _batch(7, block)
        assert post_batch(api, payload, status=422) == {"detail": detail}
        assert api.get(f"/api/runs/{payload['run']['id']}").status_code == 404

    def test_a_layer_past_the_table_is_422(self, api: TestClient) -> None:
        payload = _batch(7, None, formats([1, 2]))
        assert post_batch(api, payload, status=422) == {
            "detail": "records[1].formats.layers[1] is 2, but the run's layer table has 2 "
                      "layers"}
        assert api.get(f"/api/runs/{payload['run']['id']}").status_code == 404

    def test_without_a_layer_table_is_409(self, api: TestClient) -> None:
        payload = _batch(7, formats([0]), with_layers=False, layers=None)
        run_id = payload["run"]["id"]
        assert post_batch(api, payload, status=409) == {
            "detail": f"records[0] carries format what-ifs, but run '{run_id}' has no layer "
                      "table yet and this batch sends none"}
