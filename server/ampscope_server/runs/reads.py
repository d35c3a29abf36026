"""Reading runs back: summaries, details, steps (with their layer statistics), export.

The export carries everything stored, wire v2 … v7 fields included (null where not measured; v6's
`shadow` and v7's `formats` left out where absent, as the hook sends them).

Status is derived here: a stored `active` run whose last ingest is older than the crash timeout
reads as `crashed`.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Row
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.access.principal import ANONYMOUS, Principal
from ampscope_server.errors import AmbiguousRun, RunNotFound
from ampscope_server.findings.formats import FORMATS
from ampscope_server.findings.schemas import FormatLimits
from ampscope_server.ingest.wire import ClientAccounting, LayerInfo
from ampscope_server.runs import listing as runs_list
from ampscope_server.runs import rank_reads, summary_cache
from ampscope_server.runs.listing import RunsQuery, crash_cutoff, derive_status
from ampscope_server.runs.schemas import (
    ActivationStatsRead,
    AttemptRead,
    FormatsExport,
    ForwardOriginRead,
    HistogramRead,
    LayerStatsRead,
    MisuseRead,
    NonfiniteLayerRead,
    RecheckRead,
    RunDetail,
    RunStatus,
    RunSummary,
    RunUpdate,
    ShadowRead,
    StepExport,
    StepLive,
    StepRead,
    StepsPage,
    TrainedExport,
)
from ampscope_server.store import (
    format_packing,
    run_counters_repository,
    runs_repository,
    stat_packing,
    steps_repository,
)
from ampscope_server.store.float_storage import from_storage
from ampscope_server.store.models import (
    CLASSED_ACTIVATION_STATS,
    CLASSED_STEP_FLOATS,
    CLIENT_FIELDS,
    LAYER_STAT_NAMES,
    Attempt,
    Run,
    RunCounters,
    Step,
    StepFormats,
    StepRecheck,
    StepShadow,
)

RUN_ID_MAX = 64
LIVE_ACTIVE_RUNS = 500
"""The most active runs a runs-list snapshot carries beyond its first page."""


def plausible_id(run_id: str) -> bool:
    """Whether a run could have this id: Postgres refuses a NUL in a query parameter."""
    return len(run_id) <= RUN_ID_MAX and "\x00" not in run_id


def load_run(session: Session, run_id: str, viewer: Principal = ANONYMOUS) -> Run:
    """The run, or RunNotFound: also for an id no run can have (too long, NUL) and for a run of
    a project `viewer` cannot see, so another project's run ids are not confirmed to exist."""
    if not plausible_id(run_id):
        raise RunNotFound(run_id[:RUN_ID_MAX].replace("\x00", "\\0"))
    run = runs_repository.get_run(session, run_id)
    if run is None or not viewer.sees(run.project):
        raise RunNotFound(run_id)
    return run


def summaries(
    session: Session, runs: Sequence[Run], crash_timeout_s: float, now: float | None = None,
    factory: sessionmaker[Session] | None = None,
    counters: Mapping[str, RunCounters] | None = None,
) -> list[RunSummary]:
    """The runs' summaries from their counters (read here unless given, as a runs-list page
    has them) and cached analyses (`summary_cache`): a bounded number of rows per run, never
    its steps. With `factory`, stale analyses beyond the few done here are refreshed in the
    background (and stored)."""
    now = time.time() if now is None else now
    ids = [run.id for run in runs]
    if counters is None:
        counters = run_counters_repository.counters_of(session, ids)
    layer_counts = runs_repository.count_layers(session, ids)
    analyses = summary_cache.current(session, runs, counters, factory)
    result = []
    for run in runs:
        row = counters.get(run.id)
        analysis = analyses[run.id]
        num_steps = 0 if row is None else row.num_steps
        skipped = 0 if row is None else row.skipped_steps
        result.append(RunSummary(
            id=run.id, project=run.project, name=run.name, tags=run.tags,
            status=derive_status(run.status, run.updated_at,
                                 crash_cutoff(now, crash_timeout_s)),
            created_at=run.created_at, updated_at=run.updated_at,
            num_steps=num_steps, last_step=None if row is None else row.last_step,
            last_id=None if row is None else row.last_id,
            last_scale=None if row is None else from_storage(row.last_scale,
                                                                   row.last_scale_class),
            skipped_steps=skipped, num_layers=layer_counts.get(run.id, 0),
            world_size=run.world_size,
            skip_rate=skipped / num_steps if num_steps else None,
            worst_underflow=analysis.underflow, worst_headroom=analysis.headroom,
            top_finding=analysis.top, summary_step=analysis.step, config=run.config,
            notes=run.notes,
        ))
    return result


