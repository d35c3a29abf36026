"""The fused per-layer reduction against the eager path and NumPy, and its fallbacks: both
kernels of a CPU layout, the C loop (``native_read``) and inductor's.

Each distinct layout compiles once per process with inductor (seconds on this CPU): the layouts
below are few and shared by the tests of a class.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from ampscope import fused as fused_module
from ampscope import native_read
from ampscope import reductions as reductions_module
from ampscope.formats import FORMATS
from ampscope.fused import FusedPartials, LayoutState, layout_key
from ampscope.histogram import exponent_histogram, tensor_histogram
from ampscope.partials import COLUMNS, NUM_COLUMNS
from ampscope.reductions import STAT_NAMES, GradStats
from tests.client_hook.reference import DEVICE, FP16, edge_tensor, reference, unpack
from tests.client_hook.test_histogram import exact_reference

# Inductor imports a module that calls torch's own deprecated API; under ``filterwarnings=error``
# that warning would fail the (background) compile. Users without that filter never see it fail;
# with it, the exact eager path is taken.
pytestmark = [pytest.mark.compile, pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")]

COMPILE_TIMEOUT = 600.0
# (shape, dtype, scaled): every supported dtype both ways, a transposed view, 1 and 0 elements.
LAYOUT: list[tuple[tuple[int, ...], torch.dtype, bool]] = [
    ((2999,), torch.float32, True),
    ((50, 60), torch.float32, False),
    ((1024,), torch.float16, True),
    ((1000,), torch.float16, False),
    ((777,), torch.bfloat16, True),
    ((3, 259), torch.bfloat16, False),
    ((13, 7), torch.float32, True),  # filled as the transpose of a (7, 13): strides (1, 13)
    ((1,), torch.float32, False),
    ((0,), torch.float32, True),
]
FLAGS = [scaled for _, _, scaled in LAYOUT]


def make_grads(scale: float, seed: int = 0) -> list[torch.Tensor]:
    """Gradients of ``LAYOUT`` holding zeros, fp16-subnormal and underflowing magnitudes at
    ``scale``, NaN and ±inf in some layers."""
    grads = []
    for i, (shape, dtype, scaled) in enumerate(LAYOUT):
        n = math.prod(shape)
        if shape == (13, 7):
            g = edge_tensor(scale, dtype, scaled, n + seed).narrow(0, 0, n).view(7, 13).t()
        else:
            g = edge_tensor(scale, dtype, scaled, n + seed)[:n].view(shape)
        if i in (1, 4) and n > 3:
            g.view(-1)[:3] = torch.tensor([math.nan, math.inf, -math.inf], dtype=dtype)
        grads.append(g.to(DEVICE))
    return grads


def assert_stats_equal(got: list[float], want: list[float], rel: float) -> None:
    for g, w in zip(got, want, strict=True):
        if math.isnan(w):
            assert math.isnan(g)
        elif rel == 0.0:
            assert g == w
        else:
            assert g == pytest.approx(w, rel=rel, abs=0.0)


def compare(fused_out: torch.Tensor, eager_out: torch.Tensor, grads: list[torch.Tensor],
            scale: float) -> None:
    """Fused == eager to the last bit but the float64 sums of squares; both == NumPy."""
    n = len(grads)
    fused_norm, fused = unpack(fused_out.tolist(), n)
    eager_norm, eager = unpack(eager_out.tolist(), n)
    want_norm, want = reference(grads, [g.numel() for g in grads], scale, FLAGS, FP16)
    # 1/s in float64 against NumPy's division: equal for powers of two, one ulp otherwise.
    magnitude_rel = 0.0 if math.log2(scale).is_integer() else 2.3e-16
    for name in STAT_NAMES:
        exact = name not in ("l2",)
        assert_stats_equal(fused[name], eager[name], 0.0 if exact else 1e-12)
        rel = 1e-12 if name == "l2" else magnitude_rel if name in ("amax", "amin_nz") else 0.0
        assert_stats_equal(fused[name], want[name], rel)
    assert_stats_equal([fused_norm], [eager_norm], 1e-12)
    assert_stats_equal([fused_norm], [want_norm], 1e-12)


BACKENDS = ["native", "inductor"]


def fused_stats(backend: str, fmt: Any = FP16, numels: list[int] | None = None) -> GradStats:
    """A ``GradStats`` whose CPU layouts take ``backend``'s kernel (``fused.NATIVE`` is read
    when its ``FusedPartials`` is made)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fused_module, "NATIVE", backend == "native")
        return GradStats(fmt, numels=numels, fused=True)


