"""Reading runs back: summaries, details, steps (with their layer statistics), export.

The export carries everything stored, wire v2 fields included (null where not measured).

Status is derived here: a stored `active` run whose last ingest is older than the crash timeout
reads as `crashed`.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from sqlalchemy import Row
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server import codec, diagnosis, repository, series
from ampscope_server.errors import RunNotFound
from ampscope_server.formats import FORMATS, FloatFormat
from ampscope_server.models import (
    CLASSED_ACTIVATION_STATS,
    CLASSED_STEP_FLOATS,
    CLIENT_FIELDS,
    LAYER_STAT_NAMES,
    Attempt,
    Run,
    Step,
    StepRecheck,
)
from ampscope_server.principal import ANONYMOUS, Principal
from ampscope_server.schemas import (
    ActivationStatsRead,
    AttemptRead,
    ClientAccounting,
    HistogramRead,
    LayerInfo,
    LayerStatsRead,
    MisuseRead,
    NonfiniteLayerRead,
    RecheckRead,
    RunDetail,
    RunStatus,
    RunSummary,
    StepExport,
    StepFull,
    StepScalars,
    StepsPage,
    WorstLayer,
)


def derive_status(stored: str, updated_at: float, now: float, crash_timeout_s: float) -> RunStatus:
    if stored == RunStatus.ACTIVE.value and now - updated_at > crash_timeout_s:
        return RunStatus.CRASHED
    return RunStatus(stored)


RUN_ID_MAX = 64


def plausible_id(run_id: str) -> bool:
    """Whether a run could have this id: Postgres refuses a NUL in a query parameter."""
    return len(run_id) <= RUN_ID_MAX and "\x00" not in run_id


def load_run(session: Session, run_id: str, viewer: Principal = ANONYMOUS) -> Run:
    """The run, or RunNotFound: also for an id no run can have (too long, NUL) and for a run of
    a project `viewer` cannot see, so another project's run ids are not confirmed to exist."""
    if not plausible_id(run_id):
        raise RunNotFound(run_id[:RUN_ID_MAX].replace("\x00", "\\0"))
    run = repository.get_run(session, run_id)
    if run is None or not viewer.sees(run.project):
        raise RunNotFound(run_id)
    return run


def summaries(
    session: Session, runs: Sequence[Run], crash_timeout_s: float, now: float | None = None
) -> list[RunSummary]:
    now = time.time() if now is None else now
    ids = [run.id for run in runs]
    aggregates = repository.step_aggregates(session, ids)
    layer_counts = repository.count_layers(session, ids)
    last_ids = [agg[3] for agg in aggregates.values() if agg[3] is not None]
    scales = repository.last_scales(session, last_ids)
    worst = _worst_layers_of(session, runs)
    top = diagnosis.top_findings(session, runs)
    result = []
    for run in runs:
        num_steps, last_step, skipped, last_id = aggregates.get(run.id, (0, None, 0, None))
        scale = scales.get(run.id)
        worst_underflow, worst_headroom = worst.get(run.id, (None, None))
        result.append(RunSummary(
            id=run.id, project=run.project, name=run.name, tags=run.tags,
            status=derive_status(run.status, run.updated_at, now, crash_timeout_s),
            created_at=run.created_at, updated_at=run.updated_at,
            num_steps=num_steps, last_step=last_step, last_id=last_id,
            last_scale=None if scale is None else codec.from_storage(*scale),
            skipped_steps=skipped, num_layers=layer_counts.get(run.id, 0),
            skip_rate=skipped / num_steps if num_steps else None,
            worst_underflow=worst_underflow, worst_headroom=worst_headroom,
            top_finding=top.get(run.id),
        ))
    return result


LayerAtStep = tuple[str, float, float, float | None]
"""(name, zero_frac, underflow_frac, amax) of one layer at one step."""


def worst_layers(
    layers: Sequence[LayerAtStep], scale: float | None, fmt: FloatFormat
) -> tuple[tuple[str, float] | None, tuple[str, float] | None]:
    """(name, lost_frac) of the layer losing the largest share of its gradient and (name,
    headroom_bits) of the layer closest to overflow, among `layers` (in model order) at one step
    whose scale in effect was `scale`.

    Ties go to the first layer in model order. A layer whose amax is unknown (no finite element)
    has no headroom and is skipped; None when no layer qualifies.
    """
    underflow: tuple[str, float] | None = None
    headroom: tuple[str, float] | None = None
    for name, zero_frac, underflow_frac, amax in layers:
        lost = series.lost_frac(zero_frac, underflow_frac)
        if underflow is None or lost > underflow[1]:
            underflow = (name, lost)
        bits = series.headroom_bits(amax, scale, fmt)
        if bits is not None and (headroom is None or bits < headroom[1]):
            headroom = (name, bits)
    return underflow, headroom


