"""Reading wire v7's `formats` back as charts: what FP8/MX/NVFP4 recipes would do to each
sampled module's GEMM operands (`GET /api/runs/{id}/formats` and `/formats/trend`).

Both reads are bounded by `limit` sampled steps, whatever the run's length: the repository
keeps at most that many, spread evenly over the run with the first and the last among them,
and says how many there are (`sampled`, `downsampled`). Thinning is a stride: it can step over
a sampled step where one recipe went bad. The values are already samples (every
`formats_every` steps, 100 by default) and a run of 1M steps has 10,000 of them, so the bound
cuts in only past `limit` x `formats_every` steps; `downsampled` says when, and a narrower read
(`step=`) shows any one step whole. The list reads no blob; the matrix and the verdicts read
RECIPE_RECENT_SAMPLES rows; the trend reads 72 bytes of each kept row and 136 of its block scale
exponents (`formats_repository`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sqlalchemy.orm import Session

from ampscope_server.charts.schemas import (
    FormatLayerRead,
    FormatMatrixRead,
    FormatOperand,
    FormatsRead,
    FormatStepRead,
    FormatTrainedRead,
    FormatTrendRead,
    KeepRead,
    RecipeVerdictRead,
    ScaleExponentsRead,
)
from ampscope_server.findings import recipe_fit
from ampscope_server.findings.reads import formats_sample
from ampscope_server.findings.thresholds import RECIPE_RECENT_SAMPLES
from ampscope_server.store import format_packing, formats_repository, runs_repository
from ampscope_server.store.format_packing import FORMAT_STATS, OPERAND_STATS, OPERANDS
from ampscope_server.store.models import Run, StepFormats

DEFAULT_FORMAT_STEPS = 500
MAX_FORMAT_STEPS = 2000
"""The most sampled steps one read lists or charts."""


def formats_read(session: Session, run: Run, step: int | None, limit: int) -> FormatsRead:
    """The run's sampled steps (at most `limit`, ≥ 2), the full matrix of the one at or before
    `step` (None: the last) and each recipe's verdict as of it (`recipe_fit`, over it and the
    RECIPE_RECENT_SAMPLES - 1 before it)."""
    sampled = formats_repository.sampled_steps(session, run.id, limit)
    rows = formats_repository.formats_up_to(session, run.id, step, RECIPE_RECENT_SAMPLES)
    shapes = runs_repository.layer_shapes(session, run.id) if rows else []
    names = [name for name, _ in shapes]
    norms = frozenset(i for i, (_, shape) in enumerate(shapes) if len(shape) == 1)
    return FormatsRead(
        operand_names=list(OPERANDS), stat_names=list(FORMAT_STATS),
        operand_stat_names=list(OPERAND_STATS), sampled=sampled.count,
        downsampled=sampled.count > limit,
        steps=[FormatStepRead(id=step_id, step=number) for step_id, number in sampled.steps],
        matrix=matrix(rows[0], names) if rows else None,
        verdicts=[_verdict(v) for v in recipe_fit.verdicts(
            [formats_sample(row) for row in reversed(rows)], names, norms)],
    )


def _verdict(verdict: recipe_fit.RecipeVerdict) -> RecipeVerdictRead:
    return RecipeVerdictRead(
        recipe=verdict.recipe, step=verdict.step, measured=verdict.measured,
        summary=verdict.summary, grad_underflow=verdict.grad_underflow,
        uniform_loss=verdict.uniform_loss,
        keep=[_keep(name, reason) for name, reason in verdict.keep],
        norms_measured=verdict.norms_measured,
        norms=[_keep(name, reason) for name, reason in verdict.norms])


def _keep(name: str, reason: recipe_fit.KeepReason) -> KeepRead:
    return KeepRead(layer=name, operand=reason.operand, stat=reason.stat, value=reason.value,
                    median=reason.median, scale_min_frac=reason.scale_min_frac)


def matrix(row: StepFormats, layer_names: Sequence[str]) -> FormatMatrixRead:
    """One stored row as nested lists in the wire's order (`FormatMatrixRead`)."""
    unpacked = format_packing.unpack_row(row.recipes, row.layers, row.data)
    recipes, layers = unpacked.recipes, unpacked.layers
    stats, operand_stats = len(FORMAT_STATS), len(OPERAND_STATS)
    values = [[_rows(unpacked.values, (position * len(OPERANDS) + operand) * len(recipes) * stats,
                     len(recipes), stats) for operand in range(len(OPERANDS))]
              for position in range(len(layers))]
    operands = [_rows(unpacked.operands, position * len(OPERANDS) * operand_stats,
                      len(OPERANDS), operand_stats) for position in range(len(layers))]
    trained = None
    if row.trained is not None and row.trained_data is not None:
        amax, scale = format_packing.split_trained_data(row.trained_data)
        trained = FormatTrainedRead(
            recipes=format_packing.split_trained(row.trained),
            amax=_rows(amax, 0, len(layers), len(OPERANDS)),
            scale=_rows(scale, 0, len(layers), len(OPERANDS)))
    return FormatMatrixRead(
        id=row.step_id, step=row.step, recipes=recipes,
        layers=[FormatLayerRead(index=index, name=layer_names[index]) for index in layers],
        values=values, operands=operands, trained=trained)


def _rows(flat: Sequence[float | None], start: int, count: int, width: int
          ) -> list[list[float | None]]:
    """`count` rows of `width` values of `flat` from `start` on."""
    return [list(flat[start + i * width:start + (i + 1) * width]) for i in range(count)]


def trend_read(session: Session, run: Run, layer: int, operand: FormatOperand, recipe: str,
               limit: int) -> FormatTrendRead:
    """One (layer, operand, recipe) over the sampled steps `formats_read` keeps for `limit`,
    those that recorded the layer and the recipe."""
    count, rows = formats_repository.trend_rows(session, run.id, limit, layer,
                                                OPERANDS.index(operand), recipe)
    names = runs_repository.layer_names(session, run.id)
    values = [format_packing.unpack(row.values) for row in rows]
    operands = [format_packing.unpack(row.operands) for row in rows]
    scales = [None if row.scales is None else _scale_exponents(format_packing.unpack(row.scales))
              for row in rows]
    return FormatTrendRead(
        layer=layer, name=names[layer] if layer < len(names) else None, operand=operand,
        recipe=recipe, sampled=count, downsampled=count > limit,
        steps=[row.step for row in rows], ids=[row.step_id for row in rows],
        values={name: [cut[k] for cut in values] for k, name in enumerate(FORMAT_STATS)},
        operand_values={name: [cut[k] for cut in operands]
                        for k, name in enumerate(OPERAND_STATS)},
        scales=scales,
    )


def _scale_exponents(cut: Sequence[float]) -> ScaleExponentsRead | None:
    """One cut of `scales` (`SCALE_WIDTH` values, checked whole at ingest): None where all are
    NaN (not measured)."""
    top, counts = cut[0], cut[1:]
    if math.isnan(counts[0]):
        return None
    return ScaleExponentsRead(top=None if math.isnan(top) else int(top),
                              counts=[int(c) for c in counts])
