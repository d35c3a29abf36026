"""Two real ranks (gloo, 2 processes on the CPU) under DDP and FSDP2 ``fully_shard``: one run
per job, every rank's loss, the full gradients' statistics from the shards, the formats probe's
sample of the whole weights, and no rank ever left waiting (``dist_worker.py`` runs each
rank)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from ampscope import collective
from tests.support.distributed import run_job, run_jobs

pytestmark = pytest.mark.multiprocess

# The jobs that end cleanly on every rank run in one launch (``jobs``); a rank that never
# watches (``alone``), a hook that fails (``break``) and a world of one run on their own.
BATCHED = ["ddp", "ddp+nan", "ddp+all", "fsdp2", "fsdp2+noscaler", "fsdp1",
           "fsdp1+shardedscaler", "fsdp1flat+nan"]
Jobs = dict[str, list[dict[str, Any]]]  # what each rank wrote, by job


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    return run_jobs(tmp_path_factory.mktemp("collective"), BATCHED)


LAYERS = ["0.weight", "0.bias", "2.weight", "2.bias"]


def close(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-6)


class TestOneRunPerJob:
    def test_ddp_rank_zero_sends_every_ranks_loss(self, jobs: Jobs) -> None:
        zero, one = jobs["ddp"]
        assert (zero["state"], zero["produced"], zero["errors"]) == ("closed", 4, 0)
        assert [r["step"] for r in zero["records"]] == [0, 1, 2, 3]
        assert zero["layers"] == LAYERS  # no "module."
        assert (zero["run"]["rank"], zero["run"]["world_size"]) == (0, 2)
        # Rank 1 contributed its share and sent nothing.
        assert (one["state"], one["produced"], one["records"], one["errors"]) == (
            "closed", 0, [], 0)
        for step, record in enumerate(zero["records"]):
            assert record["ranks"] == {"loss": [zero["losses"][step], one["losses"][step]],
                                       "nonfinite": [0, 0]}
            # The job's loss: the mean of the ranks', as the frameworks log it.
            assert record["loss"] == (zero["losses"][step] + one["losses"][step]) / 2

    def test_the_rank_whose_loss_went_nan_is_named(self, jobs: Jobs) -> None:
        zero, one = jobs["ddp+nan"]
        assert one["losses"][2] == "nan" and zero["losses"][2] != "nan"
        record = zero["records"][2]
        # DDP averaged rank 1's NaN gradients into everyone's: every layer on both ranks.
        assert record["ranks"] == {"loss": [zero["losses"][2], "nan"], "nonfinite": [4, 4]}
        assert (record["found_inf"], record["skipped"], record["grad_norm"]) == (True, True, "nan")
        assert record["loss"] == "nan"  # the job's mean loss
        assert [r["ranks"]["nonfinite"] for r in zero["records"]] == [
            [0, 0], [0, 0], [4, 4], [0, 0]]

    def test_all_ranks_record_runs_of_their_own(self, jobs: Jobs) -> None:
        zero, one = jobs["ddp+all"]
        assert [(r["produced"], r["run"]["rank"], r["run"]["world_size"]) for r in (zero, one)
                ] == [(4, 0, 2), (4, 1, 2)]
        assert all(rec["ranks"] is None for r in (zero, one) for rec in r["records"])

    def test_a_rank_that_never_watches_leaves_rank_zero_alone(self, tmp_path: Path) -> None:
        zero, one = run_job(tmp_path, "ddp+alone")  # dist_timeout_s=3
        assert (zero["state"], zero["produced"]) == ("closed", 4)
        assert [r["ranks"] for r in zero["records"]] == [None] * 4
        assert all(r["layers"] is not None for r in zero["records"])  # DDP: rank 0's are whole
        assert one["state"] is None


def assert_full_statistics(zero: dict[str, Any]) -> None:
    """Rank 0's records carry the statistics of the full gradients the worker gathered."""
    assert len(zero["records"]) == len(zero["truth"]) == 4
    for step, (record, truth) in enumerate(zip(zero["records"], zero["truth"], strict=True)):
        assert close(record["grad_norm"], truth["grad_norm"])
        got, want = record["layers"], truth["layers"]
        assert set(got) == set(want)
        for name in want:
            if name == "l2":  # float64 sums of squares, added in another order
                assert all(close(a, b) for a, b in zip(got[name], want[name], strict=True))
            else:  # counts, max, min and the fractions of exact counts: exactly
                assert got[name] == want[name], name
        if step % 2 == 0:  # histogram_every=2
            assert record["histogram"]["counts"] == truth["histogram"]
        else:
            assert record["histogram"] is None