def _worst_layers_of(
    session: Session, runs: Sequence[Run]
) -> dict[str, tuple[WorstLayer | None, WorstLayer | None]]:
    """Each run's worst layers at its last layer-stat step (two bounded queries for all runs)."""
    step_ids = repository.last_layer_stat_steps(session, [run.id for run in runs])
    by_run: dict[str, tuple[float | None, list[LayerAtStep]]] = {}
    for run_id, scale, scale_cls, _, name, zero, under, amax in repository.named_layer_stats(
        session, step_ids.values()
    ):
        entry = by_run.setdefault(run_id, (codec.from_storage(scale, scale_cls), []))
        entry[1].append((name, zero, under, amax))
    formats = {run.id: run.target_format for run in runs}
    result: dict[str, tuple[WorstLayer | None, WorstLayer | None]] = {}
    for run_id, (scale, layers) in by_run.items():
        underflow, headroom = worst_layers(layers, scale, FORMATS[formats[run_id]])
        result[run_id] = (_worst(underflow), _worst(headroom))
    return result


def _worst(found: tuple[str, float] | None) -> WorstLayer | None:
    return None if found is None else WorstLayer(layer=found[0], value=found[1])


def list_summaries(session: Session, crash_timeout_s: float, viewer: Principal = ANONYMOUS
                   ) -> list[RunSummary]:
    return summaries(session, repository.list_runs(session, viewer.project), crash_timeout_s)


def detail(session: Session, run: Run, crash_timeout_s: float) -> RunDetail:
    summary = summaries(session, [run], crash_timeout_s)[0]
    attempts = [
        AttemptRead(ordinal=a.ordinal, id=a.id, pid=a.pid, started_at=a.started_at,
                    client=_client(a))
        for a in repository.list_attempts(session, run.id)
    ]
    return RunDetail(
        **summary.model_dump(), config=run.config, host=run.host, rank=run.rank,
        target_format=run.target_format, attempts=attempts,
    )


def _client(attempt: Attempt) -> ClientAccounting | None:
    if attempt.client_produced is None:
        return None
    return ClientAccounting.model_validate(
        {name: getattr(attempt, f"client_{name}") for name in CLIENT_FIELDS}
    )


def layers(session: Session, run: Run) -> list[LayerInfo]:
    return [LayerInfo.model_validate(layer) for layer in repository.get_layers(session, run.id)]


def _scalars(step: Step, ordinal: int) -> dict[str, object]:
    values: dict[str, object] = {
        "id": step.id, "attempt": ordinal, "seq": step.seq, "step": step.step,
        "wall_time": step.wall_time, "growth_tracker": step.growth_tracker,
        "found_inf": step.found_inf, "skipped": step.skipped,
    }
    for name in CLASSED_STEP_FLOATS:
        values[name] = codec.from_storage(getattr(step, name), getattr(step, f"{name}_class"))
    return values


def steps_page(session: Session, run: Run, after_id: int, limit: int) -> StepsPage:
    rows = repository.steps_after(session, run.id, after_id, limit)
    steps = [StepScalars.model_validate(_scalars(step, ordinal)) for step, ordinal in rows]
    return StepsPage(steps=steps, last_id=steps[-1].id if steps else after_id)


def _with_layers(session: Session, rows: Sequence[Row[Step, int]]) -> list[dict[str, object]]:
    """The scalars of each (step, ordinal) row plus its per-layer statistics (or None)."""
    stats: dict[int, dict[str, list[object]]] = {}
    for stat in repository.layer_stats_of(session, [step.id for step, _ in rows]):
        arrays = stats.setdefault(stat.step_id, {name: [] for name in LAYER_STAT_NAMES})
        for name in LAYER_STAT_NAMES:
            arrays[name].append(getattr(stat, name))
    return [
        {
            **_scalars(step, ordinal),
            "layers": (
                LayerStatsRead.model_validate(stats[step.id]) if step.id in stats else None
            ),
        }
        for step, ordinal in rows
    ]


def full_steps(session: Session, run_id: str, after_id: int, limit: int) -> list[StepFull]:
    """Steps with id > after_id and their per-layer statistics, in ingest order."""
    rows = repository.steps_after(session, run_id, after_id, limit)
    return [StepFull.model_validate(values) for values in _with_layers(session, rows)]


