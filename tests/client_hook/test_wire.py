from __future__ import annotations

import json
import math

import pytest

from ampscope import wire

LAYER_KEYS = ["amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac",
              "nan_count", "inf_count", "l2"]
RECORD_KEYS = ["seq", "step", "wall_time", "loss", "scale_before", "scale_after", "growth_tracker",
               "found_inf", "skipped", "grad_norm", "lr", "duration", "layers",
               "captured", "nonfinite", "misuse", "activations", "histogram", "recheck",
               "swallowed", "ranks", "optimizers"]


def record(**layers_override: list[float]) -> dict[str, object]:
    layers = {name: [0.5, math.nan] for name in LAYER_KEYS}
    layers.update(nan_count=[0.0, 1.0], inf_count=[0.0, 0.0])
    layers.update(layers_override)
    return wire.step_record(
        seq=3, step=7, wall_time=1.5, loss=math.inf, scale_before=65536.0, scale_after=32768.0,
        growth_tracker=0, found_inf=True, skipped=True, grad_norm=math.nan, lr=1e-3,
        duration=None, layers=layers,
    )


class TestFloats:
    @pytest.mark.parametrize(("value", "encoded"), [
        (1.5, 1.5), (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (None, None)])
    def test_round_trip(self, value: float | None, encoded: object) -> None:
        assert wire.encode_float(value) == encoded or (value is None and encoded is None)
        back = wire.decode_float(wire.encode_float(value))
        assert back == value or (value is not None and math.isnan(value) and math.isnan(back or 0))

    def test_unknown_tag_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"not a float tag: 'NaN' \(expected 'nan', 'inf'"):
            wire.decode_float("NaN")


class TestRecord:
    def test_field_names_are_the_contract(self) -> None:
        rec = record()
        assert list(rec) == RECORD_KEYS
        layers = rec["layers"]
        assert isinstance(layers, dict) and list(layers) == LAYER_KEYS

    def test_encoding_of_each_stat(self) -> None:
        rec = record(nan_count=[2.0, 0.0], inf_count=[0.0, 1.0], zero_frac=[0.25, 1.0])
        layers = rec["layers"]
        assert isinstance(layers, dict)
        assert layers["amax"] == [0.5, None]  # defined over finite elements: null when none
        assert layers["amin_nz"] == [0.5, None] and layers["l2"] == [0.5, None]
        assert layers["nan_count"] == [2, 0] and isinstance(layers["nan_count"][0], int)
        assert layers["zero_frac"] == [0.25, 1.0]
        assert (rec["loss"], rec["grad_norm"], rec["duration"]) == ("inf", "nan", None)

    @pytest.mark.parametrize("row", [
        [0.5, 1e-300, 0.0, -0.0, 3.0],  # all finite: the one-call conversion
        [1e308, 1e308, -1e308],  # finite, but the sum overflows: value by value
        [0.5, math.nan, 2.0],
        [math.inf, 1.0],
        [-math.inf, math.inf],
        [],
    ])
    def test_each_row_as_value_by_value(self, row: list[float]) -> None:
        """The fast path for finite rows gives what one call per value gives, to the bit."""
        stats = {name: list(row) for name in LAYER_KEYS}
        stats.update(nan_count=[float(i) for i in range(len(row))], inf_count=[0.0] * len(row))
        encoded = wire.encode_stats(stats)
        for name in ("amax", "amin_nz", "l2"):
            assert encoded[name] == [wire.finite_or_none(float(v)) for v in row]
        for name in ("zero_frac", "subnormal_frac", "underflow_frac"):
            want = [wire.encode_float(v) for v in row]
            assert [repr(v) for v in encoded[name]] == [repr(v) for v in want]
        assert encoded["nan_count"] == list(range(len(row)))
        assert all(type(v) is int for v in encoded["nan_count"])
        assert json.dumps(encoded, allow_nan=False)  # nothing bare slipped through

    def test_scalar_only_record(self) -> None:
        rec = wire.step_record(seq=0, step=0, wall_time=0.0, loss=None, scale_before=1.0,
                               scale_after=1.0, growth_tracker=None, found_inf=False,
                               skipped=False, grad_norm=None, lr=None, duration=0.1, layers=None)
        assert rec["layers"] is None and rec["loss"] is None and rec["lr"] is None
        assert list(rec) == RECORD_KEYS
        assert [rec[k] for k in RECORD_KEYS[-9:]] == [None] * 9


