"""Each recipe's quantisation against its reference: torch's float8 casts through torchao's
float8 scaling, torchao's DeepSeek blockwise quantisers, ``MXTensor.to_mx`` (RCEIL) and
``NVFP4Tensor.to_nvfp4`` with a per-tensor scale. torchao is a test dependency only."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable

import pytest
import torch

from ampscope import recipes
from ampscope.recipes import (
    E2M1,
    E4M3,
    E5M2,
    MOMENTS,
    OPERANDS,
    RECIPES,
    STATS,
    Element,
    Operand,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torchao's CUDA extensions and pytree notices, on import
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_utils import amax_to_scale, tensor_to_scale
    from torchao.prototype.mx_formats.mx_tensor import MXTensor, ScaleCalculationMode
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

Reference = Callable[[torch.Tensor, Operand], torch.Tensor]


WHOLE = 1 << 40
"""A budget no operand here reaches: every element measured."""


def _stats(x: torch.Tensor, chosen: tuple[recipes.Recipe, ...], operand: Operand,
           budget: int = WHOLE) -> torch.Tensor:
    """``measure``'s recipe statistics as ``(recipes, STATS)``."""
    stats = recipes.measure([recipes.sample(x, operand, budget=budget)], chosen, operand)[0]
    return stats[: len(chosen) * len(STATS)].view(-1, len(STATS))


def _fp32_scaled(granularity: ScalingGranularity, pow2: bool) -> Reference:
    def dequantised(x: torch.Tensor, operand: Operand) -> torch.Tensor:
        dtype = torch.float8_e5m2 if (operand == "grad_output" and not pow2
                                      and granularity == ScalingGranularity.TENSORWISE) \
            else torch.float8_e4m3fn
        scale = tensor_to_scale(x, dtype, scaling_granularity=granularity, axiswise_dim=-1,
                                round_scales_to_power_of_2=pow2)
        back: torch.Tensor = (x * scale).to(dtype).float() * scale.reciprocal()
        return back  # through the reciprocal: what _scaled_mm is given
    return dequantised


