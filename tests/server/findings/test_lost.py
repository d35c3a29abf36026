"""Honest "lost" numbers (findings/lost.py): structural zeros apart from what the format loses."""

from __future__ import annotations

import pytest

from ampscope_server.findings import LayerInfo, LayerSample
from ampscope_server.findings.lost import lost_to_format, structural_zeros, zeros_flushed
from ampscope_server.findings.thresholds import FLOOR_PRESSURE_FRAC

DENSE = LayerInfo("fc.weight", "float32", (32, 8), 256, "Linear")
EMBED = LayerInfo("emb.weight", "float32", (100, 8), 800, "Embedding")


def _s(zero: float, sub: float = 0.0, under: float = 0.0) -> LayerSample:
    return LayerSample(step=0, layer=0, scale=2.0**16, amax=1.0, amin_nz=1e-3,
                       zero_frac=zero, underflow_frac=under, subnormal_frac=sub)


class TestLost:
    def test_dead_relu_zeros_are_structural(self) -> None:
        # 2.17 % zeros beside values far above the floor: the healthy ReLU MLP of the issue.
        sample = _s(0.0217)
        assert not zeros_flushed(sample, DENSE)
        assert lost_to_format(sample, DENSE) == 0.0
        assert structural_zeros(sample, DENSE) == 0.0217

    def test_zeros_beside_subnormal_values_are_flushed(self) -> None:
        sample = _s(0.4, sub=FLOOR_PRESSURE_FRAC * 0.6, under=0.1)
        assert zeros_flushed(sample, DENSE)
        assert lost_to_format(sample, DENSE) == pytest.approx(0.5)
        assert structural_zeros(sample, DENSE) == 0.0

    def test_just_below_the_floor_pressure_they_are_structural(self) -> None:
        sample = _s(0.4, sub=FLOOR_PRESSURE_FRAC * 0.6 * 0.99, under=0.01)
        assert lost_to_format(sample, DENSE) == 0.01

    def test_an_entirely_zero_dense_gradient_is_lost(self) -> None:
        # tiny_gradient_underflow at scale 1: every FP16 weight gradient flushed.
        assert lost_to_format(_s(1.0), DENSE) == 1.0

    def test_embedding_zeros_never_count(self) -> None:
        assert lost_to_format(_s(1.0, sub=0.0), EMBED) == 0.0
        assert lost_to_format(_s(0.9, sub=0.1, under=0.02), EMBED) == 0.02
        assert structural_zeros(_s(0.9), EMBED) == 0.9

    def test_values_that_flush_always_count_and_the_share_is_capped(self) -> None:
        assert lost_to_format(_s(0.0, sub=0.3, under=0.3), DENSE) == 0.3
        assert lost_to_format(_s(0.9, sub=0.1, under=0.2), DENSE) == 1.0