def wait_ready(stats: GradStats, backend: str, grads: list[torch.Tensor | None],
               flags: list[bool], histogram: bool = False) -> None:
    """Build the layout and check that ``backend`` made its kernel."""
    assert stats.wait_fused(grads, flags, COMPILE_TIMEOUT, histogram) is LayoutState.READY
    assert stats._fused is not None
    key = fused_module.layout_key(grads, flags, stats.fmt, histogram, stats.numels,
                                  stats._fused.native)
    assert key is not None and stats._fused.layout(key).backend == backend


@pytest.fixture(scope="module", params=BACKENDS)
def compiled(request: pytest.FixtureRequest) -> GradStats:
    stats = fused_stats(request.param)
    wait_ready(stats, request.param, list(make_grads(1.0)), FLAGS)
    return stats

@pytest.fixture
def inductor_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU layouts compile with inductor, as where no C compiler builds the C loop."""
    monkeypatch.setattr(fused_module, "NATIVE", False)


class TestAgainstEagerAndNumpy:
    @pytest.mark.parametrize("scale", [1.0, 3.0, 2.0**10, 2.0**16, 2.0**24, 0.5])
    def test_edge_values(self, compiled: GradStats, scale: float) -> None:
        grads = make_grads(scale)
        got = compiled.layer_stats(grads, torch.tensor(scale, device=DEVICE), FLAGS)
        assert compiled.last_path == "fused"
        compare(got, GradStats(FP16, fused=False).layer_stats(grads, scale, FLAGS), grads, scale)
        _, stats = unpack(got.tolist(), len(grads))
        assert stats["nan_count"][1] == 1 and stats["inf_count"][1] == 2
        assert stats["underflow_frac"][0] > 0 and stats["subnormal_frac"][2] > 0

    def test_all_zero_all_non_finite_and_huge(self, compiled: GradStats) -> None:
        grads = make_grads(1.0)
        grads[0].zero_()
        grads[1].fill_(math.nan)
        grads[2].fill_(-math.inf)
        grads[3].fill_(65504.0)
        grads[6].fill_(3e38)  # squares overflow float32; float64 holds them
        grads[7].fill_(-2.0**-149)  # float32's smallest subnormal
        got = compiled.layer_stats(grads, torch.tensor(2.0**16, device=DEVICE), FLAGS)
        assert compiled.last_path == "fused"
        want = GradStats(FP16, fused=False).layer_stats(grads, 2.0**16, FLAGS)
        compare(got, want, grads, 2.0**16)

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_other_formats_judge_their_own_thresholds(self, backend: str) -> None:
        stats = fused_stats(backend, FORMATS["bf16"])
        grads = make_grads(2.0**6)
        wait_ready(stats, backend, list(grads), FLAGS)
        got = stats.layer_stats(grads, 2.0**6, FLAGS)
        assert stats.last_path == "fused"
        want = GradStats(FORMATS["bf16"], fused=False).layer_stats(grads, 2.0**6, FLAGS)
        assert_stats_equal(got.tolist()[1:], want.tolist()[1:], 1e-12)

    def test_no_host_sync(self, compiled: GradStats, monkeypatch: pytest.MonkeyPatch) -> None:
        grads = make_grads(8.0)
        scale = torch.tensor(8.0, device=DEVICE)
        compiled.layer_stats(grads, scale, FLAGS)

        def boom(*args: object) -> Iterator[None]:
            raise AssertionError("host sync inside the fused path")

        for attr in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
            monkeypatch.setattr(torch.Tensor, attr, boom)
        compiled.layer_stats(grads, scale, FLAGS)
        monkeypatch.undo()
        assert compiled.last_path == "fused"


@pytest.fixture(scope="module", params=BACKENDS)
def compiled_histogram(request: pytest.FixtureRequest) -> GradStats:
    stats = fused_stats(request.param)
    for histogram in (True, False):
        wait_ready(stats, request.param, list(make_grads(1.0)), FLAGS, histogram)
    return stats


class TestHistogramInTheFusedRead:
    """The sampled exponent histogram counted by the same kernel, in the same read as the
    partials: equal to the eager ``exponent_histogram`` and to exact rational arithmetic."""

    @pytest.mark.parametrize("scale", [1.0, 3.0, 2.0**10, 2.0**24, 0.5, 2.0**-100 * 1.7, 0.1])
    def test_counts_equal_eager_and_exact(self, compiled_histogram: GradStats,
                                          scale: float) -> None:
        grads = make_grads(scale)
        tiny = torch.finfo(torch.float32).tiny
        grads[0][:6] = torch.tensor([tiny / 8, 2.0**-149, -tiny, 0.0, 2.0**-40 * scale,
                                     math.nextafter(2.0**21 * scale, 0.0)])
        at = torch.tensor(scale, device=DEVICE)
        table, counts = compiled_histogram.partials(grads, at, FLAGS, histogram=True)
        assert compiled_histogram.last_path == "fused" and counts is not None
        want = exponent_histogram(grads, scale, FLAGS)
        assert counts.dtype == torch.float64 and counts.tolist() == want.tolist()
        for g, row, scaled in zip(grads, counts.tolist(), FLAGS, strict=True):
            values = g.float().reshape(-1).cpu().numpy()
            assert row == exact_reference(values, scale if scaled else 1.0)
        # The partials of the same read are those of the kernel without the histogram.
        alone, none = compiled_histogram.partials(grads, at, FLAGS)
        assert none is None and compiled_histogram.last_path == "fused"
        assert_stats_equal(table.reshape(-1).tolist(), alone.reshape(-1).tolist(), 0.0)

    def test_no_extra_pass_on_a_histogram_step(self, compiled_histogram: GradStats,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
        """The fused histogram step calls neither the eager histogram nor the eager partials."""
        def extra_pass(*args: object, **kwargs: object) -> Any:
            raise AssertionError("an extra pass over the gradients")

        monkeypatch.setattr(reductions_module, "exponent_histogram", extra_pass)
        monkeypatch.setattr(GradStats, "_eager_partials", extra_pass)
        grads = make_grads(8.0)
        at = torch.tensor(8.0, device=DEVICE)
        _, counts = compiled_histogram.partials(grads, at, FLAGS, histogram=True)
        assert compiled_histogram.last_path == "fused" and counts is not None


class TestAbsentGradients:
    """Layers whose gradient is None (no gradient this step): the kernel still takes the
    layout, with their rows as constants (``partials.absent``, a histogram of zeros), equal to
    the eager path's, which reads them as PyTorch defines them (all zeros)."""

    KEPT = (0, 1, 4, 5)
    """Four layers of LAYOUT (float32 and bfloat16, scaled and not): a kernel of its own is
    compiled for this layout, and its compile time grows with the layers."""

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_fused_with_none_gradients_equals_eager(self, backend: str) -> None:
        every = make_grads(2.0**10)
        grads: list[torch.Tensor | None] = [every[i] for i in self.KEPT]
        grads[1], grads[3] = None, None  # a float32 and a bfloat16 layer
        flags = [FLAGS[i] for i in self.KEPT]
        sizes = [math.prod(LAYOUT[i][0]) for i in self.KEPT]
        stats = fused_stats(backend, numels=sizes)
        for histogram in (False, True):
            wait_ready(stats, backend, grads, flags, histogram)
        at = torch.tensor(2.0**10, device=DEVICE)
        eager = GradStats(FP16, numels=sizes, fused=False)
        got = stats.layer_stats(grads, at, flags)
        assert stats.last_path == "fused"
        want = eager.layer_stats(grads, at, flags)
        n = len(grads)
        got_norm, got_rows = unpack(got.tolist(), n)
        want_norm, want_rows = unpack(want.tolist(), n)
        for name in STAT_NAMES:
            assert_stats_equal(got_rows[name], want_rows[name], 1e-12 if name == "l2" else 0.0)
        assert_stats_equal([got_norm], [want_norm], 1e-12)
        assert got_rows["zero_frac"][1] == got_rows["zero_frac"][3] == 1.0
        table, counts = stats.partials(grads, at, flags, histogram=True)
        assert stats.last_path == "fused" and counts is not None
        assert counts.tolist() == exponent_histogram(grads, at, flags, sizes).tolist()
        assert counts[1, 0].item() == sizes[1] and counts[1, 1:].sum().item() == 0
        alone, _ = stats.partials(grads, at, flags)  # the same read without the histogram
        assert_stats_equal(table.reshape(-1).tolist(), alone.reshape(-1).tolist(), 0.0)


