"""stat_packing: every value back bit for bit (NaN, ±inf, -0.0, None, int64 extremes)."""

from __future__ import annotations

import math
import random
import struct

import pytest

from ampscope_server.store import stat_packing


def _bits(value: object) -> object:
    """A float's IEEE-754 bits (so -0.0 and 0.0 differ and NaN equals NaN), anything else as is."""
    return struct.pack("<d", value) if isinstance(value, float) else value


@pytest.fixture(params=[False, True], ids=["together", "apart"])
def apart(request: pytest.FixtureRequest) -> bool:
    """Both layouts: every column in one zlib stream (version 1) or each apart (version 2)."""
    return bool(request.param)


class TestRoundTrip:
    def test_edges(self, apart: bool) -> None:
        floats = [0.0, -0.0, 1.0, math.nan, math.inf, -math.inf, None, 5e-324,
                  1.7976931348623157e308, -2.5e-310, 1 / 3]
        ints = [0, 1, -1, 2**63 - 1, -(2**63), None, 2**53 + 1, 7, 0, 3, 5]
        got = stat_packing.unpack(stat_packing.pack([floats, ints], "dq", apart=apart))
        assert [list(map(_bits, column)) for column in got] == [
            list(map(_bits, floats)), list(map(_bits, ints))]
        assert [type(v) for v in got[1]] == [int] * 5 + [type(None)] + [int] * 5

    def test_random_columns_of_many_lengths(self, apart: bool) -> None:
        rng = random.Random(5)
        for n in (0, 1, 7, 200, 1001):
            columns: list[list[float | int | None]] = [
                [rng.choice([rng.lognormvariate(0, 30), rng.random(), 0.0, None, math.nan])
                 for _ in range(n)],
                [rng.randrange(-(2**63), 2**63) for _ in range(n)],
                [rng.randrange(1000) / 1000 for _ in range(n)],
            ]
            got = stat_packing.unpack(stat_packing.pack(columns, "dqd", apart=apart))
            assert [list(map(_bits, c)) for c in got] == [list(map(_bits, c)) for c in columns]
            assert stat_packing.length(stat_packing.pack(columns, "dqd", apart=apart)) == n

    def test_chosen_columns_equal_the_whole_unpack(self, apart: bool) -> None:
        rng = random.Random(9)
        n = 300
        columns: list[list[float | int | None]] = [
            [rng.choice([rng.lognormvariate(0, 30), None, math.inf]) for _ in range(n)],
            [rng.randrange(-(2**63), 2**63) for _ in range(n)],
            [rng.choice([None, 0.5, -0.0, math.nan]) for _ in range(n)],
            [rng.randrange(1000) for _ in range(n)],
        ]
        blob = stat_packing.pack(columns, "dqdq", apart=apart)
        for indices in ([2], [3, 0], [1], [0, 1, 2, 3]):
            got = stat_packing.unpack_columns(blob, indices)
            assert list(got) == indices
            assert {i: list(map(_bits, c)) for i, c in got.items()} == {
                i: list(map(_bits, columns[i])) for i in indices}
        with pytest.raises(IndexError, match="column 4 of a packed array of 4"):
            stat_packing.unpack_columns(blob, [4])

    def test_chosen_positions_equal_those_of_the_whole_columns(self, apart: bool) -> None:
        rng = random.Random(11)
        n = 500
        columns: list[list[float | int | None]] = [
            [rng.choice([rng.lognormvariate(0, 30), None, -math.inf, -0.0]) for _ in range(n)],
            [rng.randrange(-(2**63), 2**63) for _ in range(n)],
        ]
        blob = stat_packing.pack(columns, "dq", apart=apart)
        for positions in ([0], [499, 3, 17], [n, 2, n + 5], list(range(n))):
            got = stat_packing.unpack_columns(blob, [1, 0], positions)
            assert {i: list(map(_bits, c)) for i, c in got.items()} == {
                i: [_bits(columns[i][p]) if p < n else None for p in positions] for i in (1, 0)}


    def test_ints_given_to_a_float_column_come_back_as_floats(self, apart: bool) -> None:
        got = stat_packing.unpack(stat_packing.pack([[0, 1]], "d", apart=apart))
        assert got == [[0.0, 1.0]]
        assert [type(v) for v in got[0]] == [float, float]

    def test_zeros_and_small_counts_take_a_fraction_of_8_bytes(self, apart: bool) -> None:
        blob = stat_packing.pack([[0.0] * 1000, [0] * 1000, [3] * 1000], "ddq", apart=apart)
        assert len(blob) < (150 if apart else 100)  # 24,000 bytes of values

    def test_both_layouts_hold_the_same_values(self) -> None:
        columns: list[list[float | int | None]] = [[1.5, None, math.nan], [1, 2, 3],
                                                   [-0.0, math.inf, 2.0]]
        together = stat_packing.pack(columns, "dqd")
        apart = stat_packing.pack(columns, "dqd", apart=True)
        assert (together[0], apart[0]) == (stat_packing.VERSION, stat_packing.APART)
        assert [list(map(_bits, c)) for c in stat_packing.unpack(together)] == [
            list(map(_bits, c)) for c in stat_packing.unpack(apart)]


