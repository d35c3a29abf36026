from __future__ import annotations

import pytest

from ampscope_server.findings.formats import FORMATS


@pytest.mark.parametrize(("name", "max_", "min_normal", "min_subnormal"), [
    # torch.finfo values: the server derives them from the bit layouts, never imports torch.
    ("fp16", 65504.0, 2.0**-14, 2.0**-24),
    ("bf16", 3.3895313892515355e38, 2.0**-126, 2.0**-133),
    ("fp8_e4m3fn", 448.0, 2.0**-6, 2.0**-9),
    ("fp8_e5m2", 57344.0, 2.0**-14, 2.0**-16),
])
def test_format_limits(name: str, max_: float, min_normal: float, min_subnormal: float) -> None:
    fmt = FORMATS[name]
    assert (fmt.max, fmt.min_normal, fmt.min_subnormal) == (max_, min_normal, min_subnormal)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_max_is_computed_once(name: str) -> None:
    # A heatmap's headroom asks for it per cell: the second call returns the cached object
    # (recomputed, the float would be a new object each time).
    fmt = FORMATS[name]
    assert fmt.max is fmt.max
