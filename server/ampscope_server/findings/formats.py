"""Target low-precision formats, derived from their bit layouts (the server never imports torch).

The values equal `torch.finfo(dtype)` (fp16 max 65504, min normal 2^-14, min subnormal 2^-24;
e4m3fn max 448; e5m2 max 57344); tests/server/findings/test_formats.py pins them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class FloatFormat:
    name: str
    exponent_bits: int
    mantissa_bits: int
    ieee_special: bool = True
    """IEEE-like: the all-ones exponent is reserved for inf/NaN. False for fp8 e4m3fn, which only
    reserves the all-ones exponent *and* mantissa pattern for NaN and has no inf."""

    @property
    def bias(self) -> int:
        return (1 << (self.exponent_bits - 1)) - 1

    @cached_property
    def max(self) -> float:
        # Cached: a heatmap's headroom takes it once per cell
        # (docs/storage.md#heatmaps-raw-folds-and-stored-rollups), and the arithmetic below
        # never changes for a format. (cached_property writes the instance's __dict__ directly,
        # which a frozen dataclass allows.)
        top_exponent = (1 << self.exponent_bits) - (2 if self.ieee_special else 1) - self.bias
        ulp = 2.0**-self.mantissa_bits
        # e4m3fn: the all-ones mantissa at the top exponent is NaN, so the largest is one ulp less.
        top_mantissa = 2.0 - ulp if self.ieee_special else 2.0 - 2 * ulp
        return float(top_mantissa * 2.0**top_exponent)

    @property
    def min_normal(self) -> float:
        return float(2.0 ** (1 - self.bias))

    @property
    def min_subnormal(self) -> float:
        return float(2.0 ** (1 - self.bias - self.mantissa_bits))


FORMATS: dict[str, FloatFormat] = {
    "fp16": FloatFormat("fp16", exponent_bits=5, mantissa_bits=10),
    "bf16": FloatFormat("bf16", exponent_bits=8, mantissa_bits=7),
    "fp8_e4m3fn": FloatFormat("fp8_e4m3fn", exponent_bits=4, mantissa_bits=3, ieee_special=False),
    "fp8_e5m2": FloatFormat("fp8_e5m2", exponent_bits=5, mantissa_bits=2),
}
