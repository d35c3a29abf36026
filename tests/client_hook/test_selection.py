from __future__ import annotations

import pytest

from ampscope.selection import Cadence, selected
from tests.client_hook.reference import due_layers

NAMES = ["enc.0.weight", "enc.0.bias", "dec.weight", "dec.bias", "head.weight"]


class TestSelected:
    def test_include_and_exclude_globs(self) -> None:
        assert [n for n in NAMES if selected(n, None, None)] == NAMES
        assert [n for n in NAMES if selected(n, ["enc.*", "head.*"], ["*.bias"])] == [
            "enc.0.weight", "head.weight"]
        assert [n for n in NAMES if selected(n, None, ["dec.*"])] == [
            "enc.0.weight", "enc.0.bias", "head.weight"]


class TestCadence:
    def test_int(self) -> None:
        c = Cadence(5, NAMES)
        assert [s for s in range(12) if c.due(s)] == [0, 5, 10]
        assert not any(Cadence(0, NAMES).due(s) for s in range(12))

    def test_mapping_first_match_wins_unmatched_never(self) -> None:
        c = Cadence({"enc.*": 2, "*.weight": 3}, NAMES)
        assert c.intervals == [2, 2, 3, 0, 3]
        assert [s for s in range(8) if c.due(s)] == [0, 2, 3, 4, 6]
        assert due_layers(c, 3) == [2, 4] and due_layers(c, 4) == [0, 1]

    def test_refuses_negative(self) -> None:
        with pytest.raises(ValueError, match="layer_every must be >= 0, not -1"):
            Cadence(-1, NAMES)
        with pytest.raises(ValueError, match=r"intervals must be ints >= 0, got \{'x': -2\}"):
            Cadence({"x": -2}, NAMES)