@dataclass(frozen=True)
class SummaryPage:
    runs: list[RunSummary]
    next_cursor: str | None
    total: int | None
    active: list[RunSummary] = field(default_factory=list)
    """The runs-list snapshot only: the active runs beyond its first page (their status ages)."""


def list_page(
    session: Session, crash_timeout_s: float, query: RunsQuery, viewer: Principal = ANONYMOUS,
    factory: sessionmaker[Session] | None = None, now: float | None = None,
) -> SummaryPage:
    """One page of the runs list (`runs_list.runs_page`), summarised."""
    now = time.time() if now is None else now
    found = runs_list.runs_page(session, query, viewer.project, crash_cutoff(now, crash_timeout_s))
    return SummaryPage(runs=summaries(session, found.runs, crash_timeout_s, now, factory,
                                      found.counters),
                       next_cursor=found.next_cursor, total=found.total)


def annotate(session: Session, run: Run, update: RunUpdate, crash_timeout_s: float) -> RunDetail:
    """Set what people wrote on the run (notes, tags; fields not given stay), then its detail."""
    runs_repository.set_run_annotations(session, run.id, update.model_dump(exclude_none=True))
    session.refresh(run)
    return detail(session, run, crash_timeout_s)


def detail(session: Session, run: Run, crash_timeout_s: float) -> RunDetail:
    summary = summaries(session, [run], crash_timeout_s)[0]
    attempts = [
        AttemptRead(ordinal=a.ordinal, id=a.id, pid=a.pid, started_at=a.started_at,
                    client=_client(a))
        for a in runs_repository.list_attempts(session, run.id)
    ]
    return RunDetail(
        **summary.model_dump(), host=run.host, rank=run.rank,
        target_format=run.target_format, target_format_reason=run.target_format_reason,
        target_format_limits=FormatLimits.of(FORMATS[run.target_format]), attempts=attempts,
    )


def _client(attempt: Attempt) -> ClientAccounting | None:
    if attempt.client_produced is None:
        return None
    return ClientAccounting.model_validate(
        {name: getattr(attempt, f"client_{name}") for name in CLIENT_FIELDS}
    )


def layers(session: Session, run: Run) -> list[LayerInfo]:
    return [LayerInfo.model_validate(layer)
            for layer in runs_repository.get_layers(session, run.id)]


def _scalars(step: Step, ordinal: int) -> dict[str, object]:
    values: dict[str, object] = {
        "id": step.id, "attempt": ordinal, "seq": step.seq, "step": step.step,
        "wall_time": step.wall_time, "growth_tracker": step.growth_tracker,
        "found_inf": step.found_inf, "skipped": step.skipped,
    }
    for name in CLASSED_STEP_FLOATS:
        values[name] = from_storage(getattr(step, name), getattr(step, f"{name}_class"))
    return values


def steps_page(session: Session, run: Run, after_id: int, limit: int) -> StepsPage:
    rows = steps_repository.steps_after(session, run.id, after_id, limit)
    v4 = rank_reads.step_fields(session, run.id, [step.id for step, _ in rows])
    steps = [StepRead.model_validate({**_scalars(step, ordinal), **v4[step.id]})
             for step, ordinal in rows]
    return StepsPage(steps=steps, last_id=steps[-1].id if steps else after_id)


def _with_layers(session: Session, rows: Sequence[Row[Step, int]]) -> list[dict[str, object]]:
    """The scalars of each (step, ordinal) row plus its per-layer statistics (or None)."""
    stats: dict[int, dict[str, list[object]]] = {}
    for stat in steps_repository.layer_stats_of(session, [step.id for step, _ in rows]):
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