class TestLargeOffsets:
    def test_counts_past_2_31_elements(self) -> None:
        """2^31 + 8 elements without the memory: a stride-0 view of 8 values, repeated. Counts
        run in int64 there, and every partial is known by construction."""
        base = torch.tensor([0.0, 1.0, -2.0**-20, 2.0**-26, math.nan, math.inf, -3.0, 2.0**-140],
                            device=DEVICE)
        reps = 2**28 + 1
        big = base.as_strided((reps, 8), (0, 1))
        assert big.numel() == 2**31 + 8
        fused = FusedPartials(FP16)
        grads = [big, torch.ones(3, device=DEVICE)]
        assert fused.wait(grads, [True, True], COMPILE_TIMEOUT) is LayoutState.READY
        got = fused(grads, [True, True], torch.tensor(1.0, dtype=torch.float64, device=DEVICE))
        assert got is not None
        want = [reps, reps, reps, 3 * reps, 4 * reps, reps * (1 + 2.0**-40 + 2.0**-52 + 9),
                3.0, 2.0**-140]
        row = dict(zip(COLUMNS, got[0].tolist(), strict=True))
        for name, value in zip(COLUMNS, want, strict=True):
            if name == "sumsq":
                assert row[name] == pytest.approx(value, rel=1e-12)
            else:
                assert row[name] == value, name
        assert got[1].tolist() == [0, 0, 0, 0, 0, 3.0, 1.0, 1.0]

    def test_histogram_counts_past_2_31_elements_by_construction(self) -> None:
        """The histogram's counts widen to int64 from 2^31 elements (a meta tensor: shapes and
        dtypes only); the fused histogram is not compiled for such a layer (inductor would
        materialise its int64 bin index, 16 GiB), which takes the fused partials and the eager
        histogram's bounded groups instead."""
        big = torch.empty(2**31 + 8, device="meta")
        assert tensor_histogram(big, 1, 0).dtype == torch.int64
        assert tensor_histogram(torch.ones(8), 1, 0).dtype == torch.int32
        huge = torch.zeros(8).as_strided((2**28 + 1, 8), (0, 1))  # 2^31 + 8 elements, 32 bytes
        assert huge.numel() == 2**31 + 8
        assert layout_key([huge], [True], FP16, histogram=True) is None
        assert layout_key([huge], [True], FP16, histogram=False) is not None


