"""`formats_repository` on both dialects: the thinning in SQL keeps exactly the rows
`format_packing.thinned` names (so a read returns at most `limit` rows, a deterministic count),
the sampled step at or before a step (the later of equal steps), a trend's cut of each kept row
at the offsets the row's own layers and recipes give (the block scale exponents' too), and the
bytes a 100-layer, 6-recipe step costs (DESIGN.md §8: about 8 bytes per value)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.store import format_packing, formats_repository
from ampscope_server.store.format_packing import OPERANDS, thinned
from tests.server.wire import (
    RECIPES,
    batch,
    batch_v2,
    format_values,
    formats,
    new_id,
    record_v2,
    scale_values,
)
from tests.support.ingest import ingest_payload

SAMPLED = 23


def _sampled_run(sessions: sessionmaker[Session], steps: list[int],
                 blocks: Mapping[int, dict[str, Any] | None] | None = None,
                 run_id: str | None = None,
                 **kwargs: Any) -> str:
    """A run with one record per step of `steps` (seq = position), each a sampled step with
    `formats([0, 1], seed=step, scales=True)` unless `blocks` gives its own (None: not
    sampled)."""
    run_id = run_id or new_id()
    blocks = blocks or {}
    records = []
    for seq, step in enumerate(steps):
        record = record_v2(seq, step=step, with_layers=False)
        block = blocks.get(step, formats([0, 1], seed=float(step), scales=True))
        if block is not None:
            record["formats"] = block
        records.append(record)
    ingest_payload(sessions, dict(batch_v2(records, run_id=run_id, **kwargs), schema_version=8))
    return run_id


@pytest.fixture
def long_run(sessions: sessionmaker[Session]) -> str:
    """SAMPLED sampled steps 0, 100, …, with an unsampled step between each two."""
    steps = [s for k in range(SAMPLED) for s in (100 * k, 100 * k + 50)][:-1]
    return _sampled_run(sessions, steps, {s: None for s in steps if s % 100})


class TestSampledSteps:
    @pytest.mark.parametrize("limit", [2, 3, 4, 5, 7, 22, 23, 24, 500])
    def test_the_rows_kept_are_the_rules(self, sessions: sessionmaker[Session], long_run: str,
                                         limit: int) -> None:
        with sessions() as session:
            sampled = formats_repository.sampled_steps(session, long_run, limit)
        assert sampled.count == SAMPLED
        assert len(sampled.steps) == min(SAMPLED, limit)  # the rows read
        assert [step for _, step in sampled.steps] == [
            100 * p for p in thinned(SAMPLED, limit)]
        assert sampled.steps[0][1] == 0 and sampled.steps[-1][1] == 100 * (SAMPLED - 1)

    def test_one_and_none(self, sessions: sessionmaker[Session]) -> None:
        one = _sampled_run(sessions, [7])
        none = _sampled_run(sessions, [0, 1], {0: None, 1: None})
        with sessions() as session:
            assert formats_repository.sampled_steps(session, one, 2).steps[0][1] == 7
            assert formats_repository.sampled_steps(session, none, 2) == (
                formats_repository.Sampled(0, []))
            assert formats_repository.sampled_steps(session, new_id(), 2).count == 0


class TestFormatsUpTo:
    @pytest.mark.parametrize(("asked", "found"), [
        (None, 2200), (10**12, 2200), (2200, 2200), (1099, 1000), (1100, 1100), (150, 100),
        (0, 0)])
    def test_the_sampled_step_at_or_before(self, sessions: sessionmaker[Session],
                                           long_run: str, asked: int | None, found: int
                                           ) -> None:
        with sessions() as session:
            rows = formats_repository.formats_up_to(session, long_run, asked, 1)
        assert [row.step for row in rows] == [found]

    def test_the_last_few_latest_first(self, sessions: sessionmaker[Session],
                                       long_run: str) -> None:
        with sessions() as session:
            assert [row.step for row in formats_repository.formats_up_to(
                session, long_run, 1099, 3)] == [1000, 900, 800]
            assert [row.step for row in formats_repository.formats_up_to(
                session, long_run, 150, 3)] == [100, 0]

    def test_none_before_the_first(self, sessions: sessionmaker[Session]) -> None:
        run_id = _sampled_run(sessions, [5, 10])
        with sessions() as session:
            assert formats_repository.formats_up_to(session, run_id, 4, 3) == []
            assert formats_repository.formats_up_to(session, new_id(), None, 3) == []

    def test_of_equal_steps_the_later_ingested(self, sessions: sessionmaker[Session]) -> None:
        """A resumed attempt samples step 100 again: that one is shown."""
        run_id = _sampled_run(sessions, [0, 100])
        again = record_v2(0, step=100, with_layers=False, formats=formats([1], seed=9.0))
        ingest_payload(sessions, dict(batch_v2([again], run_id=run_id,
                                               attempt_id=new_id()), schema_version=7))
        with sessions() as session:
            row = formats_repository.formats_up_to(session, run_id, 100, 1)[0]
            assert (row.step, row.layers) == (100, "1")
            assert [step for _, step in formats_repository.sampled_steps(
                session, run_id, 10).steps] == [0, 100, 100]


class TestTrendRows:
    @pytest.mark.parametrize("limit", [2, 5, 500])
    def test_one_cut_per_kept_row(self, sessions: sessionmaker[Session], long_run: str,
                                  limit: int) -> None:
        with sessions() as session:
            count, rows = formats_repository.trend_rows(session, long_run, limit, 1,
                                                        OPERANDS.index("grad_output"),
                                                        "fp8_rowwise")
        kept = thinned(SAMPLED, limit)
        assert (count, len(rows)) == (SAMPLED, len(kept))  # the rows read
        for row, position in zip(rows, kept, strict=True):
            values, operands = format_values([0, 1], RECIPES[:2], seed=100.0 * position)
            at = format_packing.value_at(1, 2, 1, 2) // 8
            assert format_packing.unpack(row.values) == values[at:at + 5]
            at = format_packing.operand_at(1, 2, 2, 2) // 8 - len(values)
            assert format_packing.unpack(row.operands) == operands[at:at + 4]
            exponents = scale_values([0, 1], RECIPES[:2], seed=100 * position)
            at = format_packing.scales_at(1, 2, 1, 2) // 8
            assert row.scales is not None
            assert format_packing.unpack(row.scales) == exponents[at:at + 17]

    def test_each_row_by_its_own_layers_and_recipes(self, sessions: sessionmaker[Session]
                                                    ) -> None:
        """Rows list different layers and recipes in different orders; one lacks the layer,
        one the recipe: left out, the count unchanged."""
        blocks = {
            0: formats([0, 1], ["fp8_tensorwise", "mxfp8"], seed=0.0),
            1: formats([1, 0], ["nvfp4", "mxfp8", "mxfp4"], seed=10.0),
            2: formats([0], ["mxfp8"], seed=20.0),
            3: formats([1], ["nvfp4"], seed=30.0),
            4: formats([1], ["mxfp8"], seed=40.0),
        }
        run_id = _sampled_run(sessions, list(blocks), blocks)
        with sessions() as session:
            count, rows = formats_repository.trend_rows(session, run_id, 500, 1,
                                                        OPERANDS.index("weight"), "mxfp8")
        assert count == 5
        assert [row.step for row in rows] == [0, 1, 4]
        # Layer 1 is position 1, 0, 0; mxfp8 is recipe 1, 1, 0 of 2, 3, 1.
        for row, (position, recipe, seed) in zip(rows, [(1, 1, 0.0), (0, 1, 10.0),
                                                        (0, 0, 40.0)], strict=True):
            expected = [seed + position + 1 / 10 + recipe / 100 + s / 1000 for s in range(5)]
            assert format_packing.unpack(row.values) == expected
            assert format_packing.unpack(row.operands) == [
                seed + position + 1 / 10 + k / 100 + 0.5 for k in range(4)]

    def test_a_layer_or_recipe_never_recorded(self, sessions: sessionmaker[Session],
                                              long_run: str) -> None:
        with sessions() as session:
            for layer, recipe in ((7, "fp8_rowwise"), (1, "nvfp4"), (1, "fp8_row")):
                assert formats_repository.trend_rows(session, long_run, 500, layer, 0,
                                                     recipe) == (SAMPLED, [])


LAYERS_100: list[dict[str, Any]] = [
    {"index": i, "name": f"blocks.{i}.weight", "shape": [8, 8], "dtype": "float32",
     "numel": 64, "module_type": "Linear"} for i in range(100)]


@pytest.mark.parametrize(("scales", "per_value"), [(False, 8.036), (True, 8.009)],
                         ids=["v7", "v8"])
def test_a_100_layer_6_recipe_step_costs_8_04_bytes_per_value(
    sessions: sessionmaker[Session], scales: bool, per_value: float
) -> None:
    """The stored row of a 100-layer, 6-recipe step: 10,200 float64s (9,000 values, 1,200
    operand statistics) in 81,600 bytes, its layers and recipes as text (289 + 57 bytes), the
    step id, step and run key (8 + 8 + 4): 81,966 bytes, 8.036 per value on both dialects; with
    v8's block scale exponents 30,600 float64s more (244,800 bytes): 326,766 bytes, 8.009 per
    value. As each database keeps the row: SQLite's record (`dbstat`'s payload) and Postgres'
    row value (`pg_column_size`, the blobs stored uncompressed) within 8.1 too."""
    record = record_v2(0, with_layers=False,
                       formats=formats(list(range(100)), RECIPES, scales=scales))
    ingest_payload(sessions, dict(batch([record], run_id=new_id(), layers=LAYERS_100),
                                  schema_version=8 if scales else 7))
    exponents = format_packing.scales_count(100, 6) if scales else 0
    values = format_packing.values_count(100, 6) + format_packing.operands_count(100) + exponents
    with sessions() as session:
        (data, layers, recipes, stored_scales), = session.execute(text(
            "SELECT length(data), length(layers), length(recipes), length(scales) "
            "FROM step_formats")).all()
        assert (values - exponents, data, layers, recipes) == (10_200, 81_600, 289, 57)
        assert stored_scales == (244_800 if scales else None)
        row = data + (stored_scales or 0) + layers + recipes + 8 + 8 + 4
        assert row / values == pytest.approx(per_value, abs=1e-3)
        if session.get_bind().dialect.name == "sqlite":
            stored = session.scalar(text(
                "SELECT sum(payload) FROM dbstat WHERE name = 'step_formats'"))
        else:
            stored = session.scalar(text("SELECT pg_column_size(f.*) FROM step_formats f"))
        assert stored is not None and row - 64 <= stored <= 8.1 * values