def _block128(x: torch.Tensor, operand: Operand) -> torch.Tensor:
    """torchao's ``torch_blockwise_scale_act_quant_lhs`` / ``..._weight_quant`` (DeepSeek-V3's
    tiles; their module needs triton, so their steps here): ``amax_to_scale`` per tile."""
    rows = 128 if operand == "weight" else 1
    tiles = x.reshape(x.shape[0] // rows, rows, x.shape[1] // 128, 128)
    scale = amax_to_scale(tiles.abs().amax(dim=(1, 3), keepdim=True), torch.float8_e4m3fn)
    q = (tiles * scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    back: torch.Tensor = (q.float() * (1.0 / scale)).reshape(x.shape)
    return back


def _mx(elem: torch.dtype) -> Reference:
    def dequantised(x: torch.Tensor, operand: Operand) -> torch.Tensor:
        mx = MXTensor.to_mx(x, elem, 32, scaling_mode=ScaleCalculationMode.RCEIL)
        back: torch.Tensor = mx.dequantize(torch.float32)
        return back
    return dequantised


def _nvfp4(x: torch.Tensor, operand: Operand) -> torch.Tensor:
    scale = per_tensor_amax_to_scale(x.abs().amax())
    back: torch.Tensor = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=scale).dequantize(torch.float32)
    return back


REFERENCES: dict[str, Reference] = {
    "fp8_tensorwise": _fp32_scaled(ScalingGranularity.TENSORWISE, pow2=False),
    "fp8_rowwise": _fp32_scaled(ScalingGranularity.AXISWISE, pow2=True),
    "fp8_block128": _block128,
    "mxfp8": _mx(torch.float8_e4m3fn),
    "mxfp4": _mx(torch.float4_e2m1fn_x2),
    "nvfp4": _nvfp4,
}


def _reference_values(x: torch.Tensor, name: str, operand: Operand = "input") -> torch.Tensor:
    return REFERENCES[name](x, operand)


def _reference_stats(x: torch.Tensor, recipe: recipes.Recipe, operand: Operand) -> list[float]:
    """``underflow_frac`` and ``rel_rmse`` from the reference's dequantised values, in float64
    on the host (the others are not in the references' outputs: NaN)."""
    q = _reference_values(x, recipe.name, operand).double()
    x64 = x.double()
    n = x.numel()
    underflow = ((x64 != 0) & (q == 0)).sum().item() / n
    error = torch.linalg.vector_norm(q - x64).item()
    norm = torch.linalg.vector_norm(x64).item()
    return [underflow, math.nan, error / norm if norm else 0.0, math.nan, math.nan]


def _operand_tensor(seed: int, rows: int = 256, cols: int = 256) -> torch.Tensor:
    """Rows spanning 2^-40 to 2^12 so that some underflow in every recipe, with one outlier."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-40, 12, rows, base=2).unsqueeze(1)
    x[7, 3] = 3e4  # one block's outlier
    x[:, 100:140] = 0.0  # structural zeros, whole blocks of them
    return x


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("operand", OPERANDS)
def test_the_dequantised_operand_equals_the_reference(name: str, operand: Operand) -> None:
    for seed in range(3):
        x = _operand_tensor(seed)
        mine = recipes.quantize(x, RECIPES[name], operand).values
        assert torch.equal(mine, REFERENCES[name](x, operand)), (name, operand, seed)


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("operand", OPERANDS)
def test_underflow_and_error_equal_the_references(name: str, operand: Operand) -> None:
    x = _operand_tensor(11)
    stats = _stats(x, (RECIPES[name],), operand)[0].tolist()
    expected = _reference_stats(x, RECIPES[name], operand)
    assert stats[0] == expected[0]
    assert stats[2] == pytest.approx(expected[2], rel=1e-12)


def test_the_scales_equal_torchaos() -> None:
    x = _operand_tensor(5)
    mx = MXTensor.to_mx(x, torch.float8_e4m3fn, 32, scaling_mode=ScaleCalculationMode.RCEIL)
    exponents = mx.scale.view(torch.uint8).float() - 127
    assert torch.equal(torch.log2(recipes.quantize(x, RECIPES["mxfp8"], "input").scales),
                       exponents.reshape(256, 8))
    nv = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_amax_to_scale(x.abs().amax()))
    ours = recipes.quantize(x, RECIPES["nvfp4"], "input").scales
    assert torch.equal(ours, nv.scale.float().reshape(256, 16) * nv.per_tensor_scale)


def test_the_scale_exponents_equal_torchaos() -> None:
    """The exponent the histogram bins: E8M0's (MX), the E4M3 block scale's (NVFP4), the FP32
    dequantising factor's (the FP8 recipes), each ⌊log2⌋ of the reference's own scale."""
    x = _operand_tensor(5)
    mx = MXTensor.to_mx(x, torch.float8_e4m3fn, 32, scaling_mode=ScaleCalculationMode.RCEIL)
    assert torch.equal(recipes.quantize(x, RECIPES["mxfp8"], "input").exponents.float(),
                       (mx.scale.view(torch.uint8).float() - 127).reshape(256, 8))
    nv = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_amax_to_scale(x.abs().amax()))
    assert torch.equal(recipes.quantize(x, RECIPES["nvfp4"], "input").exponents.float(),
                       torch.floor(torch.log2(nv.scale.float())).reshape(256, 16))
    for granularity, name in ((ScalingGranularity.TENSORWISE, "fp8_tensorwise"),
                              (ScalingGranularity.AXISWISE, "fp8_rowwise")):
        pow2 = name == "fp8_rowwise"
        scale = tensor_to_scale(x, torch.float8_e4m3fn, scaling_granularity=granularity,
                                axiswise_dim=-1, round_scales_to_power_of_2=pow2)
        expected = torch.floor(torch.log2(scale.reciprocal())).expand(256, 2)
        assert torch.equal(recipes.quantize(x, RECIPES[name], "input").exponents.float(),
                           expected), name


class TestScaleExponents:
    """``measure``'s last columns: per recipe the greatest exponent of the occupied blocks'
    scales, then their counts by binades below it."""

    @staticmethod
    def _histograms(x: torch.Tensor, chosen: tuple[recipes.Recipe, ...], operand: Operand
                    ) -> torch.Tensor:
        measured = recipes.measure([recipes.sample(x, operand, budget=WHOLE)], chosen, operand)
        return measured[0, len(chosen) * len(STATS) + len(MOMENTS):].view(len(chosen), -1)

    def test_a_crafted_operand(self) -> None:
        """A row of ones beside one of 1e-3 in its first 32 elements: every recipe puts the
        second row's scale 10 binades below the first's (RCEIL and E4M3 rounding included)."""
        x = torch.zeros(2, 64)
        x[0], x[1, :32] = 1.0, 1e-3
        got = self._histograms(x, tuple(RECIPES.values()), "input")
        bins = recipes.SCALE_BINS

        def row(top: float, at_top: int, ten_below: int) -> list[float]:
            counts = [0.0] * bins
            counts[0], counts[10] = at_top, counts[10] + ten_below
            return [top, *counts]

        assert got.tolist() == [
            row(-9, 2, 0),  # fp8_tensorwise: one scale, 1/448, for both 128-element pieces
            row(-8, 1, 1),  # fp8_rowwise: 2^-8 and 2^-18
            row(-9, 1, 1),  # fp8_block128
            row(-8, 2, 1),  # mxfp8: two blocks of ones, one of 1e-3
            row(-2, 2, 1),  # mxfp4
            row(8, 4, 2),  # nvfp4: the ones' block scale is E4M3's max, 448
        ]

    def test_against_the_quantised_blocks(self) -> None:
        """On a random operand spanning 2^-40 to 2^12: the counts of ``quantize``'s exponents
        of the blocks holding a non-zero value, by distance below their greatest, the last bin
        everything farther."""
        x = _operand_tensor(4)
        every = tuple(RECIPES.values())
        for operand in OPERANDS:
            got = self._histograms(x, every, operand)
            for k, recipe in enumerate(every):
                q = recipes.quantize(x, recipe, operand)
                block = recipe.block or recipes.PIECE
                occupied = x.view(x.shape[0], -1, block).abs().amax(dim=2) > 0
                exponents = q.exponents[occupied].tolist()
                top = max(exponents)
                counts = [0.0] * recipes.SCALE_BINS
                for e in exponents:
                    counts[min(int(top - e), recipes.SCALE_BINS - 1)] += 1
                assert got[k].tolist() == [top, *counts], (recipe.name, operand)
                # The rows span 52 binades: one scale for all of them, E4M3's block scales
                # pinned at their least normal, 2^-6, 14 binades below 448 (2^8), or past the
                # last bin.
                if recipe.name == "fp8_tensorwise":
                    assert counts[0] == sum(counts)
                elif recipe.name == "nvfp4":
                    assert counts[14] > 0 and counts[15] == 0
                else:
                    assert counts[-1] > 0, recipe.name

    def test_an_all_zero_operand_has_no_top(self) -> None:
        got = self._histograms(torch.zeros(3, 40), tuple(RECIPES.values()), "weight")
        assert all(math.isnan(v) for v in got[:, 0].tolist())
        assert got[:, 1:].sum().item() == 0


class TestCrafted:
    def test_zeros_lose_nothing(self) -> None:
        for operand in OPERANDS:
            stats = _stats(torch.zeros(4, 64), tuple(RECIPES.values()), operand)
            assert torch.equal(stats, torch.zeros(len(RECIPES), len(STATS), dtype=torch.float64))

    def test_fp8_edges(self) -> None:
        """A tensor-wise scale maps the amax onto E4M3's 448: the least subnormal 2^-9 below it
        is the last value kept; half of it is a tie that rounds to even, zero."""
        amax = 448.0
        least = E4M3.min_subnormal
        x = torch.tensor([[amax, least, least / 2, least * 0.75, -amax]])
        stats = _stats(x, (RECIPES["fp8_tensorwise"],), "input")[0]
        assert stats.tolist() == [pytest.approx(1 / 5), 0.0, stats[2].item(), 0.0, 0.0]
        q = recipes.quantize(x, RECIPES["fp8_tensorwise"], "input").values
        assert q.tolist() == [[amax, least, 0.0, least, -amax]]

    def test_e2m1_values_and_ties(self) -> None:
        """E2M1's eight magnitudes, from its definition: 0, 0.5, 1, 1.5, 2, 3, 4, 6; ties to
        even (0.25 → 0, 0.75 → 1, 2.5 → 2, 5 → 4)."""
        assert (E2M1.max, E2M1.min_normal, E2M1.min_subnormal) == (6.0, 1.0, 0.5)
        v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 0.3, 6.0])
        assert recipes._round(v, E2M1).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0,
                                                     0.5, 6.0]

    @pytest.mark.parametrize("element", [E4M3, E5M2])
    def test_the_rounding_by_definition_equals_torchs_cast(self, element: Element) -> None:
        """The rounder E2M1 uses, run on the float8 formats, equals torch's casts: it is the
        formats' definition, not a table."""
        by_definition = Element(element.name, element.max, element.min_normal, element.mbits,
                                None)
        g = torch.Generator().manual_seed(0)
        v = (torch.randn(100_000, generator=g) * torch.logspace(-12, 16, 100_000, base=2)
             ).clamp(-element.max, element.max)
        assert torch.equal(recipes._round(v, by_definition), recipes._round(v, element))

    def test_a_block_scale_rounded_down_clamps_within_rounding(self) -> None:
        """NVFP4 rounds each block's scale to E4M3; rounded down, the block's amax maps above
        E2M1's 6 and is clamped there. A block of amax 1 beside the tensor's amax T has the
        scale 448 / T: 7.2 rounds down to E4M3's 7.0 (the spacing in [4, 8) is 0.5), so its
        1.0 comes back as 6 · 7.0 / 7.2 of itself. Mapped to 6.17, below 6 + 1 (E2M1's half
        step at the top), it would round to 6 anyway: not saturated."""
        x = torch.zeros(1, 32)
        x[0, 0], x[0, 16] = 1.0, 448 / 7.2
        assert _stats(x, (RECIPES["nvfp4"],), "input")[0, 1].item() == 0.0
        back = recipes.quantize(x, RECIPES["nvfp4"], "input").values[0, 0].item()
        assert back == pytest.approx(7.0 / 7.2, rel=1e-6)
        assert back == _reference_values(x, "nvfp4")[0, 0].item()

    def test_saturation_under_a_stale_amax(self) -> None:
        """A scale from an older, smaller amax (delayed scaling's history): the values the clamp
        changes by more than rounding count, those it would round to 448 anyway do not."""
        x = torch.linspace(0.0, 4.0, 64).reshape(1, 64)
        fresh = recipes.sample(x, "input")
        stale = dataclasses.replace(fresh, tensor_amax=torch.tensor(1.0))
        stats = recipes.measure([stale], (RECIPES["fp8_tensorwise"],), "input")[0]
        above = (x * 448 > E4M3.saturates_above).sum().item()  # x > 464 / 448
        assert E4M3.saturates_above == 464.0 and above == 47  # 4·k/63 > 464/448: k ≥ 17
        assert stats[1].item() == above / 64
        assert recipes.measure([fresh], (RECIPES["fp8_tensorwise"],), "input")[0, 1] == 0.0

    def test_non_finite_elements_count_in_no_statistic(self) -> None:
        """NaN and ±inf are left out: the statistics equal those of the operand with zeros in
        their place (and the same element count). One exception: a weight's 128x128 tile
        holding one takes its scale from the sampled pieces in it, not the tile's rest."""
        x = _operand_tensor(3, rows=64, cols=128)
        holed = x.clone()
        holed[0, :3] = torch.tensor([math.nan, math.inf, -math.inf])
        holed[40, 64] = math.nan  # inside a block that holds finite values too
        zeroed = torch.where(torch.isfinite(holed), holed, 0.0)
        for operand in OPERANDS:
            every = tuple(r for r in RECIPES.values()
                          if operand != "weight" or r.name != "fp8_block128")
            assert torch.equal(_stats(holed, every, operand), _stats(zeroed, every, operand))

    def test_padding_changes_no_count(self) -> None:
        """A row length no block divides is padded with zeros: the counts (fraction · elements),
        the error and the block shares equal those of the operand padded by hand."""
        x = _operand_tensor(4, rows=130, cols=200)
        padded = torch.nn.functional.pad(x, (0, 56, 0, 126))
        for operand in OPERANDS:
            every = tuple(RECIPES.values())
            mine = _stats(x, every, operand)
            theirs = _stats(padded, every, operand)
            assert torch.equal((mine[:, :2] * x.numel()).round(),
                               (theirs[:, :2] * padded.numel()).round())
            assert torch.equal(mine[:, 2:], theirs[:, 2:])

    def test_scale_limits(self) -> None:
        """MX: a block whose amax needs a scale below 2^-127 is pinned at E8M0's least exponent
        (and underflows whole). NVFP4: a block below 2^-6 of what E4M3 spans under the tensor's
        amax is pinned at E4M3's least normal."""
        x = torch.zeros(2, 32)
        x[0] = 1.0
        x[1] = 1e-38  # amax / 448 < 2^-127
        stats = _stats(x, (RECIPES["mxfp8"], RECIPES["nvfp4"]), "input")
        assert stats[0].tolist() == [0.5, 0.0, stats[0, 2].item(), 0.5, 0.0]
        assert stats[1, 3].item() == 0.5


class TestMoments:
    def _moments(self, x: torch.Tensor, operand: Operand = "input") -> list[float]:
        whole = recipes.sample(x, operand, budget=WHOLE)
        return recipes.measure([whole], (), operand)[0].tolist()

    def test_against_float64_on_the_finite_elements(self) -> None:
        g = torch.Generator().manual_seed(2)
        x = torch.randn(64, 96, generator=g) * 3 + 1
        x[5, 7] = 400.0  # an outlier: a heavy tail
        holed = x.clone()
        holed[0, 0], holed[1, 1], holed[2, 2] = math.nan, math.inf, -math.inf
        finite = holed[torch.isfinite(holed)].double()
        centred = finite - finite.mean()
        variance = centred.square().mean()
        expected = [finite.abs().max().item(), finite.square().mean().sqrt().item(),
                    (centred.pow(4).mean() / variance.square()).item(), 3 / x.numel()]
        got = self._moments(holed)
        assert got[0] == expected[0] and got[3] == expected[3]
        assert got[1:3] == pytest.approx(expected[1:3], rel=1e-12)
        assert got[2] > 100  # the outlier

    def test_the_kurtosis_of_an_operand_far_from_zero(self) -> None:
        """A mean 2^20 times its spread (with padding and a NaN beside it): the kurtosis about
        the mean, in two passes, equals float64's to 1e-9, where raw power sums would cancel
        to noise (their fourth central moment is a difference of terms 2^80 times larger)."""
        g = torch.Generator().manual_seed(4)
        x = (torch.randn(48, 200, generator=g) / 8 + 2.0**17).float()
        x[3, 7] = math.nan
        finite = x[torch.isfinite(x)].double()
        centred = finite - finite.mean()
        expected = (centred.pow(4).mean() / centred.square().mean().square()).item()
        got = self._moments(x)
        assert got[2] == pytest.approx(expected, rel=1e-9) and 2.5 < expected < 3.5
        assert got[1] == pytest.approx(finite.square().mean().sqrt().item(), rel=1e-15)

    def test_a_constant_operand_has_no_kurtosis(self) -> None:
        """0.1 in float32, 6000 times: float64 sums float32 values exactly, so the mean is the
        value to the bit and the spread exactly 0, whatever the value."""
        got = self._moments(torch.full((40, 150), 0.1))
        assert math.isnan(got[2]) and got[0] == torch.tensor(0.1).item()

    def test_undefined_moments_are_nan(self) -> None:
        """A constant operand has no kurtosis; one with no finite element has no amax or RMS."""
        constant = self._moments(torch.full((4, 8), 2.0))
        assert constant[:2] == [2.0, 2.0] and math.isnan(constant[2]) and constant[3] == 0.0
        none = self._moments(torch.full((2, 4), math.nan))
        assert all(math.isnan(v) for v in none[:3]) and none[3] == 1.0


class TestSampled:
    """Beyond the budget, every 8th row is quantised under the whole operand's scales."""

    @pytest.mark.parametrize("operand", OPERANDS)
    def test_the_sampled_rows_under_the_whole_operands_scales(self, operand: Operand) -> None:
        x = _operand_tensor(9, rows=512, cols=256)
        x[3, 10] = 5e5  # the amax, in a row the sample leaves out
        every = tuple(RECIPES.values())
        sampled = _stats(x, every, operand, budget=1 << 14)  # 64 rows of 256: stride 8
        rows = x[::8]
        for k, recipe in enumerate(every):
            q = recipes.quantize(x, recipe, operand).values[::8]
            lost = (torch.count_nonzero(rows) - torch.count_nonzero(q)).item() / rows.numel()
            error = (torch.linalg.vector_norm((q - rows).double())
                     / torch.linalg.vector_norm(rows.double())).item()
            assert sampled[k, 0].item() == lost, recipe.name
            assert sampled[k, 2].item() == pytest.approx(error, rel=1e-12), recipe.name
        alone = _stats(rows, every, operand)  # the rows as an operand of their own
        assert sampled[0, 0] > alone[0, 0]  # the outlier's tensor-wise scale flushes more

    def test_the_moments_amax_is_the_whole_operands(self) -> None:
        x = _operand_tensor(9, rows=512, cols=256)
        x[3, 10] = 5e5
        moments = recipes.measure([recipes.sample(x, "input", budget=1 << 14)], (),
                                  "input")[0].tolist()
        assert moments[0] == 5e5

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_a_half_operand_is_measured_as_its_float32_values(self, dtype: torch.dtype) -> None:
        """Rows are picked before they are widened: the same statistics as the float32 copy's
        (the widening is exact), without widening the whole operand first."""
        x = (torch.randn(512, 256, generator=torch.Generator().manual_seed(3)) * 50).to(dtype)
        every = tuple(RECIPES.values())
        for operand in OPERANDS:
            half = recipes.measure([recipes.sample(x, operand)], every, operand)
            wide = recipes.measure([recipes.sample(x.float(), operand)], every, operand)
            assert torch.equal(half, wide)
