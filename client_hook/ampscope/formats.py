"""Target formats: the low-precision dtypes a gradient is judged against.

Every threshold comes from ``torch.finfo``, none typed by hand: ``max`` (fp16: 65504),
``min_normal`` = ``finfo.tiny`` (fp16: 2^-14; below it a value is subnormal) and ``min_subnormal``
= ``tiny * eps`` (fp16: 2^-24). Round-to-nearest sends magnitudes below ``min_subnormal / 2`` to
zero: the underflow threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["FORMATS", "TargetFormat", "infer_target"]


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


def infer_target(
    target_format: str | TargetFormat | None, params: Sequence[torch.Tensor], *, scaling: bool
) -> tuple[TargetFormat, str]:
    """The format judged against, and why. Given, it is that; else FP16/BF16 parameters mean
    that format (the more common; FP16 on a tie), FP32 ones an FP16 autocast with a loss scale
    (``scaling``), else BF16. FP16 autocast without scaling: pass ``target_format="fp16"``."""
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