class TestSharded:
    @pytest.mark.parametrize("mode", ["fsdp2", "fsdp2+noscaler"])
    def test_the_full_gradients_statistics_from_the_shards(
            self, jobs: Jobs, mode: str) -> None:
        zero, one = jobs[mode]
        assert (zero["produced"], zero["errors"], one["produced"], one["errors"]) == (4, 0, 0, 0)
        assert zero["layers"] == LAYERS
        assert zero["truth"] == one["truth"]  # both ranks gathered the same full gradients
        assert_full_statistics(zero)
        for step, record in enumerate(zero["records"]):
            assert record["ranks"] == {"loss": [zero["losses"][step], one["losses"][step]],
                                       "nonfinite": [0, 0]}

    def test_one_process_reads_its_one_shard_as_the_whole(self, tmp_path: Path) -> None:
        (zero,) = run_job(tmp_path, "fsdp2", world=1)
        assert (zero["produced"], zero["errors"], zero["run"]["world_size"]) == (4, 0, 1)
        assert_full_statistics(zero)
        assert all(r["ranks"] is None for r in zero["records"])

    @pytest.mark.parametrize("mode", ["fsdp1", "fsdp1+shardedscaler"])
    def test_fsdp1_pieces_merge_into_the_full_gradients_statistics(
            self, jobs: Jobs, mode: str) -> None:
        """``FullyShardedDataParallel(use_orig_params=True)``, with a ``GradScaler`` or FSDP1's
        ``ShardedGradScaler``: each parameter is this rank's 1-D piece (rank 0 holds 0.weight
        whole and nothing else, here); the layer table has the real shapes, and the merged
        statistics are those of the gathered gradients."""
        zero, one = jobs[mode]
        assert (zero["produced"], zero["errors"], one["errors"]) == (4, 0, 0)
        assert zero["layers"] == LAYERS
        assert zero["shapes"] == [[[16, 8], 128], [[16], 16], [[4, 16], 64], [[4], 4]]
        assert zero["truth"] == one["truth"]
        assert_full_statistics(zero)

    def test_fsdp1_flat_parameters_are_never_sent_as_layers_but_the_ranks_are(
            self, jobs: Jobs) -> None:
        """``use_orig_params=False``: the parameters are flat pieces of whole units, not
        layers. No layer statistics or norm; every rank's loss and its pieces' finiteness
        (rank 1's NaN loss reached both ranks' gradients)."""
        zero, one = jobs["fsdp1flat+nan"]
        assert (zero["produced"], zero["errors"], one["errors"]) == (4, 0, 0)
        assert all((r["layers"], r["grad_norm"], r["histogram"], r["nonfinite"]) == (
            None, None, None, None) for r in zero["records"])
        assert [r["ranks"]["loss"] for r in zero["records"]] == [
            [a, b] for a, b in zip(zero["losses"], one["losses"], strict=True)]
        counts = [r["ranks"]["nonfinite"] for r in zero["records"]]
        assert counts[:2] + counts[3:] == [[0, 0]] * 3 and all(c > 0 for c in counts[2])
        assert [r["found_inf"] for r in zero["records"]] == [False, False, True, False]

    def test_a_rank_whose_hook_fails_never_blocks_and_no_partial_number_is_sent(
            self, tmp_path: Path) -> None:
        zero, one = run_job(tmp_path, "fsdp2+break")
        assert (one["errors"], one["state"]) == (3, "closed")  # disabled after 3, then closed
        assert (zero["produced"], zero["errors"]) == (4, 0)
        for step, record in enumerate(zero["records"]):
            # Rank 1's piece is missing: the layers and the norm are unknown, not rank 0's half.
            assert (record["grad_norm"], record["layers"], record["histogram"]) == (
                None, None, None)
            assert record["ranks"] == {"loss": [zero["losses"][step], None],
                                       "nonfinite": [0, None]}
            assert record["loss"] == zero["losses"][step]  # rank 1's is missing: rank 0's own


class TestFormats:
    """The formats probe (#33) at its default cadence samples step 0, on rank 0 alone."""

    @pytest.mark.parametrize("mode", ["fsdp2", "fsdp1", "fsdp1+shardedscaler"])
    def test_rank_zero_measures_the_whole_weights_under_fsdp(self, jobs: Jobs, mode: str
                                                             ) -> None:
        """FSDP2's ``fully_shard`` and FSDP1 with ``use_orig_params`` run each Linear's forward
        on its gathered weight, so rank 0's sample (the same seed and batch as under DDP)
        equals DDP's to the bit: the two Linears, every recipe, the block scales' exponents."""
        ddp, sharded = jobs["ddp"][0]["records"], jobs[mode][0]["records"]
        assert [i for i, r in enumerate(ddp) if r.get("formats")] == [0]
        assert [i for i, r in enumerate(sharded) if r.get("formats")] == [0]
        assert ddp[0]["formats"]["layers"] == [0, 2]
        assert sharded[0]["formats"] == ddp[0]["formats"]
        assert not any(r.get("formats") for r in jobs[mode][1]["records"])

    def test_fsdp1_flat_parameters_leave_no_linear_weight_to_measure(self, jobs: Jobs) -> None:
        """``use_orig_params=False``: the layer table holds the flat parameter, no Linear's
        weight, so no module is measured and no record carries formats."""
        zero = jobs["fsdp1flat+nan"][0]
        assert zero["layers"] == ["_flat_param"]
        assert not any(r.get("formats") for r in zero["records"])


class TestWithoutAProcessGroup:
    def test_dtensor_parameters_are_sharded(self) -> None:
        assert not collective.sharded([torch.nn.Parameter(torch.zeros(2))])

    def test_local_is_the_tensor_itself_outside_dtensors(self) -> None:
        t = torch.zeros(3)
        assert collective.local(t) is t and collective.local(None) is None