class TestCompileOrder:
    def test_a_histogram_layout_compiles_after_its_plain_layout(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """dynamo compiles one graph at a time: the plain layout (every per-layer step) first,
        the histogram one (every ``histogram_every`` steps) once the plain one has ended."""
        began: list[bool] = []
        plain_began, plain_may_end, histogram_began = (threading.Event() for _ in range(3))

        def build(key: fused_module.LayoutKey, *args: object) -> Any:
            began.append(key.histogram)
            if key.histogram:
                histogram_began.set()
            else:
                plain_began.set()
                assert plain_may_end.wait(COMPILE_TIMEOUT)
            return lambda *kernel_args: None

        monkeypatch.setattr(fused_module, "build_kernel", build)
        grads = [torch.randn(13, 17, 3), torch.randn(5)]  # a layout no other test compiles
        fused = FusedPartials(FP16)
        key = layout_key(grads, [True, False], FP16, histogram=True)
        assert key is not None
        histogram = fused.layout(key)
        plain = fused.layout(dataclasses.replace(key, histogram=False))
        # (Before building, a compile thread asks inductor for the CPU's vector ISAs: seconds
        # on a cold cache.)
        assert plain_began.wait(COMPILE_TIMEOUT)
        assert not histogram_began.wait(2.0)  # its thread waits while the plain one compiles
        assert began == [False]

        def states() -> tuple[LayoutState, LayoutState]:
            return histogram.state, plain.state

        assert states() == (LayoutState.COMPILING, LayoutState.COMPILING)
        plain_may_end.set()
        assert histogram.done.wait(COMPILE_TIMEOUT) and plain.done.is_set()
        assert began == [False, True]
        assert states() == (LayoutState.READY, LayoutState.READY)
        assert list(fused._seen) == [dataclasses.replace(key, histogram=False), key]


class TestNativeChoice:
    """Which kernel a CPU layout gets: the C loop, which needs no ``torch.compile``, else
    inductor's (no C compiler, a gradient the loop cannot read as flat memory)."""

    def test_the_c_loop_needs_no_compile(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def must_not_compile(*args: object, **kwargs: object) -> Any:
            raise AssertionError("torch.compile was called")

        monkeypatch.setattr(torch, "compile", must_not_compile)
        grads = [torch.randn(29, 3), torch.randn(17).half(), torch.randn(4).bfloat16()]
        stats = fused_stats("native")
        wait_ready(stats, "native", list(grads), [True, False, True])
        got = stats.layer_stats(grads, 8.0, [True, False, True])
        assert stats.last_path == "fused"
        want = GradStats(FP16, fused=False).layer_stats(grads, 8.0, [True, False, True])
        assert_stats_equal(got.tolist(), want.tolist(), 1e-12)

    @pytest.mark.parametrize("why", ["no-compiler", "not-dense"])
    def test_inductor_where_the_c_loop_cannot_be_had(
        self, why: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        def build(key: fused_module.LayoutKey, *args: object) -> Any:
            return lambda *kernel_args: None  # inductor's compile is not under test here

        monkeypatch.setattr(fused_module, "build_kernel", build)
        monkeypatch.setattr(fused_module, "_LOGGED_NATIVE", False)
        grads = [torch.randn(31, 2), torch.randn(9)]
        if why == "no-compiler":
            def no_compiler(*args: object) -> Any:
                raise native_read.Unavailable("no C compiler ('cc' is not on PATH)")

            monkeypatch.setattr(native_read, "library", no_compiler)
        else:
            grads[0] = torch.randn(31, 4)[:, ::2]  # every other column: gaps in memory
        stats = fused_stats("native")
        with caplog.at_level(logging.INFO, logger="ampscope"):
            wait_ready(stats, "inductor", list(grads), [True, True])
        reason = ("no C compiler ('cc' is not on PATH)" if why == "no-compiler"
                  else "a gradient is not dense in memory")
        assert f"no C loop for the fused reduction ({reason}); compiling it with inductor" in (
            caplog.text)


@pytest.mark.usefixtures("inductor_only")
class TestFallback:
    def test_compile_unavailable(self, monkeypatch: pytest.MonkeyPatch,
                                 caplog: pytest.LogCaptureFixture) -> None:
        def no_compiler(*args: object, **kwargs: object) -> Any:
            raise RuntimeError("no C++ compiler")

        monkeypatch.setattr(torch, "compile", no_compiler)
        monkeypatch.setattr(fused_module, "_LOGGED_FAILURE", False)
        grads = [g.reshape(-1)[: max(g.numel() - 1, 0)] for g in make_grads(2.0**10)]
        stats = GradStats(FP16, fused=True)
        with caplog.at_level(logging.WARNING, logger="ampscope"):
            assert stats.wait_fused(grads, FLAGS, COMPILE_TIMEOUT) is LayoutState.FAILED
        assert "fused reduction did not compile (RuntimeError: no C++ compiler)" in caplog.text
        got = stats.layer_stats(grads, 2.0**10, FLAGS)
        assert stats.last_path == "eager"
        want_norm, want = reference(grads, [g.numel() for g in grads], 2.0**10, FLAGS, FP16)
        norm, out = unpack(got.tolist(), len(grads))
        for name in STAT_NAMES:
            assert_stats_equal(out[name], want[name], 1e-12)
        assert_stats_equal([norm], [want_norm], 1e-12)

    def test_the_python_wrapper_when_the_cpp_one_does_not_build(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """On the CPU the C++ wrapper is tried first; where it fails, the Python wrapper
        compiles the same kernel and the fused path answers with the same numbers."""
        options = fused_module.compile_options(torch.device("cpu"))
        assert options[0]["cpp_wrapper"] is True
        real_compile = torch.compile
        tried: list[dict[str, Any]] = []

        def no_cpp_wrapper(fn: Callable[..., Any], **kwargs: Any) -> Any:
            tried.append(dict(kwargs["options"]))
            if kwargs["options"].get("cpp_wrapper"):
                raise RuntimeError("the C++ wrapper did not build")
            return real_compile(fn, **kwargs)

        monkeypatch.setattr(torch, "compile", no_cpp_wrapper)
        grads = [torch.randn(37, 3), torch.randn(11).half(), torch.zeros(5)]
        grads[0][1, 2] = math.inf
        stats = GradStats(FP16, fused=True)
        assert stats.wait_fused(grads, [True, False, True], COMPILE_TIMEOUT) is LayoutState.READY
        vectors = fused_module.cpu_vector_options()
        assert tried == options == [{"cpp.threads": 1, "cpp_wrapper": True, **vectors},
                                    {"cpp.threads": 1, **vectors}]
        got = stats.layer_stats(grads, 8.0, [True, False, True])
        assert stats.last_path == "fused"
        want = GradStats(FP16, fused=False).layer_stats(grads, 8.0, [True, False, True])
        assert_stats_equal(got.tolist(), want.tolist(), 1e-12)

    @pytest.mark.parametrize("picked,valid,want", [
        (512, [512, 512, 256], {"cpp.simdlen": 256}),
        (256, [512, 512, 256], {}),
        (256, [256], {}),
        (512, [512], {}),
        (128, [128], {}),
        (0, [], {}),
    ], ids=["avx512-and-avx2", "avx2-asked-for", "avx2-only", "avx512-only", "neon", "none"])
    def test_256_bit_vectors_where_inductor_would_take_512(
        self, picked: int, valid: list[int], want: dict[str, int],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """AVX2 instead of AVX-512 where both are there; otherwise inductor's own pick (a
        256-bit request on a CPU without 256-bit vectors would compile scalar code)."""
        from torch._inductor import cpu_vec_isa

        class Isa:
            def __init__(self, bits: int) -> None:
                self.bits = bits

            def bit_width(self) -> int:
                return self.bits

        monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", lambda: Isa(picked))
        monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", lambda: [Isa(b) for b in valid])
        assert fused_module.cpu_vector_options() == want
        assert fused_module.compile_options(torch.device("cpu")) == [
            {"cpp.threads": 1, **want, "cpp_wrapper": True}, {"cpp.threads": 1, **want}]
        assert fused_module.compile_options(torch.device("meta")) == [{}]

    @pytest.mark.parametrize("grads,sizes", [
        ([torch.ones(3, dtype=torch.float64)], True),
        ([torch.ones(3).to_sparse()], True),
        ([torch.ones(3), None], False),
        ([None, None], True),
        ([], True),
    ], ids=["float64", "sparse", "absent-without-sizes", "all-absent", "empty"])
    def test_unsupported_layouts_are_never_compiled(
        self, grads: list[torch.Tensor | None], sizes: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def must_not_compile(*args: object, **kwargs: object) -> Any:
            raise AssertionError("compiled an unsupported layout")

        monkeypatch.setattr(torch, "compile", must_not_compile)
        stats = GradStats(FP16, numels=[3] * len(grads) if sizes else None, fused=True)
        assert stats.wait_fused(grads, True, 1.0) is None
        stats.layer_stats(grads, 2.0, True)
        assert stats.last_path == "eager"

    def test_small_layouts_stay_eager_by_default(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def must_not_compile(*args: object, **kwargs: object) -> Any:
            raise AssertionError("compiled a small layout")

        monkeypatch.setattr(torch, "compile", must_not_compile)
        stats = GradStats(FP16)  # fused=None: auto
        stats.layer_stats([torch.ones(100), torch.ones(7)], 2.0, True)
        assert stats.last_path == "eager"

    def test_the_auto_threshold_is_2_17_elements(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """fused=None asks the kernel from ``FUSE_MIN_ELEMS`` elements on, which takes in the
        sweep's 0.25 M model (252,874 elements: fused 1.07 against eager 1.61 ms)."""
        asked: list[int] = []

        class Recording:
            def __call__(self, grads: list[torch.Tensor], *args: object) -> None:
                asked.append(sum(g.numel() for g in grads))
                return None  # not compiled yet: the eager path answers

        stats = GradStats(FP16)
        monkeypatch.setattr(stats, "_fused", Recording())
        assert reductions_module.FUSE_MIN_ELEMS == 1 << 17 < 252_874
        stats.layer_stats([torch.ones(1 << 16), torch.ones((1 << 16) - 1)], 2.0, True)
        assert asked == [] and stats.last_path == "eager"
        stats.layer_stats([torch.ones(1 << 16), torch.ones(1 << 16)], 2.0, True)
        assert asked == [1 << 17] and stats.last_path == "eager"

    def test_auto_stays_eager_off_the_cpu(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """fused=None never asks the kernel for gradients off the CPU (on CUDA it measured
        slower than eager: ``FUSE_MIN_ELEMS``); fused=True does. Meta tensors stand in for a GPU's
        here: only the device type is read before the kernel is asked."""
        asked: list[str] = []

        def recording(grads: list[torch.Tensor], *args: object) -> None:
            asked.append(grads[0].device.type)

        grads = [torch.empty(1 << 18, device="meta"), torch.empty(5, device="meta")]
        auto, forced = GradStats(FP16), GradStats(FP16, fused=True)
        for stats in (auto, forced):
            monkeypatch.setattr(stats, "_fused", recording)
            stats._fused_partials(grads, [True, True], 2.0, False)
        assert asked == ["meta"]  # the forced one only

    def test_eager_while_compiling_then_fused_then_eager_after_a_guard_miss(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        release = threading.Event()
        real_compile = torch.compile

        def slow_compile(fn: Callable[..., Any], **kwargs: Any) -> Any:
            assert release.wait(COMPILE_TIMEOUT)
            return real_compile(fn, **kwargs)

        monkeypatch.setattr(torch, "compile", slow_compile)
        grads = [torch.randn(41, 3), torch.randn(5).half()]
        grads[0][0, 0] = math.nan
        stats = GradStats(FP16, fused=True)
        first = stats.layer_stats(grads, 4.0, [True, False])
        assert stats.last_path == "eager"  # compiling, on another thread
        release.set()
        assert stats.wait_fused(grads, [True, False], COMPILE_TIMEOUT) is LayoutState.READY
        second = stats.layer_stats(grads, 4.0, [True, False])
        assert stats.last_path == "fused"
        assert_stats_equal(second.tolist(), first.tolist(), 1e-12)
        # Same shapes, strides and dtypes, but requiring grad (create_graph=True makes such
        # gradients): the kernel's guards miss, and nothing compiles on this thread.
        odd = [g.clone().requires_grad_() for g in grads]
        third = stats.layer_stats(odd, 4.0, [True, False])
        assert stats.last_path == "eager"
        assert_stats_equal(third.tolist(), first.tolist(), 1e-12)
        assert stats.wait_fused(grads, [True, False], 0.0) is LayoutState.FAILED


@pytest.mark.usefixtures("inductor_only")
class TestExit:
    def test_exit_waits_for_a_running_compile_at_the_lowest_priority(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A compile still running at interpreter exit is waited for (``_finish_compiles``,
        registered with ``atexit``): a daemon thread left inside inductor's C++ aborted the
        process (exit status 134). The compile thread runs at nice +19 (Linux)."""
        monkeypatch.setattr(fused_module, "COMPILE_NICENESS", 19)  # conftest sets 0
        release = threading.Event()
        nice: list[int] = []

        def slow_compile(fn: Callable[..., Any], **kwargs: Any) -> Any:
            if sys.platform.startswith("linux"):
                nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            release.wait(10)
            return fn

        monkeypatch.setattr(torch, "compile", slow_compile)
        stats = GradStats(FP16, fused=True)
        grads = [torch.ones(7, 3, 11)]  # a layout no other test compiles
        stats.layer_stats(grads, 2.0, True)  # starts the compile; the eager path answers
        assert stats.last_path == "eager"
        assert not fused_module._finish_compiles(timeout=0.05)  # still running
        release.set()
        assert fused_module._finish_compiles(timeout=COMPILE_TIMEOUT)
        assert stats.wait_fused(grads, True, 1.0) is LayoutState.READY
        if sys.platform.startswith("linux"):
            assert nice == [min(19, os.getpriority(os.PRIO_PROCESS, 0) + 19)]

    def test_no_compile_begins_once_the_interpreter_exits(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A compile that would begin after ``_at_exit`` (a histogram layout whose plain
        layout's compile ended then) does not: it would be a thread inside inductor's C++ as
        the interpreter finalizes."""
        exiting = threading.Event()
        exiting.set()
        monkeypatch.setattr(fused_module, "_EXITING", exiting)

        def must_not_build(*args: object) -> Any:
            raise AssertionError("a compile began at exit")

        monkeypatch.setattr(fused_module, "build_kernel", must_not_build)
        grads = [torch.ones(11, 7, 3)]  # a layout no other test compiles
        fused = FusedPartials(FP16)
        key = layout_key(grads, [True], FP16)
        assert key is not None
        entry = fused.layout(key)
        assert entry.done.wait(COMPILE_TIMEOUT)
        assert (entry.state, entry.error) == (LayoutState.FAILED,
                                              "RuntimeError: the interpreter is exiting")


def test_partials_have_eight_columns() -> None:
    assert NUM_COLUMNS == len(STAT_NAMES) == 8