def live_steps(session: Session, run_id: str, after_id: int, limit: int) -> list[StepLive]:
    """Steps with id > after_id, in ingest order, with their per-layer statistics and wire v4's
    per-rank and per-optimizer values (as `steps_page` gives them): what the live socket sends."""
    rows = steps_repository.steps_after(session, run_id, after_id, limit)
    v4 = rank_reads.step_fields(session, run_id, [step.id for step, _ in rows])
    return [StepLive.model_validate({**values, **v4[step.id]})
            for values, (step, _) in zip(_with_layers(session, rows), rows, strict=True)]


def _v2_fields(session: Session, run_id: str, steps: Sequence[Step]
               ) -> dict[int, dict[str, object]]:
    """{step id: the wire v2 … v4 fields of the step}, each null when it was not measured."""
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
    for entry in steps_repository.nonfinite_of(session, ids):
        nonfinite = fields[entry.step_id]["nonfinite"]
        assert isinstance(nonfinite, list)
        nonfinite.append(NonfiniteLayerRead.model_validate(
            {"layer": entry.layer_index, "kind": entry.kind}))
    for event in steps_repository.misuse_of(session, ids):
        misuse = fields[event.step_id]["misuse"]
        assert isinstance(misuse, list)
        misuse.append(MisuseRead.model_validate({"kind": event.kind, "detail": event.detail}))
    activations: dict[int, dict[str, list[object]]] = {}
    for stat in steps_repository.activation_stats_of(session, ids):
        arrays = activations.setdefault(stat.step_id, {name: [] for name in LAYER_STAT_NAMES})
        for name in LAYER_STAT_NAMES:
            value = getattr(stat, name)
            if name in CLASSED_ACTIVATION_STATS:
                value = from_storage(value, getattr(stat, f"{name}_class"))
            arrays[name].append(value)
    for step_id, arrays in activations.items():
        fields[step_id]["activations"] = ActivationStatsRead.model_validate(arrays)
    histograms: dict[int, HistogramRead] = {}
    for row in steps_repository.histograms_of(session, ids):
        histogram = histograms.setdefault(row.step_id, HistogramRead(
            min_exp=row.min_exp, max_exp=row.max_exp, counts=[]))
        histogram.counts.append(list(row.counts))
    for step_id, histogram in histograms.items():
        fields[step_id]["histogram"] = histogram
    for recheck in steps_repository.rechecks_of(session, ids):
        fields[recheck.step_id]["recheck"] = recheck_read(recheck)
    swallowed: dict[int, list[float | None]] = {}
    for fraction in steps_repository.swallowed_of(session, ids):
        swallowed.setdefault(fraction.step_id, []).append(fraction.frac)
    for step_id, fractions in swallowed.items():
        fields[step_id]["swallowed"] = fractions
    for step_id, v4 in rank_reads.step_fields(session, run_id, ids).items():
        fields[step_id].update(v4)
    for shadow in steps_repository.shadows_of(session, ids):
        fields[shadow.step_id]["shadow"] = shadow_read(shadow)
    for formats in steps_repository.formats_of(session, ids):
        fields[formats.step_id]["formats"] = formats_export(formats)
    return fields


def formats_export(row: StepFormats) -> FormatsExport:
    """A stored `step_formats` row as the wire's JSON form (`FormatsExport`)."""
    unpacked = format_packing.unpack_row(row.recipes, row.layers, row.data)
    trained = None
    if row.trained is not None and row.trained_data is not None:
        amax, scale = format_packing.split_trained_data(row.trained_data)
        trained = TrainedExport(recipes=format_packing.split_trained(row.trained),
                                amax=amax, scale=scale)
    return FormatsExport(recipes=unpacked.recipes, layers=unpacked.layers,
                         values=unpacked.values, operands=unpacked.operands, trained=trained,
                         scales=None if row.scales is None else format_packing.unpack(row.scales))


def shadow_read(row: StepShadow) -> ShadowRead:
    rel_err = cosine = norm = None
    if row.data is not None:
        rel_err, cosine, norm = (
            [None if x is None else float(x) for x in column]
            for column in stat_packing.unpack(row.data))
    return ShadowRead(
        status=row.status,  # type: ignore[arg-type]  # stored from the wire's Literal
        loss=from_storage(row.loss, row.loss_class),
        rel_err=rel_err, cosine=cosine, norm=norm, detail=row.detail,
    )


