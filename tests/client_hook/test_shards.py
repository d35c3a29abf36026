"""``shards``: two ranks' shares, reduced here by hand (a sum and a max), read back as the whole."""

from __future__ import annotations

import math

import pytest
import torch

from ampscope.histogram import NUM_BINS, exponent_histogram
from ampscope.reductions import GradStats
from ampscope.shards import RANK_ROWS, Layout, empty_share, nonfinite_layers, pack, unpack

F64 = torch.float64


def reduce(shares: list[tuple[list[torch.Tensor], torch.Tensor, torch.Tensor | None]]
           ) -> tuple[list[float], list[float]]:
    """What SUM and MAX all-reduces leave in every rank's buffers."""
    sums = torch.stack([s for _, s, _ in shares]).sum(0).tolist()
    maxes = ([] if shares[0][2] is None
             else torch.stack([m for _, _, m in shares if m is not None]).amax(0).tolist())
    return sums, maxes


@pytest.fixture
def full() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(7, 5, generator=gen), torch.randn(3, generator=gen) * 1e-6,
             torch.zeros(4, 2)]
    grads[0][6, 4] = 0.0
    return grads


def pieces(full: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """FSDP2's Shard(0) split of every gradient over two ranks (the second may be empty)."""
    return [[g[: (g.shape[0] + 1) // 2] for g in full], [g[(g.shape[0] + 1) // 2 :] for g in full]]


class TestSharded:
    def test_partials_and_histogram_merge_into_the_full_gradients(
            self, full: list[torch.Tensor]) -> None:
        layout = Layout(3, 2, sharded=True, stats=True, histogram_bins=NUM_BINS)
        shares = []
        for rank, grads in enumerate(pieces(full)):
            table, _ = GradStats("fp16").partials(grads, 1024.0, True)
            counts = exponent_histogram(grads, 1024.0, [True] * 3, None)
            shares.append(pack([table, counts], layout, rank, torch.tensor(0.5 + rank, dtype=F64)))
        assert [len(kept) for kept, _, _ in shares] == [0, 0]
        assert [s.numel() for _, s, _ in shares] == [layout.sum_size] * 2
        sums, maxes = reduce(shares)
        got = unpack([], sums, maxes, layout)
        want_table, _ = GradStats("fp16").partials(full, 1024.0, True)
        want_counts = exponent_histogram(full, 1024.0, [True] * 3, None)
        n = 8 * 3
        assert got.parts is not None and got.complete
        assert got.parts[:n] == pytest.approx(want_table.reshape(-1).tolist(), rel=1e-12)
        assert got.parts[n:] == want_counts.reshape(-1).tolist()
        assert (got.losses, got.nonfinite) == ([0.5, 1.5], [0, 0])

    def test_norms_merge_as_the_root_of_summed_squares(self, full: list[torch.Tensor]) -> None:
        layout = Layout(3, 2, sharded=True, stats=False)
        shares = [pack([GradStats().raw_norms(g)], layout, r, None)
                  for r, g in enumerate(pieces(full))]
        sums, maxes = reduce(shares)
        assert maxes == []
        got = unpack([], sums, maxes, layout)
        want = [torch.linalg.vector_norm(g.double()).item() for g in full]
        assert got.parts == pytest.approx(want, rel=1e-6)
        assert got.losses == [None, None]  # no loss recorded: share 1

    def test_a_non_finite_shard_makes_its_layer_non_finite(self, full: list[torch.Tensor]
                                                           ) -> None:
        full[1][2] = math.inf  # on rank 1's piece
        layout = Layout(3, 2, sharded=True, stats=False)
        shares = [pack([GradStats().raw_norms(g)], layout, r, None)
                  for r, g in enumerate(pieces(full))]
        got = unpack([], *reduce(shares), layout)
        assert got.parts is not None and got.parts[1] == math.inf
        assert got.nonfinite == [0, 1]

    def test_a_missing_share_makes_the_parts_unknown(self, full: list[torch.Tensor]) -> None:
        layout = Layout(3, 2, sharded=True, stats=True)
        table, _ = GradStats("fp16").partials(pieces(full)[0], 1.0, False)
        mine = pack([table], layout, 0, torch.tensor(2.0, dtype=F64))
        sums, maxes = empty_share(layout.sum_size, layout.max_size, torch.device("cpu"))
        assert maxes is not None and maxes.tolist() == [-math.inf] * 6
        got = unpack([], *reduce([mine, ([], sums, maxes)]), layout)
        assert (got.parts, got.complete) == (None, False)
        assert (got.losses, got.nonfinite) == ([2.0, None], [0, None])


class TestReplicated:
    def test_the_parts_stay_rank_zeros_and_each_loss_its_own_column(self) -> None:
        norms = torch.tensor([1.0, math.nan, 2.0])
        layout = Layout(3, 3, sharded=False, stats=False)
        assert layout.sum_size == RANK_ROWS * 3 and layout.max_size == 0
        shares = [pack([norms], layout, r, torch.tensor(x, dtype=F64))
                  for r, x in enumerate([0.25, math.nan, math.inf])]
        assert all(kept[0] is norms for kept, _, _ in shares)
        sums, maxes = reduce(shares)
        got = unpack([1.0, math.nan, 2.0], sums, maxes, layout)
        assert got.parts is not None and got.parts[0] == 1.0 and math.isnan(got.parts[1])
        # NaN on rank 1 stays in column 1: 0.25 and inf are rank 0's and rank 2's own.
        assert got.losses[0] == 0.25 and math.isnan(got.losses[1] or 0.0)
        assert got.losses[2] == math.inf
        assert got.nonfinite == [1, 1, 1]
        assert got.complete

    def test_a_missing_share_keeps_rank_zeros_parts(self) -> None:
        layout = Layout(1, 2, sharded=False, stats=False)
        _, mine, _ = pack([torch.tensor([3.0])], layout, 0, None)
        sums, _ = empty_share(layout.sum_size, 0, torch.device("cpu"))
        got = unpack([3.0], *reduce([([], mine, None), ([], sums, None)]), layout)
        assert (got.parts, got.complete, got.losses, got.nonfinite) == (
            [3.0], False, [None, None], [0, None])


def test_nonfinite_layers_counts_layers_not_elements() -> None:
    table, _ = GradStats("fp16").partials(
        [torch.tensor([math.nan, math.nan]), torch.tensor([1.0]), torch.tensor([math.inf])],
        1.0, False)
    assert nonfinite_layers([table], stats=True).item() == 2
    assert nonfinite_layers([torch.tensor([1.0, math.inf, math.nan])], stats=False).item() == 2
