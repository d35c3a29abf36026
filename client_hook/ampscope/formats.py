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

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["FORMATS", "TargetFormat", "infer"]


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


def infer(
    target_format: str | TargetFormat | None, params: Sequence[torch.Tensor], *, scaling: bool
) -> tuple[TargetFormat, str]:
    """The format the gradients are judged against, and why, in the run header's words.

    Given explicitly, it is that. Otherwise from what the model is: FP16 parameters (e.g.
    ``model.half()``) mean fp16, BF16 parameters bf16 (the more common of the two when both
    are present, FP16 on a tie: the narrower range); FP32 parameters with a loss scale
    (``scaling``: an enabled ``GradScaler``, DeepSpeed's FP16) mean an FP16 autocast;
    without one, a BF16 autocast (or FP32), judged against BF16's range. An FP16 autocast
    without loss scaling is not seen at ``watch()``: pass ``target_format="fp16"`` for it."""
    if target_format is not None:
        fmt = TargetFormat.get(target_format)
        return fmt, f"given (target_format={fmt.name!r})"
    half = sum(1 for p in params if p.dtype == torch.float16)
    brain = sum(1 for p in params if p.dtype == torch.bfloat16)
    if half or brain:
        name, count = ("fp16", half) if half >= brain else ("bf16", brain)
        return FORMATS[name], (f"{count} of {len(params)} parameter tensors are "
                               f"{name.upper()}")
    if scaling:
        return FORMATS["fp16"], "FP32 parameters with a loss scale: an FP16 autocast"
    return FORMATS["bf16"], ("FP32 parameters without a loss scale: a BF16 autocast (or FP32); "
                             "pass target_format='fp16' for FP16 without a scaler")