class TestErrors:
    def test_unequal_columns(self) -> None:
        with pytest.raises(ValueError, match="columns differ in length: 1 and 2"):
            stat_packing.pack([[1.0, 2.0], [1.0]], "dd")

    def test_kinds_must_match_columns(self) -> None:
        with pytest.raises(ValueError, match="2 columns but 1 kinds"):
            stat_packing.pack([[1.0], [1.0]], "d")

    def test_other_version(self) -> None:
        blob = bytearray(stat_packing.pack([[1.0]], "d"))
        blob[0] = 9
        with pytest.raises(stat_packing.PackingError,
                           match="packed array version 9, expected 1 or 2"):
            stat_packing.unpack(bytes(blob))

    def test_too_short(self) -> None:
        with pytest.raises(stat_packing.PackingError, match="at least 6 bytes"):
            stat_packing.unpack(b"\x01")


COLUMNS: list[list[float | int | None]] = [
    [1.5, None, math.nan, -0.0], [1, 2, 3, -(2**63)], [math.inf, 2.0, None, 5e-324]]


class TestSegments:
    """A version 2 column from the blob's head and its segment alone, as a database cuts them."""

    def _cut(self, blob: bytes, index: int) -> tuple[bytes, bytes]:
        k = len(COLUMNS)
        head = blob[:stat_packing.apart_head_size(k)]
        sizes = [struct.unpack_from("<I", blob, stat_packing.apart_size_at(k, i))[0]
                 for i in range(k)]
        start = len(head) + sum(sizes[:index])
        return head, blob[start:start + sizes[index]]

    def test_every_column_and_positions_from_its_segment(self) -> None:
        blob = stat_packing.pack(COLUMNS, "dqd", apart=True)
        for index, column in enumerate(COLUMNS):
            head, segment = self._cut(blob, index)
            got = stat_packing.unpack_segment(head, index, segment)
            assert list(map(_bits, got)) == list(map(_bits, column))
            picked = stat_packing.unpack_segment(head, index, segment, [3, 1, 9])
            assert list(map(_bits, picked)) == [_bits(column[3]), _bits(column[1]), None]

    def test_a_segment_that_does_not_fit_its_head_is_refused(self) -> None:
        blob = stat_packing.pack(COLUMNS, "dqd", apart=True)
        head, segment = self._cut(blob, 1)
        with pytest.raises(stat_packing.PackingError, match="segment is 3 bytes, the head says"):
            stat_packing.unpack_segment(head, 1, segment[:3])
        with pytest.raises(stat_packing.PackingError, match="only version 2 has segments"):
            stat_packing.unpack_segment(stat_packing.pack(COLUMNS, "dqd"), 1, segment)
        with pytest.raises(IndexError, match="column 3 of a packed array of 3"):
            stat_packing.unpack_segment(head, 3, segment)