class TestV4Fields:
    def test_ranks_and_optimizers_are_passed_through(self) -> None:
        rec = wire.step_record(
            seq=0, step=0, wall_time=0.0, loss=1.0, scale_before=2.0, scale_after=1.0,
            growth_tracker=0, found_inf=True, skipped=True, grad_norm=None, lr=0.1,
            duration=None, layers=None,
            ranks={"loss": [1.0, "nan", None], "nonfinite": [0, 3, None]},
            optimizers=[{"skipped": False, "lr": [0.1, 0.2]}, {"skipped": True, "lr": [None]}])
        assert rec["ranks"] == {"loss": [1.0, "nan", None], "nonfinite": [0, 3, None]}
        assert rec["optimizers"] == [{"skipped": False, "lr": [0.1, 0.2]},
                                     {"skipped": True, "lr": [None]}]
        assert json.loads(wire.dumps({"r": rec}))["r"] == rec


class TestV2Fields:
    def test_v2_fields_are_encoded(self) -> None:
        acts = {name: [0.5, math.nan] for name in LAYER_KEYS}
        acts.update(nan_count=[1.0, 0.0], inf_count=[0.0, 2.0])
        hist = {"min_exp": -40, "max_exp": 20, "counts": [[1] * 65]}
        rec = wire.step_record(
            seq=0, step=0, wall_time=0.0, loss=1.0, scale_before=2.0, scale_after=1.0,
            growth_tracker=0, found_inf=True, skipped=True, grad_norm=math.inf, lr=None,
            duration=None, layers=None, captured="before_unscale",
            nonfinite=[{"layer": 1, "kind": "inf"}, {"layer": 0, "kind": "nan"}],
            misuse=[{"kind": "unscale_twice", "detail": "x"}], activations=acts, histogram=hist)
        assert rec["captured"] == "before_unscale"
        assert rec["nonfinite"] == [{"layer": 1, "kind": "inf"}, {"layer": 0, "kind": "nan"}]
        assert rec["misuse"] == [{"kind": "unscale_twice", "detail": "x"}]
        acts_out = rec["activations"]
        assert isinstance(acts_out, dict) and list(acts_out) == LAYER_KEYS
        assert acts_out["amax"] == [0.5, None] and acts_out["zero_frac"] == [0.5, "nan"]
        assert acts_out["nan_count"] == [1, 0] and acts_out["inf_count"] == [0, 2]
        assert rec["histogram"] == hist

    def test_unknown_captured_is_refused(self) -> None:
        with pytest.raises(ValueError, match="captured must be one of"):
            wire.step_record(
                seq=0, step=0, wall_time=0.0, loss=None, scale_before=1.0, scale_after=1.0,
                growth_tracker=None, found_inf=False, skipped=False, grad_norm=None, lr=None,
                duration=None, layers=None, captured="sometime")

    def test_payload_carries_modules_and_client(self) -> None:
        client = {"produced": 3, "acknowledged": 1, "spooled": 1, "dropped": 1, "replayed": 0}
        payload = wire.build_payload(
            run={"id": "r"}, attempt={"id": "a"}, layers=None, records=[], final=False,
            modules=[{"index": 0, "name": "fc", "module_type": "Linear"}], client=client)
        assert payload["modules"] == [{"index": 0, "name": "fc", "module_type": "Linear"}]
        assert payload["client"] == client


class TestPayload:
    def test_top_level_shape_and_strict_json(self) -> None:
        payload = wire.build_payload(
            run={"id": "r", "config": wire.jsonable({"eps": math.inf, "betas": (0.9, 0.99)})},
            attempt={"id": "a", "pid": 1, "started_at": 0.0},
            layers=[{"index": 0, "name": "w"}], records=[record()], final=True)
        assert list(payload) == ["schema_version", "run", "attempt", "layers", "modules",
                                 "records", "client", "final"]
        assert payload["schema_version"] == wire.SCHEMA_VERSION == 8
        assert payload["modules"] is None and payload["client"] is None
        text = wire.dumps(payload).decode()
        assert "NaN" not in text and "Infinity" not in text
        assert json.loads(text)["run"]["config"] == {"eps": "inf", "betas": [0.9, 0.99]}

    def test_dumps_refuses_bare_nan(self) -> None:
        with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
            wire.dumps({"x": math.nan})

    def test_jsonable_stringifies_unknown_objects(self) -> None:
        assert wire.jsonable({1: object.__new__(type("Opt", (), {"__str__": lambda s: "opt"}))}) \
            == {"1": "opt"}
