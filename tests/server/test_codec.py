from __future__ import annotations

import math

import pytest

from ampscope_server import codec
from ampscope_server.codec import FloatClass


class TestEncode:
    @pytest.mark.parametrize(("value", "expected"), [
        (1.5, 1.5), (0.0, 0.0), (-2.0, -2.0), (None, None), (5e-324, 5e-324),
        (1.7976931348623157e308, 1.7976931348623157e308),
        (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"),
    ])
    def test_values(self, value: float | None, expected: object) -> None:
        assert codec.encode(value) == expected

    def test_negative_zero_stays_a_number(self) -> None:
        encoded = codec.encode(-0.0)
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
        assert codec.encode_rows(rows) == [[codec.encode(v) for v in row] for row in rows]
        assert codec.encode_rows(rows)[2:4] == [["nan", 1.0], [None, "inf", "-inf"]]

    def test_a_finite_row_goes_out_as_it_is(self) -> None:
        row: list[float | None] = [0.5, None, 1e-300]
        assert codec.encode_rows([row])[0] is row


class TestDecodeWire:
    @pytest.mark.parametrize(("value", "expected"), [
        (1.5, 1.5), (3, 3.0), (None, None), ("inf", math.inf), ("-inf", -math.inf),
    ])
    def test_values(self, value: object, expected: float | None) -> None:
        assert codec.decode_wire(value) == expected

    def test_nan_tag(self) -> None:
        decoded = codec.decode_wire("nan")
        assert decoded is not None and math.isnan(decoded)

    def test_int_becomes_float(self) -> None:
        assert isinstance(codec.decode_wire(7), float)

    @pytest.mark.parametrize(("value", "message"), [
        (math.nan, 'non-finite numbers must be sent as "nan", "inf" or "-inf"'),
        (math.inf, 'non-finite numbers must be sent as "nan", "inf" or "-inf"'),
        ("NaN", "expected a number or one of \"nan\", \"inf\", \"-inf\", got the string 'NaN'"),
        ("1.5", "expected a number or one of \"nan\", \"inf\", \"-inf\", got the string '1.5'"),
        (True, "expected a number, got a boolean"),
        ([1.0], "expected a number, got list"),
    ])
    def test_rejects(self, value: object, message: str) -> None:
        with pytest.raises(codec.CodecError) as info:
            codec.decode_wire(value)
        assert str(info.value) == message


class TestStorage:
    @pytest.mark.parametrize(("value", "stored"), [
        (1.25, (1.25, FloatClass.FINITE_OR_NULL)),
        (None, (None, FloatClass.FINITE_OR_NULL)),
        (math.inf, (None, FloatClass.POS_INF)),
        (-math.inf, (None, FloatClass.NEG_INF)),
        (0.0, (0.0, FloatClass.FINITE_OR_NULL)),
    ])
    def test_round_trip(self, value: float | None, stored: tuple[float | None, int]) -> None:
        assert codec.to_storage(value) == stored
        assert codec.from_storage(*stored) == value

    def test_negative_zero_keeps_its_sign_whatever_the_column_gives_back(self) -> None:
        value, cls = codec.to_storage(-0.0)
        assert value is not None and math.copysign(1.0, value) == -1.0
        assert cls == FloatClass.NEG_ZERO
        for stored in (-0.0, 0.0, 0):  # SQLite's REAL affinity hands back an integer 0
            restored = codec.from_storage(stored, FloatClass.NEG_ZERO)
            assert restored == 0.0 and math.copysign(1.0, restored) == -1.0

    def test_nan_round_trip(self) -> None:
        assert codec.to_storage(math.nan) == (None, FloatClass.NAN)
        restored = codec.from_storage(None, FloatClass.NAN)
        assert restored is not None and math.isnan(restored)
