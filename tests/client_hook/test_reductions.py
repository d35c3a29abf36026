from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import ClassVar

import pytest
import torch

from ampscope import fused, native_read, reductions
from ampscope.formats import FORMATS, TargetFormat
from ampscope.reductions import STAT_NAMES, GradStats
from tests.client_hook.reference import (
    FP16,
    assert_same,
    edge_tensor,
    grad_norm,
    grad_norms,
    layer_stats,
    reference,
    unpack,
)
from tests.support.dispatch import AtenOps


def check(
    raws: Sequence[torch.Tensor | None],
    scale: float,
    scaled: Sequence[bool],
    fmt: TargetFormat = FP16,
    numels: Sequence[int] | None = None,
) -> dict[str, list[float]]:
    sizes = list(numels) if numels is not None else [0 if r is None else r.numel() for r in raws]
    want_norm, want = reference(raws, sizes, scale, scaled, fmt)
    for scale_arg in (scale, torch.tensor(scale)):
        out = layer_stats(raws, scale_arg, scaled, fmt, numels=sizes)
        assert out.dtype == torch.float64
        got_norm, got = unpack(out.tolist(), len(raws))
        assert_same(got_norm, want_norm)
        for name in STAT_NAMES:
            for g, w in zip(got[name], want[name], strict=True):
                assert_same(g, w)
        present = [r for r in raws if r is not None]
        if len(present) == len(raws):
            assert_same(grad_norm(GradStats(), raws, scale_arg, scaled).item(), want_norm)
    return got


