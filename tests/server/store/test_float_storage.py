from __future__ import annotations

import math

import pytest

from ampscope_server.store import float_storage
from ampscope_server.store.float_storage import FloatClass


class TestStorage:
    @pytest.mark.parametrize(("value", "stored"), [
        (1.25, (1.25, FloatClass.FINITE_OR_NULL)),
        (None, (None, FloatClass.FINITE_OR_NULL)),
        (math.inf, (None, FloatClass.POS_INF)),
        (-math.inf, (None, FloatClass.NEG_INF)),
        (0.0, (0.0, FloatClass.FINITE_OR_NULL)),
    ])
    def test_round_trip(self, value: float | None, stored: tuple[float | None, int]) -> None:
        assert float_storage.to_storage(value) == stored
        assert float_storage.from_storage(*stored) == value

    def test_negative_zero_keeps_its_sign_whatever_the_column_gives_back(self) -> None:
        value, cls = float_storage.to_storage(-0.0)
        assert value is not None and math.copysign(1.0, value) == -1.0
        assert cls == FloatClass.NEG_ZERO
        for stored in (-0.0, 0.0, 0):  # SQLite's REAL affinity hands back an integer 0
            restored = float_storage.from_storage(stored, FloatClass.NEG_ZERO)
            assert restored == 0.0 and math.copysign(1.0, restored) == -1.0

    def test_nan_round_trip(self) -> None:
        assert float_storage.to_storage(math.nan) == (None, FloatClass.NAN)
        restored = float_storage.from_storage(None, FloatClass.NAN)
        assert restored is not None and math.isnan(restored)
