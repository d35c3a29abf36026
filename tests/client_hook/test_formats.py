from __future__ import annotations

import pytest
import torch

from ampscope.formats import FORMATS, TargetFormat, infer_target


def smallest_positive(dtype: torch.dtype) -> float:
    """The smallest positive value of ``dtype``, from its bit pattern 0...01."""
    bits = {1: torch.uint8, 2: torch.int16}[torch.tensor([], dtype=dtype).element_size()]
    return float(torch.tensor([1], dtype=bits).view(dtype).to(torch.float64))


class TestThresholds:
    @pytest.mark.parametrize("name", sorted(FORMATS))
    def test_min_subnormal_is_the_smallest_positive_bit_pattern(self, name: str) -> None:
        fmt = FORMATS[name]
        assert fmt.min_subnormal == smallest_positive(fmt.dtype)

    @pytest.mark.parametrize("name", sorted(FORMATS))
    def test_max_and_min_normal_come_from_finfo(self, name: str) -> None:
        fmt, info = FORMATS[name], torch.finfo(FORMATS[name].dtype)
        assert (fmt.max, fmt.min_normal) == (info.max, info.smallest_normal)

    def test_fp16_values_of_the_design(self) -> None:
        fp16 = FORMATS["fp16"]
        assert (fp16.max, fp16.min_normal, fp16.min_subnormal) == (65504.0, 2.0**-14, 2.0**-24)
        assert fp16.underflow_threshold == 2.0**-25

    def test_underflow_threshold_is_where_rounding_gives_zero(self) -> None:
        fp16 = FORMATS["fp16"]
        below = torch.tensor(fp16.underflow_threshold * 0.99, dtype=torch.float64)
        above = torch.tensor(fp16.underflow_threshold * 1.01, dtype=torch.float64)
        assert below.to(torch.float16).item() == 0.0
        assert above.to(torch.float16).item() == fp16.min_subnormal


class TestLookup:
    def test_get_by_name_and_identity(self) -> None:
        assert TargetFormat.get("bf16") is FORMATS["bf16"]
        assert TargetFormat.get(FORMATS["fp8_e5m2"]) is FORMATS["fp8_e5m2"]

    def test_unknown_name_says_what_is_known(self) -> None:
        with pytest.raises(ValueError, match=r"unknown target_format 'fp4'; expected one of: "
                           r"bf16, fp16, fp8_e4m3fn, fp8_e5m2"):
            TargetFormat.get("fp4")


class TestInfer:
    """The format from what the model is (#30): FP16 parameters with no scaler were judged as
    BF16 (130.8 bits of headroom)."""

    @staticmethod
    def _params(*dtypes: torch.dtype) -> list[torch.Tensor]:
        return [torch.zeros(2, dtype=dtype) for dtype in dtypes]

    def test_fp16_parameters_without_a_scaler_are_fp16(self) -> None:
        got = infer_target(None, self._params(torch.float16, torch.float16), scaling=False)
        assert got == (FORMATS["fp16"], "2 of 2 parameter tensors are FP16")

    def test_bf16_parameters_are_bf16_with_a_scaler_too(self) -> None:
        got = infer_target(None, self._params(torch.bfloat16, torch.bfloat16, torch.float32),
                    scaling=True)
        assert got == (FORMATS["bf16"], "2 of 3 parameter tensors are BF16")

    def test_fp32_parameters_follow_the_loss_scaling(self) -> None:
        params = self._params(torch.float32)
        assert infer_target(None, params, scaling=True) == (
            FORMATS["fp16"], "FP32 parameters with a loss scale: an FP16 autocast")
        assert infer_target(None, params, scaling=False) == (
            FORMATS["bf16"], "FP32 parameters without a loss scale: a BF16 autocast (or FP32); "
            "pass target_format='fp16' for FP16 without a scaler")

    def test_a_given_format_wins(self) -> None:
        got = infer_target("fp8_e5m2", self._params(torch.float16), scaling=True)
        assert got == (FORMATS["fp8_e5m2"], "given (target_format='fp8_e5m2')")