def recheck_read(row: StepRecheck) -> RecheckRead:
    return RecheckRead(
        status=row.status,  # type: ignore[arg-type]  # stored from the wire's Literal
        loss=from_storage(row.loss, row.loss_class),
        layers=[NonfiniteLayerRead.model_validate(entry) for entry in row.layers],
        detail=row.detail,
        origin=None if row.origin is None else ForwardOriginRead.model_validate(row.origin),
    )


def export_steps(session: Session, run_id: str, after_id: int, limit: int) -> list[StepExport]:
    """Steps with id > after_id with everything stored for them, in ingest order."""
    rows = steps_repository.steps_after(session, run_id, after_id, limit)
    extra = _v2_fields(session, run_id, [step for step, _ in rows])
    return [
        StepExport.model_validate({**values, **extra[step.id]})
        for values, (step, _) in zip(_with_layers(session, rows), rows, strict=True)
    ]


SHORT_ID_MIN = 8
"""The shortest id prefix the CLI resolves: the 8 characters the dashboard shows."""


def resolve_run(session: Session, text: str) -> Run:
    """The run a person named on the command line: its id, a unique prefix of at least
    SHORT_ID_MIN characters (as the dashboard shows it), or its unique name."""
    if not plausible_id(text):
        raise RunNotFound(text[:RUN_ID_MAX].replace("\x00", "\\0"))
    run = runs_repository.get_run(session, text)
    if run is not None:
        return run
    by_prefix = len(text) >= SHORT_ID_MIN
    for by in ("id prefix", "name") if by_prefix else ("name",):
        found = (runs_repository.runs_matching(session, prefix=text) if by == "id prefix"
                 else runs_repository.runs_matching(session, name=text))
        if len(found) == 1:
            return found[0]
        if found:
            raise AmbiguousRun(f"more than one run has the {by} '{text}'; give more of its id")
    raise RunNotFound(text)


def live_update(
    factory: sessionmaker[Session], run_id: str, after_id: int, limit: int,
    crash_timeout_s: float, viewer: Principal = ANONYMOUS,
) -> tuple[list[StepLive], RunStatus] | None:
    """For the live socket, in its own short session: new steps and the run's status.

    None when the run does not exist (or is not `viewer`'s to see).
    """
    if not plausible_id(run_id):
        return None
    with factory() as session:
        run = runs_repository.get_run(session, run_id)
        if run is None or not viewer.sees(run.project):
            return None
        status = derive_status(run.status, run.updated_at,
                               crash_cutoff(time.time(), crash_timeout_s))
        return live_steps(session, run_id, after_id, limit), status


def live_summaries(
    factory: sessionmaker[Session], run_ids: Collection[str] | None, crash_timeout_s: float,
    viewer: Principal = ANONYMOUS,
) -> SummaryPage:
    """For the runs-list socket, in its own short session: the summaries of `run_ids` (the runs
    that exist among them), or when None the list's snapshot: its first page (newest first,
    with the page's cursor) and apart every other run stored as active (whose status may turn
    `crashed` by silence); only those `viewer` may see. Bounded either way, however many runs
    are stored."""
    with factory() as session:
        if run_ids is not None:
            found = runs_repository.get_runs(session, run_ids, viewer.project)
            return SummaryPage(runs=summaries(session, found, crash_timeout_s, factory=factory),
                               next_cursor=None, total=None)
        now = time.time()
        first = runs_list.runs_page(session, RunsQuery(), viewer.project,
                               crash_cutoff(now, crash_timeout_s))
        shown = {run.id for run in first.runs}
        active = [run for run in runs_repository.get_runs(
            session, run_counters_repository.active_run_ids(session, viewer.project,
                                                            LIVE_ACTIVE_RUNS), viewer.project)
                  if run.id not in shown]
        shown_summaries = summaries(session, [*first.runs, *active], crash_timeout_s, now,
                                    factory)
        return SummaryPage(runs=shown_summaries[:len(first.runs)], next_cursor=first.next_cursor,
                           total=first.total, active=shown_summaries[len(first.runs):])
