"""The C loop (``native_read``): its table against ``tensor_partials`` and ``tensor_histogram``
(the functions inductor fuses) for every dtype and edge value, and its build by a real C
compiler, through ``$CC`` wrappers that log, change their identity or refuse a flag."""

from __future__ import annotations

import math
import os
import stat
from array import array
from pathlib import Path

import pytest
import torch

from ampscope import native_read
from ampscope.formats import FORMATS
from ampscope.histogram import MIN_EXP, NUM_BINS, scale_bits, tensor_histogram
from ampscope.partials import (
    AMAX,
    AMIN,
    NUM_COLUMNS,
    SUMSQ,
    format_bits,
    tensor_partials,
    threshold_bits,
)
from ampscope.reductions import GradStats

FP16 = FORMATS["fp16"]
UNDER, NORMAL = format_bits(FP16)
BLOCK = 8192  # native_read.c's: a layer longer than it is read in several blocks


def edge_tensor(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """``n`` values of ``dtype`` over its whole range: zeros, its subnormals and float32's,
    normals from 2^-60 to 2^30 (either sign), its largest finite, ±inf and NaN."""
    gen = torch.Generator().manual_seed(seed)
    exps = torch.randint(-60, 31, (n,), generator=gen).to(torch.float64)
    values = torch.randn(n, generator=gen, dtype=torch.float64) * torch.exp2(exps)
    info = torch.finfo(dtype)
    specials = [0.0, -0.0, info.tiny / 4, -info.smallest_normal, info.max, -info.max, math.inf,
                -math.inf, math.nan, 2.0**-149, -(2.0**-140), float(info.tiny)]
    values[:min(n, len(specials))] = torch.tensor(specials[:n], dtype=torch.float64)
    return values.to(dtype)


def want_row(g: torch.Tensor, scaled: bool, bits: torch.Tensor, hist: torch.Tensor,
             histogram: bool) -> list[float]:
    """The row the fused functions give one layer (the kernel's arguments as fused.py's)."""
    if g.numel() == 0:
        row = [0.0] * (NUM_COLUMNS - 1) + [math.inf]
        return row + [0.0] * NUM_BINS if histogram else row
    under, normal = (UNDER, NORMAL) if scaled else (bits[0], bits[1])
    row = tensor_partials(g, under, normal).tolist()
    if histogram:
        es, mb = (hist[0], hist[1]) if scaled else (1, 0)
        row += tensor_histogram(g, es, mb).to(torch.float64).tolist()
    return row


def assert_rows_equal(got: list[float], want: list[float]) -> None:
    """Counts, amax, amin and histogram to the bit; the sum of squares to 1e-12 (summed in
    vector lanes, another order)."""
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if k == SUMSQ:
            assert g == pytest.approx(w, rel=1e-12, abs=0.0)
        else:
            assert g == w, (k, g, w)


def kernel_for(grads: list[torch.Tensor | None], scaled: list[bool], histogram: bool,
               numels: list[int] | None = None) -> native_read.NativeKernel:
    specs = [(tuple(g.shape), g.stride(), g.dtype) for g in grads if g is not None]
    absent = [(i, (numels or [0] * len(grads))[i]) for i, g in enumerate(grads) if g is None]
    return native_read.NativeKernel(native_read.library(), scaled, specs, absent, UNDER, NORMAL,
                                    NUM_BINS if histogram else 0, MIN_EXP)


def arguments(scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(the unscaled layers' threshold bits, ``scale_bits``) as ``FusedPartials`` makes them."""
    at = torch.tensor(scale, dtype=torch.float64)
    thresholds = torch.tensor([FP16.underflow_threshold, FP16.min_normal], dtype=torch.float64)
    return threshold_bits(thresholds, at), scale_bits(at)


class TestTable:
    @pytest.mark.parametrize("histogram", [False, True], ids=["partials", "histogram"])
    @pytest.mark.parametrize("scale", [1.0, 3.0, 2.0**16, 2.0**-100 * 1.7])
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
    def test_rows_equal_the_fused_functions(self, dtype: torch.dtype, scale: float,
                                            histogram: bool) -> None:
        sizes = [0, 1, 7, 12, BLOCK + 3, 3 * BLOCK + 1, 50_001]
        grads: list[torch.Tensor | None] = [edge_tensor(n, dtype, seed=n) for n in sizes]
        scaled = [i % 2 == 0 for i in range(len(sizes))]
        bits, hist = arguments(scale)
        got = kernel_for(grads, scaled, histogram)(
            [g for g in grads if g is not None], bits[0], bits[1], hist)
        assert got.dtype == torch.float64
        assert got.shape == (len(sizes), NUM_COLUMNS + (NUM_BINS if histogram else 0))
        for g, row, flag in zip(grads, got.tolist(), scaled, strict=True):
            assert g is not None
            assert_rows_equal(row, want_row(g, flag, bits, hist, histogram))

    def test_absent_layers_views_and_mixed_dtypes(self) -> None:
        """``None`` gradients (PyTorch: all zeros) as ``partials.absent``, and views whose
        elements fill their memory in another order, read as their contiguous copies."""
        base = edge_tensor(4 * 6 * 5 * 3, torch.float32, seed=1)
        channels_last = base.view(4, 6, 5, 3).contiguous(memory_format=torch.channels_last)
        transposed = edge_tensor(70, torch.bfloat16, seed=2).view(7, 10).t()
        grads: list[torch.Tensor | None] = [channels_last, None, transposed,
                                            edge_tensor(33, torch.float16, seed=3), None]
        numels = [360, 1234, 70, 33, 0]
        scaled = [True, False, False, True, True]
        bits, hist = arguments(2.0**10)
        got = kernel_for(grads, scaled, True, numels)(
            [g for g in grads if g is not None], bits[0], bits[1], hist).tolist()
        for i, g in enumerate(grads):
            n = float(numels[i])
            if g is None:
                assert got[i][:NUM_COLUMNS] == [n, 0.0, 0.0, n, n, 0.0, 0.0, math.inf]
                assert got[i][NUM_COLUMNS:] == [n] + [0.0] * (NUM_BINS - 1)
            else:
                assert_rows_equal(got[i], want_row(g.contiguous(), scaled[i], bits, hist, True))

    def test_extremes_of_amax_and_amin(self) -> None:
        """Only non-finite elements: amax 0 (none finite), amin +inf; only zeros: the same."""
        grads = [torch.tensor([math.nan, math.inf, -math.inf]), torch.zeros(5)]
        bits, hist = arguments(1.0)
        got = kernel_for(list(grads), [True, True], False)(grads, bits[0], bits[1], hist)
        assert got[:, AMAX].tolist() == [0.0, 0.0]
        assert got[:, AMIN].tolist() == [math.inf, math.inf]

    def test_a_call_with_the_wrong_gradients_raises(self) -> None:
        kernel = kernel_for([torch.ones(3), torch.ones(2)], [True, True], False)
        bits, hist = arguments(1.0)
        with pytest.raises(ValueError, match="got 1 gradients for a layout of 2"):
            kernel([torch.ones(3)], bits[0], bits[1], hist)

    @pytest.mark.parametrize("grad,why", [
        (torch.ones(6, 4)[:, ::2], "a gradient is not dense in memory"),
        (torch.ones(3, dtype=torch.float64), "a gradient is not float32, float16 or bfloat16"),
    ], ids=["gaps", "float64"])
    def test_layouts_it_cannot_read(self, grad: torch.Tensor, why: str) -> None:
        with pytest.raises(native_read.Unavailable, match=why):
            kernel_for([grad], [True], False)


class TestThreads:
    """Reads cut into chunks that several threads take (torch's OpenMP team here): the same
    table as one thread's, the sums of squares to 1e-12, and the same table on every call."""

    SIZES = (0, 100, 40_000, 70_000, 200_001, 3 * BLOCK + 5)

    def grads(self) -> list[torch.Tensor | None]:
        dtypes = (torch.float32, torch.bfloat16, torch.float16)
        return [edge_tensor(n, dtypes[i % 3], seed=i) for i, n in enumerate(self.SIZES)] + [None]

    @pytest.mark.parametrize("threads", [2, 3, 8])
    def test_rows_equal_one_threads(self, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
        grads = self.grads()
        numels = [*self.SIZES, 77]
        scaled = [i % 2 == 0 for i in range(len(grads))]
        bits, hist = arguments(2.0**8)
        present = [g for g in grads if g is not None]
        monkeypatch.setattr(native_read, "threads", lambda elements: 1)
        one = kernel_for(grads, scaled, True, numels)(present, bits[0], bits[1], hist)
        monkeypatch.setattr(native_read, "threads", lambda elements: threads)
        several = kernel_for(grads, scaled, True, numels)
        assert several._threads == threads
        got = several(present, bits[0], bits[1], hist)
        assert torch.equal(got, several(present, bits[0], bits[1], hist))
        for row, want in zip(got.tolist(), one.tolist(), strict=True):
            assert_rows_equal(row, want)
        for g, row, flag in zip(grads[:-1], got.tolist(), scaled, strict=False):
            assert g is not None
            assert_rows_equal(row, want_row(g, flag, bits, hist, True))

    @pytest.mark.parametrize("threads", [1, 2, 8])
    def test_norms_on_several_threads(self, threads: int,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(native_read, "threads", lambda elements: threads)
        gen = torch.Generator().manual_seed(3)
        grads = [torch.randn(n, generator=gen) for n in (5, 40_000, 300_001)] + [
            torch.randn(70_000, generator=gen).half(), torch.tensor([math.nan, 1.0]),
            torch.tensor([1.0, -math.inf])]
        stats = GradStats("fp16")
        got = stats.raw_norms(grads)
        assert isinstance(stats.native, native_read.NativeNorms)
        assert stats.native.threads == threads
        assert torch.equal(got[:4], stats.raw_norms(grads)[:4])  # the same sums on every call
        want = [float(g.double().square().sum().sqrt()) for g in grads]
        assert got.tolist()[:4] == pytest.approx(want[:4], rel=1e-13, abs=0)
        assert math.isnan(got[4]) and got[5] == math.inf

    def test_one_thread_per_grain_up_to_torchs(self) -> None:
        grain = native_read.THREAD_MIN_ELEMS
        assert grain == 1 << 15
        assert native_read.threads(0) == native_read.threads(grain - 1) == 1
        assert native_read.threads(5 * grain) == min(5, torch.get_num_threads())
        assert native_read.threads(10**9) == torch.get_num_threads()


class TestUnscaleNorms:
    """``ampscope_unscale_norms``: GradScaler's unscale of float32 gradients, which is torch's
    ``_amp_foreach_non_finite_check_and_unscale_`` to the bit, with the norms of the values as
    they were read in the same pass (``step._UnscaleGrads``)."""

    SIZES = (0, 1, 100, 40_000, 70_000, 200_001)

    def grads(self) -> list[torch.Tensor]:
        """Every float32 class: zeros of both signs, subnormals, normals, the largest, ±inf and
        NaN; a signalling NaN (which a product would quiet) in the second."""
        grads = [edge_tensor(n, torch.float32, seed=i) for i, n in enumerate(self.SIZES)]
        grads[1].view(torch.int32)[0] = 0x7F800001
        return grads

    def unscale(self, grads: list[torch.Tensor], inv: torch.Tensor, found: torch.Tensor,
                threads: int) -> tuple[int, list[float]]:
        layout = native_read.NativeNorms.of(native_read.library(), grads)
        assert layout.unscale is not None
        pointers = array("q", [g.data_ptr() for g in grads])
        out = torch.empty(len(grads), dtype=torch.float64)
        status = layout.unscale(len(grads), pointers.buffer_info()[0],
                                layout.numels.buffer_info()[0], layout.codes.buffer_info()[0],
                                inv.data_ptr(), found.data_ptr(), threads, out.data_ptr())
        return status, out.tolist()

    @pytest.mark.parametrize("threads", [1, 2, 8])
    @pytest.mark.parametrize("scale", [2.0**16, 3.0, 1.0, 2.0**-20])
    def test_torchs_unscale_to_the_bit_and_the_norms(self, scale: float, threads: int) -> None:
        """The gradients and ``found_inf`` as torch leaves them (a scale of 1 writes nothing:
        the signalling NaN stays), the norms of the values before, against float64."""
        mine, theirs = self.grads(), self.grads()
        before = [g.clone() for g in mine]
        inv = torch.tensor(scale, dtype=torch.float64).reciprocal().float()
        found, want_found = torch.zeros(()), torch.zeros(())
        torch._amp_foreach_non_finite_check_and_unscale_(theirs, want_found, inv)
        status, norms = self.unscale(mine, inv, found, threads)
        assert status == 0 and found.item() == want_found.item() == 1.0
        for got, want in zip(mine, theirs, strict=True):
            assert torch.equal(got.view(torch.int32), want.view(torch.int32))
        for norm, g in zip(norms, before, strict=True):
            want_norm = float(g.double().square().sum().sqrt())
            if math.isnan(want_norm) or math.isinf(want_norm):
                assert repr(norm) == repr(want_norm)
            else:
                assert norm == pytest.approx(want_norm, rel=1e-13, abs=0)

    @pytest.mark.parametrize("threads", [1, 2])
    def test_found_inf_is_set_never_cleared(self, threads: int) -> None:
        finite = [torch.randn(n) for n in (3, 70_000)]
        inv = torch.tensor(0.5)
        for start in (0.0, 1.0):
            found = torch.tensor(start)
            assert self.unscale([g.clone() for g in finite], inv, found, threads)[0] == 0
            assert found.item() == start

    def test_other_dtypes_are_refused_before_any_write(self) -> None:
        grads = [torch.full((5,), 8.0), torch.full((3,), 8.0, dtype=torch.bfloat16)]
        layout = native_read.NativeNorms.of(native_read.library(), grads)
        assert layout.unscale is None  # NativeNorms offers it for float32 layouts only
        lib = native_read.library()
        pointers = array("q", [g.data_ptr() for g in grads])
        found, inv = torch.zeros(()), torch.tensor(0.5)
        out = torch.zeros(2, dtype=torch.float64)
        status = lib.ampscope_unscale_norms(
            2, pointers.buffer_info()[0], layout.numels.buffer_info()[0],
            layout.codes.buffer_info()[0], inv.data_ptr(), found.data_ptr(), 1, out.data_ptr())
        assert status == -1 and grads[0].tolist() == [8.0] * 5 and out.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("shape,stride,want", [
    ((4, 5), (5, 1), True),
    ((4, 5), (1, 4), True),  # a transpose
    ((2, 3, 4, 5), (60, 1, 15, 3), True),  # channels-last
    ((4, 1, 5), (5, 99, 1), True),  # a size-1 dimension's stride is never used
    ((4, 5), (10, 2), False),  # every other element
    ((8, 3), (0, 1), False),  # a broadcast row
    ((0, 3), (3, 1), True),
    ((), (), True),
])
def test_dense(shape: tuple[int, ...], stride: tuple[int, ...], want: bool) -> None:
    assert native_read.dense(shape, stride) is want


def wrapper(tmp_path: Path, body: str) -> Path:
    """A ``$CC`` that logs its arguments to ``tmp_path/log`` and then runs ``body``."""
    path = tmp_path / "cc-wrapper"
    path.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "log"}\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def builds_of(tmp_path: Path) -> list[str]:
    """The wrapper's logged calls that built the library (not ``--version``)."""
    log = tmp_path / "log"
    return [line for line in log.read_text().splitlines() if not line.endswith("--version")]


# This machine's: GCC, and torch's OpenMP runtime loaded as libgomp.so.1 (the Linux wheel's), so
# each flag set is tried first with OpenMP (``native_read._openmp``).
SETS = native_read.flag_sets(native_read._compiler()[1])
FIRST = SETS[0]


class TestBuild:
    def test_gcc_beside_torchs_libgomp_builds_with_openmp_first(self) -> None:
        assert [*[(*flags, "-fopenmp") for flags in native_read.FLAG_SETS],
                        *native_read.FLAG_SETS] == SETS

    def test_another_compiler_builds_without_openmp(self) -> None:
        """clang's ``-fopenmp`` links libomp: a second runtime, its threads beside torch's."""
        assert native_read.flag_sets("clang version 17.0.6\nTarget: x86_64-pc-linux-gnu") == list(
            native_read.FLAG_SETS)

    def test_the_loop_runs_on_torchs_own_threads(self) -> None:
        """One OpenMP runtime in the process, and a read on two threads starts none: its team
        is the one torch's own parallel ops use on this thread."""
        native_read.library()
        maps = Path("/proc/self/maps").read_text()
        runtimes = {line.split()[-1] for line in maps.splitlines()
                    if "libgomp" in line or "libomp" in line or "libiomp" in line}
        assert len(runtimes) == 1 and runtimes.pop().endswith("/libgomp.so.1")
        before = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            grads = [torch.randn(1 << 18), torch.randn(3, 1 << 16)]
            torch.randn(1 << 20).abs_()  # torch's team of two on this thread
            threads = len(os.listdir("/proc/self/task"))
            stats = GradStats("fp16", fused=None)
            norms = [stats.raw_norms(grads) for _ in range(3)][-1]
            assert stats.native and stats.native.threads == 2
            assert len(os.listdir("/proc/self/task")) == threads
            want = torch.stack([g.double().square().sum().sqrt() for g in grads])
            torch.testing.assert_close(norms, want, rtol=1e-13, atol=0)
        finally:
            torch.set_num_threads(before)
    def test_built_once_then_loaded_from_the_cache(self, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("CC", str(wrapper(tmp_path, 'exec cc "$@"')))
        cache = tmp_path / "cache"
        first = native_read.library(cache)
        second = native_read.library(cache)
        assert first._name == second._name
        (built,) = builds_of(tmp_path)
        assert built.startswith(" ".join(FIRST) + " -shared -fPIC -o ")
        assert [p.name for p in cache.iterdir()] == [Path(first._name).name]  # no leftovers

    def test_cc_may_be_a_command_of_several_words(self, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
        """``CC="ccache gcc"``, as make splits it: the first word is the program."""
        launcher = wrapper(tmp_path, 'exec "$@"')
        monkeypatch.setenv("CC", f"{launcher} cc")
        native_read.library(tmp_path / "cache")
        (built,) = builds_of(tmp_path)
        assert built.startswith("cc " + " ".join(FIRST))

    def test_the_key_holds_the_compiler_identity(self, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
        cache = tmp_path / "cache"
        monkeypatch.setenv("CC", str(wrapper(tmp_path, 'exec cc "$@"')))
        one = native_read.library(cache)._name
        other = wrapper(tmp_path, 'if [ "$1" = --version ]; then echo "cc 99"; exit 0; fi\n'
                                  'exec cc "$@"')
        monkeypatch.setenv("CC", str(other))
        assert native_read.library(cache)._name != one
        assert len(builds_of(tmp_path)) == 2 and len(list(cache.iterdir())) == 2

    @pytest.mark.parametrize("refused,sets", [("-mprefer-vector-width", 2), ("-march", 3),
                                              ("-fopenmp", 4)])
    def test_flags_the_compiler_refuses_fall_back(self, refused: str, sets: int, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
        """As a compiler off x86 refuses the vector width, one without ``-march=native``, one
        without OpenMP's library."""
        body = (f'case "$*" in *{refused}*) echo "unknown {refused}" >&2; exit 1;; esac\n'
                'exec cc "$@"')
        monkeypatch.setenv("CC", str(wrapper(tmp_path, body)))
        native_read.library(tmp_path / "cache")
        tried = [line.split(" -shared")[0] for line in builds_of(tmp_path)]
        assert tried == [" ".join(flags) for flags in SETS[:sets]]
        assert len(native_read.FLAG_SETS) == 3 and len(SETS) == 6

    def test_unavailable_without_a_compiler_or_a_build(self, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
        with pytest.raises(native_read.Unavailable, match="no C compiler"):
            native_read.library(tmp_path / "cache")
        broken = tmp_path / "broken-cc"  # executable, but its interpreter does not exist
        broken.write_text("#!/nonexistent/sh\n")
        broken.chmod(0o755)
        monkeypatch.setenv("CC", str(broken))
        with pytest.raises(native_read.Unavailable, match="the C compiler did not run"):
            native_read.library(tmp_path / "cache")
        monkeypatch.setenv("CC", str(wrapper(tmp_path, 'echo "boom: $1" >&2; exit 1')))
        with pytest.raises(native_read.Unavailable, match=r"did not build: .*boom"):
            native_read.library(tmp_path / "cache")
        assert list((tmp_path / "cache").iterdir()) == []  # no partial file left

    def test_a_library_that_does_not_load_is_removed(self, tmp_path: Path) -> None:
        """A cached file that is not a library (cut short when a disk filled): ``Unavailable``,
        and the file is gone, so that the next process builds it again."""
        path = native_read._build(tmp_path, native_read.SOURCE.read_bytes())
        path.write_bytes(b"not a library")
        with pytest.raises(native_read.Unavailable, match="did not load"):
            native_read.library(tmp_path)
        assert not path.exists()

    def test_the_process_remembers_a_failure(self, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
        """Each layout asks for the library: a compiler that failed once is not run again."""
        monkeypatch.setattr(native_read, "_LIBRARY", None)
        monkeypatch.setenv("AMPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setenv("CC", str(wrapper(tmp_path, "exit 1")))
        for _ in range(2):
            with pytest.raises(native_read.Unavailable, match="did not build"):
                native_read.library()
        calls = (tmp_path / "log").read_text().splitlines()
        assert [line.split(" -shared")[0] for line in calls] == [
            "--version", *[" ".join(flags) for flags in native_read.FLAG_SETS]]

    def test_an_unwritable_cache_builds_in_a_temporary_directory(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        blocked = tmp_path / "a-file"
        blocked.write_text("")
        monkeypatch.setenv("AMPSCOPE_CACHE_DIR", str(blocked / "cache"))
        monkeypatch.setattr(native_read, "_LIBRARY", None)  # the process's, rebuilt here
        lib = native_read.library()
        assert not Path(lib._name).is_relative_to(blocked)
        assert native_read.library() is lib  # once per process

    @pytest.mark.parametrize("builds", [True, False], ids=["built", "no-compiler"])
    def test_soon_builds_in_the_background_and_never_waits(
            self, builds: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The every-step read's way in: None at once while a thread (one) builds
        the loop, then the library, or False for good where it cannot be built."""
        monkeypatch.setattr(native_read, "_LIBRARY", None)
        monkeypatch.setattr(native_read, "_BUILDER", None)
        monkeypatch.setenv("AMPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
        gate = tmp_path / "gate"  # the compiler waits for it: the build is still running
        monkeypatch.setenv("CC", str(wrapper(
            tmp_path, f'while [ ! -e {gate} ]; do sleep 0.01; done\n'
                      + ('exec cc "$@"' if builds else "exit 1"))))
        assert native_read.soon() is None and native_read.soon() is None
        builder = native_read._BUILDER
        assert builder is not None and builder.name == "ampscope-build"
        gate.write_text("")
        builder.join(60.0)
        assert not builder.is_alive() and native_read._BUILDER is builder  # one thread
        lib = native_read.soon()
        if builds:
            assert lib is native_read.library()
        else:
            assert lib is False
            with pytest.raises(native_read.Unavailable, match="did not build"):
                native_read.library()
        assert builds or len(builds_of(tmp_path)) == len(native_read.flag_sets(""))

    def test_cache_dir(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AMPSCOPE_CACHE_DIR", "/x/y")
        assert native_read.cache_dir() == Path("/x/y")
        monkeypatch.delenv("AMPSCOPE_CACHE_DIR")
        monkeypatch.setenv("XDG_CACHE_HOME", "/c")
        assert native_read.cache_dir() == Path("/c/ampscope")
        monkeypatch.delenv("XDG_CACHE_HOME")
        assert native_read.cache_dir() == Path(os.path.expanduser("~/.cache/ampscope"))
