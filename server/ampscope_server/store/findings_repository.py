"""Repository: the bounded reads of a run's findings snapshot (`findings.reads`) and of the
exponent histograms for the "what if x k" view. Functions take a Session and never commit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from sqlalchemy import (
    Select,
    func,
    select,
    text,
    union,
)
from sqlalchemy.orm import Session

from ampscope_server.store import stat_packing, steps_repository
from ampscope_server.store.models import (
    STEP_IS_NOTABLE,
    Histogram,
    LayerStat,
    MisuseEvent,
    Step,
    StepRecheck,
    StepShadow,
    SwallowedStat,
)
from ampscope_server.store.sql_support import run_key

_FINDINGS_COLUMNS = (
    Step.id, Step.step, Step.scale_before, Step.scale_before_class, Step.scale_after,
    Step.scale_after_class, Step.found_inf, Step.skipped, Step.loss, Step.loss_class,
    Step.grad_norm, Step.grad_norm_class, Step.lr, Step.lr_class, Step.growth_tracker)


def steps_between(session: Session, run_id: str, first: int, last: int) -> list[tuple[Any, ...]]:
    """The step rows of `findings_steps` for the steps first…last (inclusive)."""
    rows = session.execute(
        select(*_FINDINGS_COLUMNS)
        .where(Step.run_key == run_key(run_id), Step.step.between(first, last))
        .order_by(Step.step, Step.id))
    return [tuple(row) for row in rows]


def layer_stat_step_at(session: Session, run_id: str, step: int) -> int | None:
    """Id of the run's first step at or after `step` that carries layer statistics: walks the
    step index forward from `step` and stops at the first hit (a cadence's worth of probes)."""
    has_stats = select(LayerStat.step_id).where(LayerStat.step_id == Step.id).exists()
    found = session.scalar(
        select(Step.id).where(Step.run_key == run_key(run_id), Step.step >= step, has_stats)
        .order_by(Step.step, Step.id).limit(1))
    return None if found is None else int(found)


# --- findings (finding_reads): bounded reads of a run's snapshot -------------------------------

def findings_steps(session: Session, run_id: str, every_step: bool) -> list[tuple[Any, ...]]:
    """(id, step, scale_before, class, scale_after, class, found_inf, skipped, loss, class,
    grad_norm, class, lr, class, growth_tracker) by step then ingest order.

    With `every_step` False only the steps the detectors read (`findings_steps_statement`):
    O(events) rows, read from indexes, not O(steps).
    """
    return [tuple(row) for row in session.execute(findings_steps_statement(run_id, every_step))]


def findings_steps_statement(run_id: str, every_step: bool) -> Select[Unpack[tuple[Any, ...]]]:
    """`findings_steps`' query. The notable steps (skipped or `found_inf`, scale changed, loss
    or grad norm non-finite) come from their partial index (revision 0017: the condition
    `models.STEP_IS_NOTABLE` as written), the step after each skipped one (did the LR move?)
    and the run's first and last step by the (run_key, step) index: one OR over all of them
    made both dialects filter every step of the run, ~1M rows for each live analysis."""
    key = run_key(run_id)
    if every_step:
        return select(*_FINDINGS_COLUMNS).where(Step.run_key == key).order_by(Step.step, Step.id)
    notable = text(f"({STEP_IS_NOTABLE})")
    after_skip = select(Step.step + 1).where(Step.run_key == key, notable,
                                             Step.skipped.is_(True))
    first = select(func.min(Step.step)).where(Step.run_key == key).scalar_subquery()
    last = select(func.max(Step.step)).where(Step.run_key == key).scalar_subquery()
    rows = union(  # UNION, not ALL: a step in two parts (a skip after a skip) comes once
        select(*_FINDINGS_COLUMNS).where(Step.run_key == key, notable),
        select(*_FINDINGS_COLUMNS).where(Step.run_key == key, Step.step.in_(after_skip)),
        select(*_FINDINGS_COLUMNS).where(Step.run_key == key, Step.step.in_([first, last])),
    ).subquery()
    return select(rows).order_by(rows.c.step, rows.c.id)


def steps_at_edges(session: Session, run_id: str, limit: int) -> list[tuple[Any, ...]]:
    """The step rows of `findings_steps` for the run's first and last `limit` steps, by step
    then ingest order: two walks of the (run_key, step) index, at most 2 x `limit` rows (the
    run's healthy start and where it is now, for `findings.divergence`)."""
    key = run_key(run_id)
    rows: dict[int, tuple[Any, ...]] = {}
    for order in ((Step.step, Step.id), (Step.step.desc(), Step.id.desc())):
        for row in session.execute(
                select(*_FINDINGS_COLUMNS).where(Step.run_key == key).order_by(*order)
                .limit(limit)):
            rows[int(row[0])] = tuple(row)
    return sorted(rows.values(), key=lambda row: (int(row[1]), int(row[0])))


def layer_stat_steps_last(
    session: Session, run_id: str, limit: int, before_step: int | None = None
) -> list[int]:
    """Ids of the run's last `limit` steps that carry layer statistics (before `before_step`
    when given), newest first. Walks the step index backwards and stops after `limit` hits."""
    has_stats = select(LayerStat.step_id).where(LayerStat.step_id == Step.id).exists()
    statement = select(Step.id).where(Step.run_key == run_key(run_id), has_stats)
    if before_step is not None:
        statement = statement.where(Step.step < before_step).order_by(Step.step.desc(),
                                                                      Step.id.desc())
    else:
        statement = statement.order_by(Step.id.desc())
    return [int(step_id) for step_id in session.scalars(statement.limit(limit))]


def layer_stat_steps_all(session: Session, run_id: str) -> list[tuple[int, int]]:
    """(id, step) of every step of the run that carries layer statistics, by step: one light
    row per layer-stat step (a tenth of the steps at the default cadence)."""
    has_stats = select(LayerStat.step_id).where(LayerStat.step_id == Step.id).exists()
    rows = session.execute(
        select(Step.id, Step.step).where(Step.run_key == run_key(run_id), has_stats)
        .order_by(Step.step, Step.id))
    return [(int(step_id), int(step)) for step_id, step in rows]


def layer_samples_at(session: Session, step_ids: Sequence[int]) -> list[tuple[Any, ...]]:
    """(step id, step, scale_before, class, layer index, amax, amin_nz, zero_frac,
    subnormal_frac, underflow_frac, nan_count, inf_count, l2) at the given steps."""
    if not step_ids:
        return []
    rows = session.execute(
        select(Step.id, Step.step, Step.scale_before, Step.scale_before_class, LayerStat.data)
        .join(LayerStat, LayerStat.step_id == Step.id)
        .where(Step.id.in_(list(step_ids)))
        .order_by(Step.step, Step.id))
    return [
        (step_id, step, scale, scale_cls, index, *values)
        for step_id, step, scale, scale_cls, data in rows
        for index, values in enumerate(zip(*stat_packing.unpack(data), strict=True))
    ]


def swallowed_last(
    session: Session, run_id: str, limit: int
) -> list[tuple[int, int, float | None]]:
    """(step, layer index, fraction) at the run's last `limit` steps (ingest order) that carry
    swallowed fractions."""
    has_rows = select(SwallowedStat.step_id).where(SwallowedStat.step_id == Step.id).exists()
    last = (select(Step.id).where(Step.run_key == run_key(run_id), has_rows)
            .order_by(Step.id.desc()).limit(limit))
    rows = session.execute(
        select(Step.step, SwallowedStat.data)
        .join(SwallowedStat, SwallowedStat.step_id == Step.id)
        .where(Step.id.in_(last))
        .order_by(Step.step, Step.id))
    return [(int(step), index, frac) for step, data in rows
            for index, frac in enumerate(steps_repository.swallowed_fractions(data))]


def rechecks_first(
    session: Session, run_id: str, limit: int
) -> list[tuple[int, str, float | None, int, dict[str, Any] | None]]:
    """(step, status, FP32 loss, its class, forward origin) of the run's first `limit` FP32
    re-checks, in step order."""
    rows = session.execute(
        select(Step.step, StepRecheck.status, StepRecheck.loss, StepRecheck.loss_class,
               StepRecheck.origin)
        .join(StepRecheck, StepRecheck.step_id == Step.id)
        .where(Step.run_key == run_key(run_id)).order_by(Step.step, Step.id).limit(limit))
    return [(int(step), str(status), loss, int(cls), origin)
            for step, status, loss, cls, origin in rows]


def shadows_last(
    session: Session, run_id: str, limit: int
) -> list[tuple[int, float | None, int, bytes]]:
    """(step, FP32 loss, its class, packed rel_err and cosine) of the run's last `limit` FP32
    shadow steps that ran (ingest order), in step order."""
    last = (select(Step.id).join(StepShadow, StepShadow.step_id == Step.id)
            .where(Step.run_key == run_key(run_id), StepShadow.data.is_not(None))
            .order_by(Step.id.desc()).limit(limit))
    rows = session.execute(
        select(Step.step, StepShadow.loss, StepShadow.loss_class, StepShadow.data)
        .join(StepShadow, StepShadow.step_id == Step.id)
        .where(Step.id.in_(last))
        .order_by(Step.step, Step.id))
    return [(int(step), loss, int(cls), bytes(data)) for step, loss, cls, data in rows
            if data is not None]


def misuse_first(session: Session, run_id: str, limit: int) -> list[tuple[int, str, str]]:
    """(step, kind, detail) of the run's first `limit` misuse events, in step order."""
    rows = session.execute(
        select(Step.step, MisuseEvent.kind, MisuseEvent.detail)
        .join(MisuseEvent, MisuseEvent.step_id == Step.id)
        .where(Step.run_key == run_key(run_id))
        .order_by(Step.step, Step.id, MisuseEvent.position).limit(limit))
    return [(int(step), str(kind), str(detail)) for step, kind, detail in rows]


def misuse_totals(session: Session, run_id: str) -> list[tuple[str, int, int, int]]:
    """(kind, steps, first step, last step) per misuse kind of the run: exact counts beyond
    the first events `misuse_first` reads (a misuse on every step of a long run)."""
    rows = session.execute(
        select(MisuseEvent.kind, func.count(func.distinct(Step.step)), func.min(Step.step),
               func.max(Step.step))
        .join(MisuseEvent, MisuseEvent.step_id == Step.id)
        .where(Step.run_key == run_key(run_id)).group_by(MisuseEvent.kind)
        .order_by(MisuseEvent.kind))
    return [(str(kind), int(n), int(first), int(last)) for kind, n, first, last in rows]


# --- exponent histograms for the "what if x k" view (finding_reads.histogram_read) ----------------
def histogram_steps_last(
    session: Session, run_id: str, limit: int
) -> list[tuple[int, int, float | None, int]]:
    """(step id, step, scale_before, its class) of the run's last `limit` steps that carry an
    exponent histogram, newest first."""
    has_histogram = select(Histogram.step_id).where(Histogram.step_id == Step.id).exists()
    rows = session.execute(
        select(Step.id, Step.step, Step.scale_before, Step.scale_before_class)
        .where(Step.run_key == run_key(run_id), has_histogram)
        .order_by(Step.step.desc(), Step.id.desc()).limit(limit))
    return [(int(i), int(step), scale, int(cls)) for i, step, scale, cls in rows]
