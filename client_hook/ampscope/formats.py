"""Target formats: the low-precision dtypes a gradient is judged against.

Every threshold is derived from ``torch.finfo`` so no number is typed in by hand:

* ``max``: the largest finite value (fp16: 65504).
* ``min_normal``: the smallest positive normal value, ``finfo.tiny`` (fp16: 2^-14). Below it a value
  is subnormal and loses mantissa bits.
* ``min_subnormal``: the smallest positive subnormal value, ``tiny * eps`` (the normal spacing at
  ``tiny`` divided by ``2^mantissa_bits``; fp16: 2^-14 * 2^-10 = 2^-24). Round-to-nearest sends any
  magnitude below ``min_subnormal / 2`` to zero: that is the underflow threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["FORMATS", "TargetFormat"]


@dataclass(frozen=True)
class TargetFormat:
    """Thresholds of one target dtype; ``name`` is the wire's ``target_format`` string."""

    name: str
    dtype: torch.dtype
    max: float
    min_normal: float
    min_subnormal: float

    @classmethod
    def from_dtype(cls, name: str, dtype: torch.dtype) -> TargetFormat:
        info = torch.finfo(dtype)
        return cls(
            name=name,
            dtype=dtype,
            max=float(info.max),
            min_normal=float(info.tiny),
            min_subnormal=float(info.tiny) * float(info.eps),
        )

    @classmethod
    def get(cls, fmt: str | TargetFormat) -> TargetFormat:
        """Look a format up by wire name; a ``TargetFormat`` is returned as is."""
        if isinstance(fmt, TargetFormat):
            return fmt
        try:
            return FORMATS[fmt]
        except KeyError:
            known = ", ".join(sorted(FORMATS))
            raise ValueError(f"unknown target_format {fmt!r}; expected one of: {known}") from None

    @property
    def underflow_threshold(self) -> float:
        """Magnitudes strictly below this flush to zero when rounded into the format."""
        return self.min_subnormal / 2


FORMATS: dict[str, TargetFormat] = {
    name: TargetFormat.from_dtype(name, dtype)
    for name, dtype in (
        ("fp16", torch.float16),
        ("bf16", torch.bfloat16),
        ("fp8_e4m3fn", torch.float8_e4m3fn),
        ("fp8_e5m2", torch.float8_e5m2),
    )
}