def _v2_fields(session: Session, steps: Sequence[Step]) -> dict[int, dict[str, object]]:
    """{step id: the wire v2 fields of the step}, each null when it was not measured."""
    ids = [step.id for step in steps]
    fields: dict[int, dict[str, object]] = {
        step.id: {
            "captured": step.captured,
            "nonfinite": None if step.nonfinite_count is None else [],
            "misuse": None if step.misuse_count is None else [],
            "activations": None,
            "histogram": None,
            "recheck": None,
            "swallowed": None,
        }
        for step in steps
    }
    for entry in repository.nonfinite_of(session, ids):
        nonfinite = fields[entry.step_id]["nonfinite"]
        assert isinstance(nonfinite, list)
        nonfinite.append(NonfiniteLayerRead.model_validate(
            {"layer": entry.layer_index, "kind": entry.kind}))
    for event in repository.misuse_of(session, ids):
        misuse = fields[event.step_id]["misuse"]
        assert isinstance(misuse, list)
        misuse.append(MisuseRead.model_validate({"kind": event.kind, "detail": event.detail}))
    activations: dict[int, dict[str, list[object]]] = {}
    for stat in repository.activation_stats_of(session, ids):
        arrays = activations.setdefault(stat.step_id, {name: [] for name in LAYER_STAT_NAMES})
        for name in LAYER_STAT_NAMES:
            value = getattr(stat, name)
            if name in CLASSED_ACTIVATION_STATS:
                value = codec.from_storage(value, getattr(stat, f"{name}_class"))
            arrays[name].append(value)
    for step_id, arrays in activations.items():
        fields[step_id]["activations"] = ActivationStatsRead.model_validate(arrays)
    histograms: dict[int, HistogramRead] = {}
    for row in repository.histograms_of(session, ids):
        histogram = histograms.setdefault(row.step_id, HistogramRead(
            min_exp=row.min_exp, max_exp=row.max_exp, counts=[]))
        histogram.counts.append(list(row.counts))
    for step_id, histogram in histograms.items():
        fields[step_id]["histogram"] = histogram
    for recheck in repository.rechecks_of(session, ids):
        fields[recheck.step_id]["recheck"] = recheck_read(recheck)
    swallowed: dict[int, list[float | None]] = {}
    for fraction in repository.swallowed_of(session, ids):
        swallowed.setdefault(fraction.step_id, []).append(fraction.frac)
    for step_id, fractions in swallowed.items():
        fields[step_id]["swallowed"] = fractions
    return fields


def recheck_read(row: StepRecheck) -> RecheckRead:
    return RecheckRead(
        status=row.status,  # type: ignore[arg-type]  # stored from the wire's Literal
        loss=codec.from_storage(row.loss, row.loss_class),
        layers=[NonfiniteLayerRead.model_validate(entry) for entry in row.layers],
        detail=row.detail,
    )


def export_steps(session: Session, run_id: str, after_id: int, limit: int) -> list[StepExport]:
    """Steps with id > after_id with everything stored for them, in ingest order."""
    rows = repository.steps_after(session, run_id, after_id, limit)
    extra = _v2_fields(session, [step for step, _ in rows])
    return [
        StepExport.model_validate({**values, **extra[step.id]})
        for values, (step, _) in zip(_with_layers(session, rows), rows, strict=True)
    ]


def live_update(
    factory: sessionmaker[Session], run_id: str, after_id: int, limit: int,
    crash_timeout_s: float, viewer: Principal = ANONYMOUS,
) -> tuple[list[StepFull], RunStatus] | None:
    """For the live socket, in its own short session: new steps and the run's status.

    None when the run does not exist (or is not `viewer`'s to see).
    """
    if not plausible_id(run_id):
        return None
    with factory() as session:
        run = repository.get_run(session, run_id)
        if run is None or not viewer.sees(run.project):
            return None
        status = derive_status(run.status, run.updated_at, time.time(), crash_timeout_s)
        return full_steps(session, run_id, after_id, limit), status


def live_summaries(
    factory: sessionmaker[Session], run_ids: Collection[str] | None, crash_timeout_s: float,
    viewer: Principal = ANONYMOUS,
) -> list[RunSummary]:
    """For the runs-list socket, in its own short session: the summaries of `run_ids` (the runs
    that exist among them), or of every run when None; only those `viewer` may see."""
    with factory() as session:
        found = (repository.list_runs(session, viewer.project) if run_ids is None
                 else repository.get_runs(session, run_ids, viewer.project))
        return summaries(session, found, crash_timeout_s)