class TestAgainstReference:
    @pytest.mark.parametrize("scale", [1.0, 2.0**10, 2.0**16, 3.0])
    @pytest.mark.parametrize("scaled", [True, False])
    def test_fp32_edge_values(self, scale: float, scaled: bool) -> None:
        raws = [edge_tensor(scale, torch.float32, scaled, n) for n in (3000, 512, 1, 1500)]
        got = check(raws, scale, [scaled] * len(raws))
        assert all(f > 0 for f in got["underflow_frac"][:1])
        assert all(f > 0 for f in got["subnormal_frac"][:1])

    @pytest.mark.parametrize("scale", [2.0**12, 2.0**16])
    def test_fp16_gradients_scaled(self, scale: float) -> None:
        # A pure fp16 model: grads are fp16 and still scaled, so fp16's own subnormals show.
        raw = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 1e-4
        raw[::5] = 2.0**-20  # a subnormal fp16 value as stored
        raws = [raw.to(torch.float16), torch.randn(300).to(torch.float16)]
        got = check(raws, scale, [True, True])
        assert got["subnormal_frac"][0] > 0.2

    def test_nonfinite_never_poison_amax_amin_l2(self) -> None:
        raw = torch.tensor([0.0, 1e-3, -4.0, math.nan, math.inf, -math.inf, 2.0**-30])
        got = check([raw], 2.0**8, [True])
        assert got["nan_count"] == [1.0] and got["inf_count"] == [2.0]
        assert got["amax"][0] == pytest.approx(4.0 / 2**8)
        assert got["amin_nz"][0] == pytest.approx(2.0**-30 / 2**8)

    def test_all_zero_all_nonfinite_empty_and_absent_layers(self) -> None:
        raws: list[torch.Tensor | None] = [
            torch.zeros(700),
            torch.tensor([math.nan, math.inf, -math.inf]),
            torch.empty(0),
            None,
            torch.ones(5),
        ]
        got = check(raws, 4.0, [True] * 5, numels=[700, 3, 0, 9, 5])
        assert got["zero_frac"][:4] == [1.0, 0.0, 0.0, 1.0]
        assert math.isnan(got["amin_nz"][0]) and got["amax"][0] == 0.0
        assert math.isnan(got["amax"][1]) and got["l2"][1] == 0.0  # sent as null
        assert math.isnan(got["amax"][2])
        assert got["amax"][3] == 0.0 and got["l2"][3] == 0.0

    def test_mixed_scaled_and_unscaled_layers(self) -> None:
        scale = 2.0**14
        raws = [edge_tensor(scale, torch.float32, s, 1000 + 100 * i)
                for i, s in enumerate([True, False, True, False])]
        check(raws, scale, [True, False, True, False])

    @pytest.mark.parametrize("name", ["bf16", "fp8_e4m3fn", "fp8_e5m2"])
    def test_other_formats(self, name: str) -> None:
        raws = [torch.logspace(-45, 3, 2000, base=2.0) * sign for sign in (1.0, -1.0)]
        check(raws, 2.0**6, [False, True], FORMATS[name])

    def test_layers_spanning_several_groups(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(reductions, "MAX_GROUP_ELEMS", 4 * reductions.CHUNK)
        raws = [edge_tensor(8.0, torch.float32, True, n) for n in (100, 3000, 600, 5000, 1)]
        check(raws, 8.0, [True] * 5)

    def test_mixed_layers_spanning_several_groups(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Each group judges its rows on its own rows' bounds (the 35-op read broadcast all the
        layout's per-row bounds against one group's rows and raised)."""
        monkeypatch.setattr(reductions, "MAX_GROUP_ELEMS", 4 * reductions.CHUNK)
        scale = 2.0**14
        flags = [True, False, False, True, False]
        raws = [edge_tensor(scale, torch.float32, f, n)
                for f, n in zip(flags, (100, 3000, 600, 5000, 1), strict=True)]
        check(raws, scale, flags)


class TestGradNorm:
    def test_nan_wins_over_inf(self) -> None:
        raws = [torch.tensor([1.0, math.inf]), torch.tensor([math.nan])]
        assert math.isnan(layer_stats(raws, 1.0, True)[0].item())
        assert math.isnan(grad_norm(GradStats(), raws, 1.0, True).item())

    def test_inf_without_nan(self) -> None:
        raws = [torch.tensor([1.0, -math.inf]), torch.tensor([2.0])]
        assert layer_stats(raws, 1.0, True)[0].item() == math.inf
        assert grad_norm(GradStats(), raws, 1.0, True).item() == math.inf

    def test_huge_scaled_values_do_not_overflow_the_exact_paths(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        raws = [torch.full((1000,), 3e37), torch.full((10,), 1e-40)]
        want = math.sqrt(1000) * 3e37 / 2.0**24
        assert layer_stats(raws, 2.0**24, True)[0].item() == pytest.approx(want, rel=1e-6)
        exact = GradStats(FP16, exact_norms=True)
        assert grad_norm(exact, raws, 2.0**24, True).item() == pytest.approx(want, rel=1e-6)
        # The C loop's every-step read sums in float64 too.
        native_read.library()
        exact_want = math.sqrt(1000) * float(raws[0][0]) / 2.0**24
        assert grad_norm(GradStats(), raws, 2.0**24, True).item() == pytest.approx(exact_want,
                                                                                  rel=1e-14)
        # torch's accumulates in float32: past its range it reads +inf, which
        # StepRecord.to_wire sends as unknown when found_inf says no element was inf.
        monkeypatch.setattr(fused, "NATIVE", False)
        assert grad_norm(GradStats(), raws, 2.0**24, True).item() == math.inf


class TestLaunches:
    def ops_for(self, num_layers: int) -> list[str]:
        stats = GradStats(FP16)
        raws = [torch.randn(37 + 50 * i) for i in range(num_layers)]
        stats.layer_stats(raws, torch.tensor(2.0**10), True)  # builds and caches the plan
        with AtenOps() as mode:
            stats.layer_stats(raws, torch.tensor(2.0**10), True)
        ops: list[str] = mode.ops
        return ops

    def test_launches_do_not_grow_with_layer_count(self) -> None:
        few, many = self.ops_for(3), self.ops_for(60)
        assert few == many
        assert len(few) < 80  # a fixed budget, whatever the model

    def test_no_host_reads(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def boom(*args: object) -> Iterator[None]:
            raise AssertionError("host sync inside reductions")

        raws = [torch.randn(100), torch.tensor([math.nan, 1.0]), None]
        for attr in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
            monkeypatch.setattr(torch.Tensor, attr, boom)
        stats = GradStats(FP16, numels=[100, 2, 4])
        stats.layer_stats(raws, torch.tensor(8.0), [True, False, True])
        grad_norm(stats, raws, torch.tensor(8.0), True)


def test_unpack_rejects_a_wrong_length() -> None:
    with pytest.raises(ValueError, match="expected 17 values, got 3"):
        unpack([0.0, 1.0, 2.0], 2)


def test_scaled_flags_must_match_the_gradients() -> None:
    with pytest.raises(ValueError, match="got 1 scaled flags for 2 gradients"):
        layer_stats([torch.ones(2), torch.ones(2)], 1.0, [True])


class TestPersistentBuffer:
    def test_grad_norms_per_layer_match_the_reference_with_absent_layers(self) -> None:
        raws: list[torch.Tensor | None] = [
            edge_tensor(8.0, torch.float32, True, 700), None, torch.tensor([1.0, math.inf]),
            edge_tensor(8.0, torch.float32, False, 1300).view(13, 100).t(),
        ]
        scaled = [True, True, True, False]
        _, want = reference(raws, [700, 9, 2, 1300], 8.0, scaled, FP16)
        stats = GradStats(FP16, numels=[700, 9, 2, 1300])
        for _ in range(2):  # the second call reuses the cached layout and buffer
            got = grad_norms(stats, raws, torch.tensor(8.0), scaled).tolist()
            assert got[0] == math.inf
            assert got[2] == 0.0 and got[3] == math.inf
            for g, w in zip([got[1], got[4]], [want["l2"][0], want["l2"][3]], strict=True):
                assert_same(g, w)

    def test_padding_stays_zero_after_a_non_finite_scale(self) -> None:
        raws = [torch.ones(5), torch.ones(600)]
        stats = GradStats(FP16)
        stats.layer_stats(raws, math.inf, [False, True])  # 0 · inf in the padding would be NaN
        got = check_cached(stats, raws, 4.0, [False, True])
        assert got["nan_count"] == [0.0, 0.0]

    def test_a_new_shape_gets_a_new_layout(self) -> None:
        stats = GradStats(FP16)
        stats.layer_stats([torch.ones(4, 6)], 2.0, True)
        raws = [torch.arange(24.0).view(6, 4)]  # same numel, other shape
        check_cached(stats, raws, 2.0, [True])


def check_cached(
    stats: GradStats, raws: list[torch.Tensor], scale: float, scaled: list[bool]
) -> dict[str, list[float]]:
    want_norm, want = reference(raws, [r.numel() for r in raws], scale, scaled, FP16)
    got_norm, got = unpack(stats.layer_stats(raws, scale, scaled).tolist(), len(raws))
    assert_same(got_norm, want_norm)
    for name in STAT_NAMES:
        for g, w in zip(got[name], want[name], strict=True):
            assert_same(g, w)
    assert_same(grad_norm(stats, raws, scale, scaled).item(), want_norm)
    return got


@pytest.fixture
def torch_norms(monkeypatch: pytest.MonkeyPatch) -> None:
    """``raw_norms`` through torch's ops: the C loop off (where no compiler builds it)."""
    monkeypatch.setattr(fused, "NATIVE", False)


@pytest.mark.usefixtures("torch_norms")
class TestRawNormsDotPath:
    """raw_norms on dense contiguous float32 CPU gradients without the C loop: one BLAS dot per
    layer (from ``DOT_MIN_ELEMS`` elements; lowered here so that these small layers take it)."""

    @pytest.fixture(autouse=True)
    def _dots_for_any_size(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(reductions, "DOT_MIN_ELEMS", 0)

    GEN = torch.Generator().manual_seed(0)  # the same layers whatever ran before
    LAYERS: ClassVar[list[torch.Tensor]] = [
        torch.randn(300_000, generator=GEN),  # long enough for a vectorised, blocked dot
        torch.zeros(5),
        torch.empty(0),
        torch.tensor([-3.0]),
        torch.tensor([1e-30, 2e-30]),  # squares underflow float32: 0, as _foreach_norm's
        torch.tensor([1.0, math.inf, -2.0]),
        torch.tensor([math.nan, 1.0]),
        torch.tensor([math.inf, math.nan]),
        torch.tensor([-math.inf, 4.0]),
        torch.full((4,), 2e19),  # squares overflow float32: inf, as _foreach_norm's
        torch.randn(7, 9, generator=GEN),  # a matrix, contiguous
    ]

    def test_each_layer_against_float64_and_the_foreach_path(self) -> None:
        got = [float(x) for x in GradStats(FP16).raw_norms(self.LAYERS)]
        foreach = [float(x) for x in torch._foreach_norm(self.LAYERS, 2, dtype=torch.float32)]
        truth = [float(g.double().square().sum().sqrt()) for g in self.LAYERS]
        assert len(got) == len(self.LAYERS)
        for g, f, t in zip(got, foreach, truth, strict=True):
            if math.isnan(f) or math.isinf(f):  # NaN, inf element or overflow: identical
                assert repr(g) == repr(f)
            elif t < 1e-18:
                assert g == f == 0.0
            else:
                # A float32 dot of 300,000 squares: 0.66e-6 median, 1.45e-6 at most over 300
                # seeds with one OpenMP thread (1e-6 failed 36 of them: a fresh-clone CI run
                # when the layers were drawn from whatever RNG state the import found).
                assert g == pytest.approx(t, rel=1e-5)
        assert got[5] == got[8] == got[9] == math.inf and math.isnan(got[6])
        assert math.isnan(got[7]) and got[1] == got[2] == got[4] == 0.0 and got[3] == 3.0

    def test_marks_float32_accumulation(self) -> None:
        stats = GradStats(FP16)
        stats.raw_norms([torch.ones(3)])
        assert stats.float32_norms
        assert GradStats(FP16, exact_norms=True).raw_norms([torch.ones(3)])[0].dtype == (
            torch.float64)

    def test_other_gradients_keep_the_foreach_path(self) -> None:
        for raws in ([torch.ones(4, 2)[:, 0]], [torch.ones(4, dtype=torch.float16)],
                     [torch.ones(4, dtype=torch.bfloat16)], [torch.ones(4), torch.ones(2, 2).t()]):
            with AtenOps() as mode:
                norms = GradStats(FP16).raw_norms(raws)
            assert mode.ops == ["_foreach_norm", "stack"]
            assert [float(n) for n in norms] == [
                float(torch.linalg.vector_norm(r.float())) for r in raws]


class TestCheckedNorms:
    """``checked_norms``: the float32 read plus each layer's bounds, for loops without a
    ``found_inf`` (the monitor's ``exact_norms``)."""

    @pytest.mark.usefixtures("torch_norms")
    def test_an_overflow_is_told_from_an_inf_of_either_sign(self) -> None:
        grads = [torch.full((4,), 1e20), torch.tensor([1.0, -math.inf]),
                 torch.tensor([2.0, math.inf], dtype=torch.float16), torch.tensor([math.nan, 1.0]),
                 torch.tensor([3.0, 4.0], dtype=torch.bfloat16)]
        stats = GradStats(FP16, exact_norms=True)
        norms, flags = stats.checked_norms(grads)
        assert flags is not None and flags.tolist() == [False, True, True, False, False]
        got = norms.tolist()
        assert got[:3] == [math.inf] * 3  # the overflow reads +inf too: the flags tell
        assert math.isnan(got[3]) and got[4] == 5.0
        assert stats.float32_norms  # the read was float32, checked

    @pytest.mark.parametrize("grads", [
        [torch.ones(3, dtype=torch.float64)],  # float64: read in float64
        [torch.ones(3), None],  # absent: the float64 fallback
        [torch.ones(3), torch.zeros(0)],  # empty: aminmax has no answer
    ], ids=["float64", "absent", "empty"])
    def test_layouts_the_float32_read_does_not_take_are_float64_and_unflagged(
            self, grads: list[torch.Tensor | None]) -> None:
        stats = GradStats(FP16, numels=[g.numel() if g is not None else 3 for g in grads],
                          exact_norms=True)
        norms, flags = stats.checked_norms(grads)
        assert flags is None and norms.dtype == torch.float64
        assert norms.tolist()[0] == pytest.approx(math.sqrt(3), rel=1e-15)


@pytest.mark.usefixtures("torch_norms")
class TestGradNormsDirectPath:
    """grad_norms without the padded buffer or the C loop: one read of the gradients (float32
    accumulation, float64 with ``exact_norms`` or float64 gradients)."""

    def test_nan_and_inf_in_different_layers(self) -> None:
        raws = [torch.tensor([1.0, math.inf]), torch.tensor([math.nan, 2.0]), torch.ones(3)]
        got = grad_norms(GradStats(FP16), raws, torch.tensor(4.0), True).tolist()
        assert math.isnan(got[0]) and got[1] == math.inf and math.isnan(got[2])
        assert got[3] == pytest.approx(math.sqrt(3) / 4, rel=1e-6)  # float32 accumulation
        inf_only = grad_norms(GradStats(FP16), raws[::2], 4.0, [True, True]).tolist()
        assert inf_only[0] == math.inf and inf_only[1] == math.inf

    @pytest.mark.parametrize("scaled", [True, False])
    def test_extreme_magnitudes_are_exact_with_exact_norms(self, scaled: bool) -> None:
        # float32 sums of squares overflow from |x| ~ 1.8e19 and underflow below ~1e-19.
        raws = [torch.full((1000,), 3e37), torch.full((500,), 1e-25),
                edge_tensor(8.0, torch.float32, scaled, 700), torch.zeros(0)]
        scale = 2.0**24
        _, want = reference(raws, [r.numel() for r in raws], scale, [scaled] * 4, FP16)
        want_norm = math.sqrt(sum(x * x for x in want["l2"]))
        for scale_arg in (scale, torch.tensor([scale])):
            got = grad_norms(GradStats(FP16, exact_norms=True), raws, scale_arg, scaled).tolist()
            assert_same(got[0], want_norm)
            for g, w in zip(got[1:], want["l2"], strict=True):
                assert_same(g, w)

    @pytest.mark.parametrize("scaled", [True, False])
    def test_float32_range_of_the_direct_path(self, scaled: bool) -> None:
        """Inside float32's range the direct path equals the float64 reference to float32
        rounding; past it, exactly the documented readings: +inf above, 0 below."""
        normal = [edge_tensor(8.0, torch.float32, scaled, 700), torch.randn(300) * 1e3,
                  torch.zeros(0), torch.zeros(40)]
        scale = 2.0**24
        _, want = reference(normal, [r.numel() for r in normal], scale, [scaled] * 4, FP16)
        got = grad_norms(GradStats(FP16), normal, scale, scaled).tolist()
        assert got[0] == pytest.approx(math.sqrt(sum(x * x for x in want["l2"])), rel=1e-6)
        for g, w in zip(got[1:], want["l2"], strict=True):
            assert g == pytest.approx(w, rel=1e-6)
        extreme = [torch.full((1000,), 3e37), torch.full((500,), 1e-25), torch.ones(4)]
        got = grad_norms(GradStats(FP16), extreme, 2.0, scaled).tolist()
        factor = 0.5 if scaled else 1.0
        assert got == [math.inf, math.inf, 0.0, 2.0 * factor]

    def test_float64_gradients_accumulate_in_float64(self) -> None:
        raws = [torch.full((1000,), 3e37, dtype=torch.float64), torch.ones(4)]
        stats = GradStats(FP16)
        for _ in range(2):  # the first call learns float64; the second takes it directly
            got = grad_norms(stats, raws, 1.0, True).tolist()
            assert got[1] == pytest.approx(math.sqrt(1000) * 3e37, rel=1e-12)
            assert got[0] == pytest.approx(math.sqrt(1000 * 9e74 + 4), rel=1e-12)

    def test_fallback_and_back_when_the_layout_changes(self) -> None:
        stats = GradStats(FP16, numels=[700, 9, 300])
        full = [edge_tensor(8.0, torch.float32, True, 700), torch.ones(9),
                torch.randn(3, 100, dtype=torch.float16)]
        partial: list[torch.Tensor | None] = [full[0], None, full[2]]
        sparse = [full[0], torch.ones(9).to_sparse(), full[2]]
        for raws in (full, partial, sparse, full, [full[0], full[1].double(), full[2]]):
            dense = [r.to_dense() if r is not None and r.is_sparse else r for r in raws]
            _, want = reference(dense, [700, 9, 300], 8.0, [True] * 3, FP16)
            got = grad_norms(stats, raws, torch.tensor(8.0), [True, True, True]).tolist()
            assert_same(got[0], math.sqrt(sum(x * x for x in want["l2"])))
            for g, w in zip(got[1:], want["l2"], strict=True):
                assert_same(g, w)

    def test_mixed_flags_match_the_reference(self) -> None:
        raws = [edge_tensor(2.0**10, torch.float32, True, 600),
                edge_tensor(2.0**10, torch.float32, False, 900)]
        _, want = reference(raws, [600, 900], 2.0**10, [True, False], FP16)
        got = grad_norms(GradStats(FP16), raws, 2.0**10, [True, False]).tolist()
        for g, w in zip(got[1:], want["l2"], strict=True):
            assert_same(g, w)

    def ops_for(self, num_layers: int, raw: bool, contiguous: bool = False,
                size: int = 37) -> list[str]:
        """The ops of one call on ``num_layers`` float32 CPU gradients; non-contiguous ones
        take the one-op ``_foreach_norm`` path (the GPU's), contiguous ones the CPU's dots
        once they hold ``DOT_MIN_ELEMS`` elements in all."""
        stats = GradStats(FP16)
        raws = [torch.randn(size + 50 * i, 2)[:, 0] if not contiguous
                else torch.randn(size + 50 * i) for i in range(num_layers)]
        grad_norms(stats, raws, torch.tensor(2.0**10), True)
        with AtenOps() as mode:
            if raw:
                stats.raw_norms(raws)
            else:
                grad_norms(stats, raws, torch.tensor(2.0**10), True)
        ops: list[str] = mode.ops
        return ops

    def test_launches_do_not_grow_with_layer_count(self) -> None:
        few, many = self.ops_for(3, raw=False), self.ops_for(60, raw=False)
        assert few == many

    def test_the_every_step_read_is_one_op(self) -> None:
        # What the monitor's capture launches on a step without per-layer stats: the division
        # by the scale and the global norm are the sender thread's (capture.finish).
        assert self.ops_for(3, raw=True) == self.ops_for(60, raw=True) == [
            "_foreach_norm", "stack"]

    def test_small_contiguous_float32_layers_take_the_one_op_path(self) -> None:
        assert self.ops_for(3, raw=True, contiguous=True) == ["_foreach_norm", "stack"]

    def test_on_the_cpu_contiguous_float32_takes_one_dot_per_layer_from_the_threshold(
        self,
    ) -> None:
        big = reductions.DOT_MIN_ELEMS // 3 + 1  # three layers reach it together
        assert self.ops_for(3, raw=True, contiguous=True, size=big) == ["dot"] * 3 + [
            "stack", "sqrt_"]
        assert self.ops_for(3, raw=True, contiguous=True, size=big - 60) == [
            "_foreach_norm", "stack"]

    def test_no_host_reads(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def boom(*args: object) -> Iterator[None]:
            raise AssertionError("host sync inside reductions")

        raws = [torch.randn(100), torch.tensor([math.nan, 1.0])]
        for attr in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
            monkeypatch.setattr(torch.Tensor, attr, boom)
        stats = GradStats(FP16)
        grad_norms(stats, raws, torch.tensor(8.0), True)
        grad_norms(stats, raws, 8.0, [False, False])


class TestNativeNorms:
    """``raw_norms`` through the C loop (``native_read.NativeNorms``): each layer's norm summed
    in float64, in one call checked and made inline."""

    @pytest.fixture(autouse=True)
    def _built(self) -> None:
        native_read.library()

    LAYERS: ClassVar[list[torch.Tensor]] = [
        *TestRawNormsDotPath.LAYERS,
        torch.tensor([1e-40, -3e-42, 0.5]),  # subnormals' squares, exact in float64
        torch.tensor([2.0, math.inf, 1.5], dtype=torch.float16),
        torch.tensor([3.0, -4.0, 6e-8], dtype=torch.float16),  # a float16 subnormal
        torch.tensor([3.0, math.nan], dtype=torch.bfloat16),
        torch.randn(5, 70_000, generator=torch.Generator().manual_seed(1)).bfloat16(),
    ]

    def test_each_layer_against_float64(self) -> None:
        stats = GradStats(FP16)
        got = stats.raw_norms(self.LAYERS).tolist()
        assert isinstance(stats.native, native_read.NativeNorms) and not stats.float32_norms
        for g, raw in zip(got, self.LAYERS, strict=True):
            want = float(raw.double().square().sum().sqrt())
            if math.isnan(want) or math.isinf(want):
                assert repr(g) == repr(want)
            else:
                assert g == pytest.approx(want, rel=1e-13, abs=0)
        assert got[9] == 2 * float(torch.tensor(2e19))  # no float32 overflow
        assert got[4] == pytest.approx(math.sqrt(5) * 1e-30, rel=1e-6)  # no underflow

    @pytest.mark.parametrize("exact", [False, True])
    def test_the_every_step_read_is_one_op_whatever_the_layers(self, exact: bool) -> None:
        def ops(num_layers: int) -> list[str]:
            stats = GradStats(FP16, exact_norms=exact)
            raws = [torch.randn(37 + 50 * i) for i in range(num_layers)]
            stats.raw_norms(raws)
            with AtenOps() as mode:
                stats.raw_norms(raws)
            return list(mode.ops)

        assert ops(3) == ops(60) == ["empty"]

    def test_the_norms_into_out(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """``out`` is written and returned, by the C loop and (float32 norms, widened) by
        torch's read."""
        raws = [torch.randn(40), torch.randn(3, 3)]
        want = [float(r.double().norm()) for r in raws]
        out = torch.zeros(2, dtype=torch.float64)
        assert GradStats(FP16).raw_norms(raws, out=out) is out
        assert out.tolist() == pytest.approx(want, rel=1e-13)
        monkeypatch.setattr(fused, "NATIVE", False)
        out.zero_()
        assert GradStats(FP16).raw_norms(raws, out=out) is out
        assert out.tolist() == pytest.approx(want, rel=1e-6)

    def test_unscale_in_the_same_call(self) -> None:
        """``unscale``: the C loop's float32 layout unscales as torch's kernel does and says so
        (``unscaled``); the norms are the values' before."""
        stats = GradStats(FP16)
        raws = [torch.randn(40) * 1024, torch.randn(70_000) * 1024]
        want_grads = [r / 1024 for r in raws]
        want = [float(r.double().norm()) for r in raws]
        inv, found = torch.tensor(1 / 1024), torch.zeros(())
        norms = stats.raw_norms(raws, unscale=(inv, found))
        assert stats.unscaled and found.item() == 0.0
        assert norms.tolist() == pytest.approx(want, rel=1e-13)
        assert all(torch.equal(r, w) for r, w in zip(raws, want_grads, strict=True))
        stats.raw_norms(raws)
        assert not stats.unscaled  # reset by every call

    @pytest.mark.parametrize("why", ["bfloat16", "float64 scale", "torch's read"])
    def test_unscale_left_to_torch(self, why: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """Where the C loop cannot unscale as torch would, the norms are read and the gradients
        left as they are, for torch's unscale."""
        raws = [torch.full((40,), 8.0), torch.full((9,), 8.0)]
        inv, found = torch.tensor(0.5), torch.zeros(())
        if why == "bfloat16":
            raws[1] = raws[1].bfloat16()
        elif why == "float64 scale":
            inv = inv.double()
        else:
            monkeypatch.setattr(fused, "NATIVE", False)
        stats = GradStats(FP16)
        norms = stats.raw_norms(raws, acc64=True, unscale=(inv, found))
        assert not stats.unscaled
        assert norms.tolist() == [8.0 * math.sqrt(40), 8.0 * 3]
        assert all(r.float().eq(8.0).all() for r in raws)

    def test_checked_norms_need_no_flags(self) -> None:
        """A float64 sum cannot overflow: +inf is an inf element, as ``found_inf`` would say."""
        norms, flags = GradStats(FP16, exact_norms=True).checked_norms(
            [torch.full((4,), 1e20), torch.tensor([1.0, -math.inf])])
        assert flags is None and norms.tolist() == [2 * float(torch.tensor(1e20)), math.inf]

    def test_a_layout_change_is_read_again(self) -> None:
        stats = GradStats(FP16, numels=[700, 9])
        one = [torch.randn(700), torch.randn(9)]
        other = [torch.randn(700), torch.randn(9, dtype=torch.float16)]
        for raws in (one, other, one, [one[0], None], one):  # a None gradient: torch's read
            want = [0.0 if r is None else float(r.double().norm()) for r in raws]
            assert stats.raw_norms(raws).tolist() == pytest.approx(want, rel=1e-13)
            assert isinstance(stats.native, native_read.NativeNorms)
            assert stats.native.dtypes[1] == (torch.float16 if raws is other else torch.float32)

    @pytest.mark.parametrize("raws", [
        [torch.ones(4, 2)[:, 0]],  # not contiguous
        [torch.ones(3, dtype=torch.float64)],  # not a dtype the loop reads
    ], ids=["strided", "float64"])
    def test_gradients_the_loop_cannot_read_take_torchs(self, raws: list[torch.Tensor]) -> None:
        stats = GradStats(FP16)
        with AtenOps() as mode:
            norms = stats.raw_norms(raws)
        assert stats.native is False and mode.ops[0] == "_foreach_norm"
        assert norms.tolist() == [pytest.approx(float(raws[0].double().norm()), rel=1e-6)]

    def test_fused_false_or_native_off_keep_torchs(self, monkeypatch: pytest.MonkeyPatch) -> None:
        assert GradStats(FP16, fused=False).native is False
        monkeypatch.setattr(fused, "NATIVE", False)
        assert GradStats(FP16).native is False

    def test_torchs_read_while_the_loop_is_built(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """``native_read.soon`` never waits: None while its thread builds the loop."""
        answers: list[object] = [None, None, native_read.library()]
        monkeypatch.setattr(native_read, "soon", lambda: answers.pop(0))
        stats = GradStats(FP16)
        raws = [torch.randn(40), torch.randn(3, 3)]
        for _ in range(2):
            with AtenOps() as mode:
                stats.raw_norms(raws)
            assert mode.ops == ["_foreach_norm", "stack"] and stats.native is None
        with AtenOps() as mode:
            stats.raw_norms(raws)
        assert mode.ops == ["empty"] and isinstance(stats.native, native_read.NativeNorms)
