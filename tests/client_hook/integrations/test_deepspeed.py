"""A real DeepSpeed job under ``ampscope.watch(engine)``: two ranks (gloo, 2 processes on the CPU,
``deepspeed_worker.py``), ZeRO stages 1, 2 and 3 in FP32, BF16 and FP16. One run per job, the
loss the engine trains on, DeepSpeed's own skips and loss scale, and every per-layer statistic of
the full gradient merged from the ranks' partitions, checked against
``deepspeed.utils.safe_get_full_grad`` (stage 3: the real shapes, not its empty placeholders),
and the formats probe's sample of ZeRO-3's gathered weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ampscope.spool import Frame, scan, spool_files
from tests.client_hook.test_collective import LAYERS, assert_full_statistics
from tests.support.distributed import launch
from tests.support.servers import free_port

pytestmark = pytest.mark.frameworks

SHAPES = [[[16, 8], 128], [[16], 16], [[4, 16], 64], [[4], 4]]


FULL = ["stage2+fp32", "stage1+bf16", "stage2+fp16", "stage3+bf16", "stage3+fp16"]
NAN = ["stage2+fp32", "stage2+fp16", "stage1+bf16", "stage3+fp32"]
JOBS = [*FULL, *(f"{mode}+nan" for mode in NAN), "stage2+fp32+torchstyle",
        "stage2+fp32+module", "stage2+fp32+accelerate"]
"""Every two-rank job of this module, run in turn by two launches (``deepspeed_worker``): a
launch's interpreters, imports and process group cost more CPU than a job's four steps. ZeRO
stage 3 jobs get a launch of their own: stage 3 swaps ``torch.nn.functional.linear`` for its
own autograd function for good, which changes the order in which every later job's gradients
become ready."""


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("deepspeed")
    extensions = folder / "extensions"  # where torch would build a C++ extension
    extensions.mkdir()
    for stage3 in (False, True):
        launch("tests.client_hook.integrations.deepspeed_worker",
               [str(folder / "MODE" / "rank{}.json"),
                ",".join(job for job in JOBS if ("stage3" in job) == stage3)], timeout=600,
               env={"TORCH_EXTENSIONS_DIR": str(extensions)})
    return folder


def test_no_job_builds_deepspeeds_shared_memory_all_reduce(jobs: Path) -> None:
    """``without_deepspeed_shm_build`` holds for every job (a DeepSpeed that decides otherwise
    would build it into the launches' extensions folder: ~60 s of CPU per cold machine)."""
    assert list((jobs / "extensions").iterdir()) == []


def run_ds(jobs: Path, mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What each rank of the job ``mode`` wrote."""
    zero_, one = (json.loads((jobs / mode / f"rank{r}.json").read_text()) for r in (0, 1))
    return zero_, one


def assert_one_run(zero_: dict[str, Any], one: dict[str, Any]) -> None:
    assert (zero_["state"], zero_["errors"], zero_["produced"]) == ("closed", 0, 4)
    assert (one["state"], one["errors"], one["records"]) == ("closed", 0, [])
    assert zero_["layers"] == LAYERS and zero_["shapes"] == SHAPES
    assert (zero_["run"]["world_size"], zero_["run"]["rank"]) == (2, 0)
    assert [r["step"] for r in zero_["records"]] == [0, 1, 2, 3]
    for step, record in enumerate(zero_["records"]):
        # Each rank's loss is the mean of its two micro-batches' (DeepSpeed divides by the
        # accumulation steps); the job's is the mean over the ranks.
        mine = [zero_["losses"][step], one["losses"][step]]
        assert record["ranks"]["loss"] == pytest.approx(mine, rel=1e-6)
        assert record["loss"] == pytest.approx(sum(mine) / 2, rel=1e-6)
    assert zero_["wrapped"] == one["wrapped"] == []  # close() unwrapped the engine and optimizer
    # While watched, DeepSpeed's checkpoint and torch.save of the weights work as without it.
    assert zero_["saved"] == one["saved"] == [True, True]
    # The engine's module is told apart (watch() warns: its .grad is not where the pieces are).
    assert zero_["partitioned"] == [True, False]


@pytest.mark.parametrize("mode", FULL)
def test_the_full_gradients_statistics_from_the_zero_partitions(jobs: Path, mode: str) -> None:
    zero_, one = run_ds(jobs, mode)
    assert_one_run(zero_, one)
    assert_full_statistics(zero_)
    records, truth = zero_["records"], zero_["truth"]
    assert [r["skipped"] for r in records] == [t["skipped"] for t in truth] == [False] * 4
    assert all(r["ranks"]["nonfinite"] == [0, 0] for r in records)
    assert [r["lr"] for r in records] == [0.01] * 4
    if "fp16" in mode:  # DeepSpeed's loss scale, read as it moved
        assert [(r["scale_before"], r["scale_after"]) for r in records] == [
            (t["scale_before"], t["scale_after"]) for t in truth]
        assert records[0]["scale_before"] == 1024.0
        assert {r["captured"] for r in records} == {"before_unscale"}
    else:  # no loss scale at all, as without a GradScaler
        assert {(r["scale_before"], r["scale_after"]) for r in records} == {(None, None)}
        assert {r["captured"] for r in records} == {"after_unscale"}


@pytest.mark.parametrize(("stage3", "lower"), [("stage3+bf16", "stage1+bf16"),
                                                ("stage3+fp16", "stage2+fp16")])
def test_the_formats_probe_measures_zero_3s_gathered_weights(jobs: Path, stage3: str,
                                                            lower: str) -> None:
    """The formats probe (#33, default cadence: step 0) on rank 0: ZeRO-3 gathers each Linear's
    weight for its forward, so the sample equals that of a stage that keeps weights whole, in
    the same precision, to the bit (the two Linears, every recipe, the block scales'
    exponents); rank 1 sends none."""
    (zero3, one3), (zero_, _) = run_ds(jobs, stage3), run_ds(jobs, lower)
    sampled = [[r.get("formats") is not None for r in z["records"]] for z in (zero3, zero_)]
    assert sampled == [[True, False, False, False]] * 2
    assert zero3["records"][0]["formats"]["layers"] == [0, 2]
    assert zero3["records"][0]["formats"] == zero_["records"][0]["formats"]
    assert one3["records"] == []


@pytest.mark.parametrize("mode", NAN)
def test_a_nan_on_one_rank_is_deepspeeds_skip_and_names_the_rank(jobs: Path, mode: str) -> None:
    zero_, one = run_ds(jobs, f"{mode}+nan")
    assert one["losses"][1] == "nan" and zero_["losses"][1] != "nan"
    records, truth = zero_["records"], zero_["truth"]
    bad = records[1]
    assert bad["ranks"]["loss"][1] == "nan" and bad["loss"] == "nan"
    assert bad["found_inf"] is True
    # Every layer, in backward order: the last Linear's two first. (Within one Linear, stage 3's
    # own gradient hooks make its weight's gradient ready before its bias's.) Stages 1 and 2:
    # rank 0's partition holds a piece of the first layer only (106 of the 212 elements), rank
    # 1's pieces of all four; stage 3 splits every parameter in two.
    order = (2, 3, 0, 1) if "stage3" in mode else (3, 2, 1, 0)
    assert bad["nonfinite"] == [{"layer": i, "kind": "nan"} for i in order]
    assert bad["ranks"]["nonfinite"] == ([4, 4] if "stage3" in mode else [1, 4])
    assert bad["grad_norm"] == "nan"
    # DeepSpeed checks the gradients' norm and skips the step, in every precision: its own
    # flag, as it decided.
    assert [r["skipped"] for r in records] == [t["skipped"] for t in truth] == [
        False, True, False, False]
    if "fp16" in mode:  # the skip halved DeepSpeed's loss scale (hysteresis 1)
        assert [(r["scale_before"], r["scale_after"]) for r in records] == [
            (t["scale_before"], t["scale_after"]) for t in truth] == [
            (1024.0, 1024.0), (1024.0, 512.0), (512.0, 512.0), (512.0, 512.0)]
    assert [r["found_inf"] for r in records] == [False, True, False, False]


def test_torch_style_backward_with_record_loss(jobs: Path) -> None:
    zero_, one = run_ds(jobs, "stage2+fp32+torchstyle")
    assert_one_run(zero_, one)
    assert_full_statistics(zero_)


def test_accelerates_deepspeed_plugin_prepares_an_engine_watched_as_it_is(jobs: Path) -> None:
    zero_, one = run_ds(jobs, "stage2+fp32+accelerate")
    assert_one_run(zero_, one)
    assert all(r["layers"] is not None and r["grad_norm"] is not None
               for r in zero_["records"])


def test_the_module_inside_an_engine_sends_no_gradient_statistics_and_says_why(
        jobs: Path) -> None:
    """As a framework's callback would hand it over: the engine's module and its optimizer.
    Its .grad is empty under ZeRO: no layer statistic is sent (never zeros), and one warning
    says to watch the engine."""
    zero_, one = run_ds(jobs, "stage2+fp32+module")
    assert (zero_["state"], zero_["errors"], zero_["produced"]) == ("closed", 0, 4)
    assert (one["state"], one["errors"], one["records"]) == ("closed", 0, [])
    assert {(r["layers"] is None, r["grad_norm"], r["histogram"] is None)
            for r in zero_["records"]} == {(True, None, True)}
    assert [m for m in zero_["warnings"] if "DeepSpeed" in m] == [
        "ampscope: these parameters belong to a DeepSpeed ZeRO engine, whose gradients are not "
        "in .grad: gradient statistics are off; watch the engine, ampscope.watch(engine)"]


def test_the_example_runs_offline_into_the_spool(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    env = {**os.environ, "AMPSCOPE_MODE": "offline", "AMPSCOPE_SPOOL_DIR": str(spool),
           "PYTHONWARNINGS": "ignore", "MASTER_PORT": str(free_port())}
    example = Path(__file__).resolve().parents[3] / "examples/integrations/deepspeed_zero.py"
    # The example as a user runs it (``runpy``, as ``__main__``), without DeepSpeed's
    # shared-memory all-reduce build, as every DeepSpeed job here (``without_deepspeed_shm_build``).
    run = ("import runpy, sys; from tests.support.distributed import without_deepspeed_shm_build; "
           "without_deepspeed_shm_build(); sys.argv = sys.argv[1:]; "
           "runpy.run_path(sys.argv[0], run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", run, str(example), "--steps", "12"],
                          env={**env, "PYTHONPATH": os.pathsep.join(
                              [str(example.parents[2]), env.get("PYTHONPATH", "")])}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    records = [r for path in spool_files(spool) for f in scan(path) if isinstance(f, Frame)
               for r in json.loads(f.body)["records"]]
    assert [r["step"] for r in records] == list(range(12))
    assert [r["layers"] is not None for r in records] == [s % 10 == 0 for s in range(12)]


def test_a_stage_zero_engine_is_refused_with_what_to_do(tmp_path: Path) -> None:
    launch("tests.client_hook.integrations.deepspeed_worker",
           [str(tmp_path / "rank{}.json"), "stage0+fp32"], world=1)
    assert json.loads((tmp_path / "rank0.json").read_text()) == {"error": (
        "ampscope watches DeepSpeed engines with ZeRO stage 1, 2 or 3 (this one has stage 0); "
        "for stage 0 watch a plain torch loop, or set zero_optimization.stage")}
