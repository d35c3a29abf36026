from __future__ import annotations

import math

import pytest

from ampscope_server.runs import json_floats


class TestEncode:
    @pytest.mark.parametrize(("value", "expected"), [
        (1.5, 1.5), (0.0, 0.0), (-2.0, -2.0), (None, None), (5e-324, 5e-324),
        (1.7976931348623157e308, 1.7976931348623157e308),
        (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"),
    ])
    def test_values(self, value: float | None, expected: object) -> None:
        assert json_floats.encode(value) == expected

    def test_negative_zero_stays_a_number(self) -> None:
        encoded = json_floats.encode(-0.0)
        assert isinstance(encoded, float)
        assert math.copysign(1.0, encoded) == -1.0


class TestEncodeRows:
    def test_every_row_as_encode_gives_it(self) -> None:
        big = 1.7976931348623157e308
        rows: list[list[float | None]] = [
            [1.5, 0.0, -0.0], [None, 2.0, None], [math.nan, 1.0], [None, math.inf, -math.inf],
            [big, big],  # finite values whose sum overflows: encoded one by one, unchanged
            [], [None],
        ]
        encoded = [[json_floats.encode(v) for v in row] for row in rows]
        assert json_floats.encode_rows(rows) == encoded
        assert json_floats.encode_rows(rows)[2:4] == [["nan", 1.0], [None, "inf", "-inf"]]

    def test_a_finite_row_goes_out_as_it_is(self) -> None:
        row: list[float | None] = [0.5, None, 1e-300]
        assert json_floats.encode_rows([row])[0] is row


class TestDecodeWire:
    @pytest.mark.parametrize(("value", "expected"), [
        (1.5, 1.5), (3, 3.0), (None, None), ("inf", math.inf), ("-inf", -math.inf),
    ])
    def test_values(self, value: object, expected: float | None) -> None:
        assert json_floats.decode_wire(value) == expected

    def test_nan_tag(self) -> None:
        decoded = json_floats.decode_wire("nan")
        assert decoded is not None and math.isnan(decoded)

    def test_int_becomes_float(self) -> None:
        assert isinstance(json_floats.decode_wire(7), float)

    @pytest.mark.parametrize(("value", "message"), [
        (math.nan, 'non-finite numbers must be sent as "nan", "inf" or "-inf"'),
        (math.inf, 'non-finite numbers must be sent as "nan", "inf" or "-inf"'),
        ("NaN", "expected a number or one of \"nan\", \"inf\", \"-inf\", got the string 'NaN'"),
        ("1.5", "expected a number or one of \"nan\", \"inf\", \"-inf\", got the string '1.5'"),
        (True, "expected a number, got a boolean"),
        ([1.0], "expected a number, got list"),
    ])
    def test_rejects(self, value: object, message: str) -> None:
        with pytest.raises(json_floats.CodecError) as info:
            json_floats.decode_wire(value)
        assert str(info.value) == message
