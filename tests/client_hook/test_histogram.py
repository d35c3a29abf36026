from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from ampscope.histogram import MAX_EXP, MIN_EXP, NUM_BINS, exponent_histogram


def reference(values: np.ndarray, scale: float) -> list[int]:
    """The contract's bins, by NumPy on float64 true units (exact for power-of-two scales)."""
    counts = [0] * NUM_BINS
    for raw in values.astype(np.float64).ravel():
        g = abs(raw) / scale
        if g == 0:
            counts[0] += 1
        elif not math.isfinite(g):
            counts[1] += 1
        elif g < 2.0**MIN_EXP:
            counts[2] += 1
        elif g >= 2.0 ** (MAX_EXP + 1):
            counts[-1] += 1
        else:
            counts[3 + int(np.floor(np.log2(g))) - MIN_EXP] += 1
    return counts


def exact_reference(values: np.ndarray, scale: float) -> list[int]:
    """The contract's bins in exact rational arithmetic: any scale, no rounding anywhere."""
    counts = [0] * NUM_BINS
    s = Fraction(scale)
    low, high = Fraction(2) ** MIN_EXP, Fraction(2) ** (MAX_EXP + 1)
    for raw in values.astype(np.float64).ravel():
        if not math.isfinite(raw):
            counts[1] += 1
            continue
        g = abs(Fraction(float(raw))) / s
        if g == 0:
            counts[0] += 1
        elif g < low:
            counts[2] += 1
        elif g >= high:
            counts[-1] += 1
        else:
            k = g.numerator.bit_length() - g.denominator.bit_length()  # floor(log2 g) or one more
            if Fraction(2) ** k > g:
                k -= 1
            counts[3 + k - MIN_EXP] += 1
    return counts


def edge_values() -> np.ndarray:
    tiny = np.finfo(np.float32).tiny
    return np.array([
        0.0, -0.0, math.nan, math.inf, -math.inf,
        tiny / 8, tiny * 0.75, 2.0**-41, 2.0**-40, -(2.0**-40) * 1.5, 2.0**-39 * 0.999,
        1.0, -1.0, 1.5, 2.0**20, 2.0**21 * 0.999, 2.0**21, 2.0**30, -3e38,
    ], dtype=np.float32)


class TestExponentHistogram:
    def test_edges_equal_numpy_in_true_units(self) -> None:
        vals = edge_values()
        got = exponent_histogram([torch.from_numpy(vals)], 1.0, False)
        assert got.shape == (1, NUM_BINS) == (1, MAX_EXP - MIN_EXP + 5)
        assert got[0].tolist() == reference(vals, 1.0)
        assert got.sum().item() == vals.size

    @pytest.mark.parametrize("scale", [1.0, 2.0**16, 2.0**-3, 3.0])
    def test_scaled_grads_are_divided_exactly(self, scale: float) -> None:
        gen = torch.Generator().manual_seed(0)
        raw = torch.randn(4000, generator=gen) * torch.exp2(
            torch.randint(-60, 40, (4000,), generator=gen).float())
        raw[:5] = torch.tensor([0.0, math.nan, math.inf, 2.0**-140, 2.0**-130])
        got = exponent_histogram([raw], scale, True)[0].tolist()
        if math.log2(scale).is_integer():  # NumPy's division is exact only for powers of two
            assert got == reference(raw.numpy(), scale)
        assert sum(got) == raw.numel()
        # float64 division keeps raw fp32 subnormals that an fp32 division would flush to zero
        shifted = exponent_histogram([raw.double() / scale], 1.0, False)[0].tolist()
        if math.log2(scale).is_integer():
            assert got == shifted

    @pytest.mark.parametrize("scale", [3.0, 0.1, 1 / 3, 2.0**-100 * 1.7, 2.0**24 * 1.25])
    def test_any_scale_is_exact_at_the_bin_edges(self, scale: float) -> None:
        """Non-power-of-two scales (0.1 and 1/3 are not even float32): values placed on and one
        ulp either side of every bin edge in true units, plus raw float32 subnormals, which a
        collapsed scale (2^-100) turns into regular bins."""
        edges = [float(np.float32(2.0**k * scale)) for k in range(MIN_EXP - 1, MAX_EXP + 3)]
        vals = [v for e in edges for v in (np.nextafter(np.float32(e), np.float32(0)),
                                           np.float32(e),
                                           np.nextafter(np.float32(e), np.float32(np.inf)))]
        tiny = np.finfo(np.float32).tiny
        vals += [np.float32(tiny / 2**k) for k in range(1, 24)] + [np.float32(0.0)]
        raw = np.array(vals, dtype=np.float32)
        got = exponent_histogram([torch.from_numpy(raw)], scale, True)[0].tolist()
        assert got == exact_reference(raw, scale)
        half = torch.from_numpy(raw).half()  # float16 gradients take the same float32 path
        got16 = exponent_histogram([half], scale, True)[0].tolist()
        assert got16 == exact_reference(half.float().numpy(), scale)

    def test_many_layers_mixed_flags_fp16_and_absent(self) -> None:
        gen = torch.Generator().manual_seed(1)
        a = (torch.randn(3, 7, generator=gen) * 1e-4).half()  # fp16 subnormals included
        b = torch.randn(1000, generator=gen) * 1e6
        b[3] = math.nan
        c = torch.zeros(5)
        got = exponent_histogram([a, None, b, c], 2.0**10, [True, True, False, True],
                                 numels=[21, 9, 1000, 5])
        assert got[0].tolist() == reference(a.float().numpy(), 2.0**10)
        assert got[1].tolist() == [9] + [0] * (NUM_BINS - 1)
        assert got[2].tolist() == reference(b.numpy(), 1.0)
        assert got[3].tolist() == [5] + [0] * (NUM_BINS - 1)
        assert got.sum(1).tolist() == [21, 9, 1000, 5]

    def test_groups_split_large_inputs(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from ampscope import histogram
        monkeypatch.setattr(histogram, "GROUP_ELEMS", 100)
        layers = [torch.randn(60) for _ in range(5)]
        got = exponent_histogram(layers, 1.0, False)
        for row, layer in zip(got.tolist(), layers, strict=True):
            assert row == reference(layer.numpy(), 1.0)
