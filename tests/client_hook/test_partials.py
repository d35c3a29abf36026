from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from ampscope import partials
from ampscope.formats import FORMATS
from ampscope.partials import (
    COLUMNS,
    INF_BITS,
    NUM_COLUMNS,
    SUMSQ,
    absent,
    finalize,
    finalize_host,
    float32_bits,
    merge,
    tensor_partials,
    threshold_bits,
)
from tests.client_hook.reference import FP16, edge_tensor, partials_reference

# float32 values, as every GradScaler scale is (``threshold_bits`` is exact up to 29 bits).
SCALES = [float(torch.tensor(x, dtype=torch.float32))
          for x in (1.0, 3.0, 0.75, 2.0**-3, 2.0**10, 2.0**16, 2.0**24, 65504.0, 1e-30, 3e38)]


def bits_of(x: float) -> int:
    return int(torch.tensor(x, dtype=torch.float32).view(torch.int32))


def float_of(bits: int) -> float:
    return float(torch.tensor(bits, dtype=torch.int32).view(torch.float32))


def thresholds(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


class TestThresholdBits:
    @pytest.mark.parametrize("mult", SCALES)
    @pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8_e4m3fn"])
    def test_decides_the_exact_product_at_the_boundary(self, mult: float, fmt: str) -> None:
        f = FORMATS[fmt]
        thr = [f.underflow_threshold, f.min_normal]
        got = threshold_bits(thresholds(*thr), torch.tensor(mult, dtype=torch.float64)).tolist()
        for t, threshold in zip(got, thr, strict=True):
            # Every float32 around the boundary, and the extremes, against exact rationals.
            for b in [*range(max(1, t - 3), min(INF_BITS, t + 4)), 1, INF_BITS - 1]:
                exact = Fraction(float_of(b)) * Fraction(mult) < Fraction(threshold)
                assert (b < t) == exact, (b, t)

    def test_the_smallest_subnormal_and_the_largest_finite(self) -> None:
        got = threshold_bits(thresholds(2.0**-25, 2.0**-14),
                             torch.tensor(2.0**-149 * 2**-10, dtype=torch.float64)).tolist()
        # 2^-25 / 2^-159 overflows float32: every finite element is below the threshold.
        assert got == [INF_BITS, INF_BITS]

    @pytest.mark.parametrize("mult", [0.0, math.inf, -math.inf, math.nan, -2.0])
    def test_degenerate_scales_count_nothing_but_zeros(self, mult: float) -> None:
        got = threshold_bits(thresholds(2.0**-25), torch.tensor(mult, dtype=torch.float64))
        assert got.tolist() == [1]

    def test_float32_bits(self) -> None:
        assert float32_bits(1.0) == 0x3F800000
        assert float32_bits(FP16.min_normal) == bits_of(2.0**-14)
        with pytest.raises(ValueError, match=r"0\.1 is not a positive float32"):
            float32_bits(0.1)
        with pytest.raises(ValueError, match=r"-1\.0 is not a positive float32"):
            float32_bits(-1.0)


def eager_partials(raw: torch.Tensor, mult: float) -> list[float]:
    bits = threshold_bits(thresholds(FP16.underflow_threshold, FP16.min_normal),
                          torch.tensor(mult, dtype=torch.float64))
    return tensor_partials(raw, bits[0], bits[1]).tolist()


def assert_partials(got: list[float], want: list[float]) -> None:
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if k == SUMSQ:  # float64 sums in another order
            assert g == pytest.approx(w, rel=1e-12, abs=0.0), COLUMNS[k]
        else:
            assert g == w, COLUMNS[k]


class TestTensorPartials:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
    @pytest.mark.parametrize("scale", [1.0, 3.0, 2.0**10, 2.0**16])
    @pytest.mark.parametrize("scaled", [True, False])
    def test_matches_numpy(self, dtype: torch.dtype, scale: float, scaled: bool) -> None:
        raw = edge_tensor(scale, dtype, scaled, 2999)
        raw[5], raw[6], raw[7] = math.nan, math.inf, -math.inf
        mult = 1.0 if scaled else scale
        want = partials_reference(raw, mult, FP16)
        if dtype != torch.float16:  # fp16 itself flushes most of these classes' values
            assert want[4] > want[3] > want[0]  # the data holds each class
        assert_partials(eager_partials(raw, mult), want)

    def test_one_element_and_all_non_finite(self) -> None:
        assert eager_partials(torch.tensor([-2.0**-30]), 1.0) == [
            0, 0, 0, 1, 1, 2.0**-60, 2.0**-30, 2.0**-30]
        assert eager_partials(torch.tensor([math.nan, -math.inf]), 1.0) == [
            0, 1, 1, 0, 0, 0.0, 0.0, math.inf]
        assert eager_partials(torch.zeros(3), 4.0) == [3, 0, 0, 3, 3, 0.0, 0.0, math.inf]

    def test_huge_values_square_in_float64(self) -> None:
        x = torch.full((4,), 3e38)
        got = eager_partials(x, 1.0)
        assert got[SUMSQ] == pytest.approx(4 * x[0].item() ** 2, rel=1e-12)

    def test_rejects_float64(self) -> None:
        with pytest.raises(TypeError, match=r"not torch\.float64"):
            eager_partials(torch.ones(2, dtype=torch.float64), 1.0)


class TestMerge:
    @pytest.mark.parametrize("cuts", [[1], [1500], [0, 7, 2998], [2999]])
    def test_merged_pieces_equal_the_whole(self, cuts: list[int]) -> None:
        raw = edge_tensor(2.0**10, torch.float32, False, 2999)
        raw[100], raw[2000] = math.nan, -math.inf
        edges = [0, *cuts, raw.numel()]
        pieces = [raw[a:b] for a, b in itertools.pairwise(edges)]
        rows = [eager_partials(p, 2.0**10) if p.numel() else absent(0, p.device).tolist()
                for p in pieces]
        got = merge(torch.tensor(rows, dtype=torch.float64)).tolist()
        assert_partials(got, eager_partials(raw, 2.0**10))

    def test_absent_is_the_identity(self) -> None:
        whole = torch.tensor(eager_partials(torch.tensor([1.0, 0.0, 2.0**-30]), 1.0),
                             dtype=torch.float64)
        empty = absent(0, torch.device("cpu"))
        assert merge(torch.stack([whole, empty])).tolist() == whole.tolist()
        assert absent(5, torch.device("cpu")).tolist() == [5, 0, 0, 5, 5, 0, 0, math.inf]


class TestFinalize:
    def test_true_units_fractions_and_the_global_norm(self) -> None:
        rows = torch.tensor([
            [1, 0, 0, 2, 3, 16.0, 4.0, 0.5],  # 4 elements, scaled by 2
            [2, 0, 0, 2, 2, 0.0, 0.0, math.inf],  # all zero
            [0, 1, 1, 0, 0, 9.0, 3.0, 3.0],  # NaN and inf among 3
        ], dtype=torch.float64)
        numel = torch.tensor([4.0, 2.0, 3.0], dtype=torch.float64)
        to_true = torch.tensor([0.5, 1.0, 1.0], dtype=torch.float64)
        out = finalize(rows, numel, to_true)
        assert math.isnan(out[0].item())  # a NaN anywhere
        stats = out[1:].view(NUM_COLUMNS, 3).tolist()
        assert stats[0] == [2.0, 0.0, 3.0]  # amax, true units
        assert stats[1][0] == 0.25 and math.isnan(stats[1][1])  # amin_nz
        assert stats[2] == [0.25, 1.0, 0.0]  # zero_frac
        assert stats[3] == [0.5, 0.0, 0.0]  # subnormal_frac
        assert stats[4] == [0.25, 0.0, 0.0]  # underflow_frac
        assert stats[5] == [0, 0, 1] and stats[6] == [0, 0, 1]
        assert stats[7] == [2.0, 0.0, 3.0]  # l2

    def test_no_finite_element_reads_null_amax(self) -> None:
        rows = torch.tensor([[0, 2, 0, 0, 0, 0.0, 0.0, math.inf]], dtype=torch.float64)
        out = finalize(rows, torch.tensor([2.0], dtype=torch.float64),
                       torch.ones(1, dtype=torch.float64))
        assert math.isnan(out[1].item()) and math.isnan(out[2].item())  # amax, amin_nz
        assert out[3:].tolist() == [0.0, 0.0, 0.0, 2.0, 0.0, 0.0]


@pytest.fixture(params=["numpy", "math.sqrt"])
def sqrt_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The host square root with numpy (where torch has it) and without (the hook's fallback)."""
    if request.param == "math.sqrt":
        monkeypatch.setattr(partials, "_np", None)
    else:
        assert partials._np is not None
    path: str = request.param
    return path


@pytest.mark.usefixtures("sqrt_path")
def test_the_host_square_root_is_correctly_rounded() -> None:
    """``_sqrt_`` equals ``math.sqrt`` bit for bit over every exponent (subnormals, zeros of
    both signs, inf, NaN), where ATen's CPU float64 ``sqrt`` is 1 ulp off now and then."""
    gen = torch.Generator().manual_seed(5)
    mantissas = torch.rand(100_000, generator=gen, dtype=torch.float64) + 1.0
    exponents = torch.randint(-1074, 1024, (100_000,), generator=gen)
    values = [*torch.ldexp(mantissas, exponents.to(torch.float64)).tolist(),
              0.0, -0.0, 5e-324, 2.0**-1022, 1.7976931348623157e308, math.inf, math.nan]
    row = torch.tensor(values, dtype=torch.float64)
    partials._sqrt_(row)
    assert [repr(x) for x in row.tolist()] == [repr(math.sqrt(x)) for x in values]


class TestFinalizeHost:
    ROWS = (
        (1, 0, 0, 2, 3, 16.0, 4.0, 0.5),  # 4 elements, scaled
        (2, 0, 0, 2, 2, 0.0, 0.0, math.inf),  # all zero
        (0, 1, 1, 0, 0, 9.0, 3.0, 3.0),  # NaN and inf among 3
        (0, 0, 2, 0, 0, 0.0, 0.0, math.inf),  # only infs: no finite element
        (0, 0, 0, 0, 0, 0.0, 0.0, math.inf),  # empty
        (3, 0, 0, 5, 7, 2.0**-40 + 3.0, 1.5, 2.0**-30),
    )
    NUMEL = (4.0, 2.0, 3.0, 2.0, 0.0, 11.0)

    @pytest.mark.parametrize("factor", [0.5, 1.0, 3.0, 1 / 3, 2.0**-24, math.inf, math.nan])
    @pytest.mark.parametrize("layers", [[0, 1, 5], [0, 1, 2, 3, 4, 5], [1, 3], [4], []])
    def test_it_is_finalize_bit_for_bit(self, factor: float, layers: list[int]) -> None:
        """The sender thread's host twin gives ``finalize``'s numbers exactly (repr), the
        global norm's NaN/inf precedence included."""
        rows = [self.ROWS[i] for i in layers]
        numel = [self.NUMEL[i] for i in layers]
        to_true = [factor if k % 2 == 0 else 1.0 for k in range(len(layers))]
        want = finalize(torch.tensor(rows, dtype=torch.float64).reshape(-1, NUM_COLUMNS),
                        torch.tensor(numel, dtype=torch.float64),
                        torch.tensor(to_true, dtype=torch.float64)).tolist()
        n = len(layers)
        for factors in (torch.tensor(to_true, dtype=torch.float64), factor):
            if isinstance(factors, float):  # one factor for every layer
                to_true = [factor] * n
                want = finalize(torch.tensor(rows, dtype=torch.float64).reshape(-1, NUM_COLUMNS),
                                torch.tensor(numel, dtype=torch.float64),
                                torch.tensor(to_true, dtype=torch.float64)).tolist()
            got = finalize_host(torch.tensor(rows, dtype=torch.float64).reshape(-1, NUM_COLUMNS),
                                torch.tensor(numel, dtype=torch.float64), factors)
            assert repr(got.norm) == repr(want[0])
            assert repr(got.stats.tolist()) == repr([want[1 + k * n : 1 + (k + 1) * n]
                                                     for k in range(NUM_COLUMNS)])

    @pytest.mark.usefixtures("sqrt_path")
    @pytest.mark.parametrize("factor", [1.0, 1 / 3, 2.0**-24, math.inf])
    def test_a_wide_table_is_the_layer_by_layer_definition(self, factor: float) -> None:
        """500 layers of every kind above, columns computed with ``map`` (no frame per
        layer): each value the definition's one float64 operation, as a layer loop gives it
        (``math.sqrt``: correctly rounded, as ``finalize``'s is on the device)."""
        gen = torch.Generator().manual_seed(3)
        kinds = torch.randint(0, len(self.ROWS), (500,), generator=gen).tolist()
        rows = [(*self.ROWS[i][:5], self.ROWS[i][5] * (1 + k), self.ROWS[i][6] * (1 + k / 7),
                 self.ROWS[i][7]) for k, i in enumerate(kinds)]
        numel = [self.NUMEL[i] for i in kinds]
        to_true = [factor if k % 3 else 1.0 for k in range(len(rows))]
        got = finalize_host(torch.tensor(rows, dtype=torch.float64),
                            torch.tensor(numel, dtype=torch.float64),
                            torch.tensor(to_true, dtype=torch.float64))
        want: list[list[float]] = [[] for _ in range(NUM_COLUMNS)]
        for r, size, t in zip(rows, numel, to_true, strict=True):
            denom = size if size >= 1.0 else 1.0
            want[0].append(r[6] * t if size - r[1] - r[2] > 0 else math.nan)
            want[1].append(math.nan if math.isinf(r[7]) else r[7] * t)
            want[2].append(r[0] / denom)
            want[3].append((r[4] - r[0]) / denom)
            want[4].append((r[3] - r[0]) / denom)
            want[5].append(float(r[1]))
            want[6].append(float(r[2]))
            want[7].append(math.sqrt(r[5]) * t)
        assert repr(got.stats.tolist()) == repr(want)
        assert got.sums[5:7] == [sum(want[5]), sum(want[6])]
        one = finalize_host(torch.tensor(rows, dtype=torch.float64),
                            torch.tensor(numel, dtype=torch.float64), factor)
        scaled = finalize_host(torch.tensor(rows, dtype=torch.float64),
                               torch.tensor(numel, dtype=torch.float64),
                               torch.full((500,), factor, dtype=torch.float64))
        assert repr(one.stats.tolist()) == repr(scaled.stats.tolist())
        assert repr(one.norm) == repr(scaled.norm)

    def test_it_refuses_a_table_of_the_wrong_size(self) -> None:
        with pytest.raises(ValueError, match=r"partials of shape \(1, 7\) and factors of "
                                             r"shape \(1,\) for 1 layers"):
            finalize_host(torch.zeros(1, 7, dtype=torch.float64),
                          torch.ones(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64))
