"""Findings of a stored run: load a bounded snapshot, run the pure engine, shape the output.

What one snapshot reads, bounded whatever the run's length (a snapshot with a baseline once
read every step of both runs: docs/storage.md#the-findings-snapshots-bound):
- step scalars of the *notable* steps only (skipped or found_inf, scale changes, non-finite
  loss/grad norm, the step after each skip) and of the first and last EDGE_STEPS steps (the
  run's healthy magnitude and where it is now, `findings.divergence`): O(events), not O(steps);
  with a baseline, also the BASELINE_WINDOW steps up to where the runs part, found by the
  bounded search `GET /api/compare` uses (`divergence_search`: step by step up to 8192 common
  steps, through the rollups beyond), not every step of both runs;
- per-layer statistics of the last RECENT_LAYER_STEPS layer-stat steps (that many x layers
  rows), plus, with a baseline, BASELINE_LAYER_STEPS steps spread evenly by step number
  (picked from a light list of layer-stat step ids on a run shorter than BASELINE_SPAN_ALL
  steps, by one index probe each on a longer one) and the first at or after the divergence;
- the non-finite layers of at most NONFINITE_STEPS found_inf steps (evenly spread over them,
  first and last kept), the layer statistics just before at most NAN_CONTEXT_STEPS NaN steps
  (one index probe each), the first MISUSE_EVENTS misuse events (and each kind's exact count,
  one grouped read) and RECHECKS re-checks (status and FP32 loss), the swallowed fractions
  of the last RECENT_LAYER_STEPS steps that carry them, the last SHADOW_STEPS FP32 shadow
  steps that ran (loss, per-layer rel_err and FP32 norm), and the first and last
  OUTLIER_SAMPLES formats samples (wire v7: 2·OUTLIER_SAMPLES rows whole).

Live: every reader (run page, runs list, report of an active run) goes through `live_view`,
cached per (database, run): a run is analysed again only once it changed and at most every
LIVE_REFRESH_S, through its stability `Memory` (findings/stability.py), so the page and the
list show the same findings, holding steady. The memory lives in this process: another worker
keeps its own (its findings then hold steady on their own, from its first analysis on).
The cache is bounded (CACHE_RUNS runs).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from ampscope_server.compare import divergence_search
from ampscope_server.errors import InvalidPayload, NotFound, RunNotFound
from ampscope_server.findings import (
    Finding,
    ForwardOrigin,
    LayerInfo,
    LayerLoss,
    LayerSample,
    Memory,
    MisuseEvent,
    NonfiniteStep,
    RankStep,
    RecheckStatus,
    RunData,
    ShadowSample,
    StepPoint,
    SwallowedSample,
    analyze,
    analyze_live,
    gradients,
    markdown,
)
from ampscope_server.findings.engine import last_step
from ampscope_server.findings.facts import FormatsSample, NonfiniteKind
from ampscope_server.findings.formats import FORMATS
from ampscope_server.findings.schemas import (
    FindingRead,
    FindingsRead,
    FormatLimits,
    HistogramView,
    LayerLossRead,
)
from ampscope_server.findings.thresholds import BASELINE_TOLERANCE, EDGE_STEPS, OUTLIER_SAMPLES
from ampscope_server.findings.timeline import history
from ampscope_server.store import (
    findings_repository,
    format_packing,
    formats_repository,
    rank_packing,
    ranks_repository,
    rollups_repository,
    runs_repository,
    stat_packing,
    steps_repository,
)
from ampscope_server.store.float_storage import from_storage
from ampscope_server.store.models import Run, StepFormats

RECENT_LAYER_STEPS = 8
BASELINE_LAYER_STEPS = 256
BASELINE_SPAN_ALL = 16_384
"""A run spanning fewer steps picks its spread layer samples from its full list of layer-stat
steps; a longer one probes for them (`_baseline_sample_ids`)."""
BASELINE_WINDOW = 64
"""Steps read raw before the divergence step, beside the notable steps, against a baseline."""
NONFINITE_STEPS = 1000
NAN_CONTEXT_STEPS = 16
MISUSE_EVENTS = 10_000
RECHECKS = 1000
SHADOW_STEPS = 64
CACHE_RUNS = 512
HISTOGRAM_STEPS = 50
"""The "what if x k" view offers the run's last 50 sampled steps (every 100 steps by default)."""
LIVE_REFRESH_S = 2.0
"""A changing run is analysed again at most once in this many seconds, however many pages read
it: fast enough that a finding appears within a few seconds, slow enough that one analysis
serves many reads."""


def _steps(rows: Sequence[tuple[Any, ...]]) -> tuple[list[StepPoint], dict[int, int]]:
    """StepPoints, and {step id: step} of the found_inf steps (in step order)."""
    points: list[StepPoint] = []
    found_inf: dict[int, int] = {}
    for (step_id, step, sb, sbc, sa, sac, fi, sk, loss, lc, gn, gnc, lr, lrc,
         tracker) in rows:
        points.append(StepPoint(
            step=int(step), scale_before=from_storage(sb, sbc),
            scale_after=from_storage(sa, sac), found_inf=bool(fi), skipped=bool(sk),
            loss=from_storage(loss, lc), grad_norm=from_storage(gn, gnc),
            lr=from_storage(lr, lrc),
            growth_tracker=None if tracker is None else int(tracker),
        ))
        if fi:
            found_inf[int(step_id)] = int(step)
    return points, found_inf


def _samples(rows: Sequence[tuple[Any, ...]]) -> list[LayerSample]:
    return [
        LayerSample(
            step=int(step), layer=int(index), scale=from_storage(scale, scale_cls),
            amax=amax, amin_nz=amin_nz, zero_frac=zero, subnormal_frac=sub,
            underflow_frac=under, nan_count=int(nans), inf_count=int(infs), l2=l2)
        for (_, step, scale, scale_cls, index, amax, amin_nz, zero, sub, under, nans, infs, l2)
        in rows
    ]


def _spread(items: Sequence[int], limit: int) -> list[int]:
    """At most `limit` of `items`, evenly spaced by position, first and last kept."""
    if len(items) <= limit:
        return list(items)
    if limit == 1:
        return [items[-1]]
    return sorted({items[round(i * (len(items) - 1) / (limit - 1))] for i in range(limit)})


def _spread_by_step(steps: Sequence[tuple[int, int]], limit: int) -> list[int]:
    """Ids of at most `limit` (id, step) pairs (sorted by step): for evenly spaced step numbers,
    the first layer-stat step at or after each. Two runs of the same cadence and length get the
    same step numbers, so their samples line up for comparison."""
    if len(steps) <= limit:
        return [step_id for step_id, _ in steps]
    first, last = steps[0][1], steps[-1][1]
    chosen: list[int] = []
    at = 0
    for i in range(limit):
        target = first + (last - first) * i / (limit - 1)
        while at < len(steps) - 1 and steps[at][1] < target:
            at += 1
        if not chosen or chosen[-1] != steps[at][0]:
            chosen.append(steps[at][0])
    return chosen


def _nan_candidates(
    run: RunData, points: Sequence[StepPoint], nonfinite: Sequence[NonfiniteStep]
) -> list[int]:
    """Steps whose first non-finite layer held NaN (or, unlisted, whose grad norm is NaN),
    calibration and probe skips left out as `nan_not_range` leaves them out."""
    first_kind = {entry.step: entry.layers[0][1] for entry in nonfinite if entry.layers}
    h = history(run)
    benign = set() if h is None else set(h.calibration) | set(h.probes)
    out = []
    for p in points:
        if not p.found_inf or p.step in benign:
            continue
        kind = first_kind.get(p.step)
        if kind == "nan" or (kind is None and p.grad_norm is not None
                             and math.isnan(p.grad_norm)):
            out.append(p.step)
    return out


_RECHECK_STATUSES: dict[str, RecheckStatus] = {
    "persisted": "persisted", "vanished": "vanished", "failed": "failed"}


def _recheck_status(status: str) -> RecheckStatus | None:
    return _RECHECK_STATUSES.get(status)


def _baseline_sample_ids(session: Session, run: Run, divergence: int | None) -> set[int]:
    """Layer-stat step ids spread evenly by step number (`_spread_by_step`), and the first at
    or after the divergence step. A short run's are picked from its full list (light rows, at
    most BASELINE_SPAN_ALL steps' worth); a longer run's by one forward probe per target."""
    chosen: set[int] = set()
    extent = rollups_repository.step_extent(session, run.id)
    if extent is not None and extent[1] - extent[0] < BASELINE_SPAN_ALL:
        chosen.update(_spread_by_step(findings_repository.layer_stat_steps_all(session, run.id),
                                      BASELINE_LAYER_STEPS))
    elif extent is not None:
        first, last = extent
        for i in range(BASELINE_LAYER_STEPS):
            target = first + (last - first) * i // (BASELINE_LAYER_STEPS - 1)
            found = findings_repository.layer_stat_step_at(session, run.id, target)
            if found is not None:
                chosen.add(found)
    if divergence is not None:
        found = findings_repository.layer_stat_step_at(session, run.id, divergence)
        if found is not None:
            chosen.add(found)
    return chosen


def load_run_data(session: Session, run: Run, *, for_baseline: bool = False,
                  divergence: int | None = None) -> RunData:
    """The run's snapshot for the engine, within the read bounds of the module docstring.

    `for_baseline` (either side of a baseline comparison): also the steps of the
    BASELINE_WINDOW steps up to `divergence` (where `divergence_search` found the runs part)
    and the spread layer samples (`_baseline_sample_ids`)."""
    layers = [
        LayerInfo(name=layer.name, dtype=layer.dtype, shape=tuple(layer.shape),
                  numel=int(layer.numel), module_type=layer.module_type)
        for layer in runs_repository.get_layers(session, run.id)
    ]
    step_rows = findings_repository.findings_steps(session, run.id, False)
    notable = {int(row[0]) for row in step_rows}
    step_rows += [row for row in findings_repository.steps_at_edges(session, run.id, EDGE_STEPS)
                  if int(row[0]) not in notable]
    step_rows.sort(key=lambda row: (int(row[1]), int(row[0])))
    if for_baseline and divergence is not None:
        notable = {int(row[0]) for row in step_rows}
        step_rows += [row for row in findings_repository.steps_between(
            session, run.id, max(0, divergence - BASELINE_WINDOW), divergence)
            if int(row[0]) not in notable]
        step_rows.sort(key=lambda row: (int(row[1]), int(row[0])))
    points, found_inf = _steps(step_rows)
    sample_ids = findings_repository.layer_stat_steps_last(session, run.id, RECENT_LAYER_STEPS)
    if for_baseline:
        sample_ids = sorted(set(sample_ids) | _baseline_sample_ids(session, run, divergence))
    samples = _samples(findings_repository.layer_samples_at(session, sample_ids))

    by_step: dict[int, list[tuple[int, NonfiniteKind]]] = {}
    for entry in steps_repository.nonfinite_of(session, _spread(list(found_inf), NONFINITE_STEPS)):
        kind: NonfiniteKind = "nan" if entry.kind == "nan" else "inf"
        by_step.setdefault(found_inf[entry.step_id], []).append((entry.layer_index, kind))
    nonfinite = [NonfiniteStep(step, tuple(entries)) for step, entries in sorted(by_step.items())]

    nan_context: dict[int, list[LayerSample]] = {}
    scalars_only = RunData(target_format=run.target_format, layers=layers, steps=points)
    for step in _nan_candidates(scalars_only, points, nonfinite)[:NAN_CONTEXT_STEPS]:
        before = findings_repository.layer_stat_steps_last(session, run.id, 1, before_step=step)
        if before:
            nan_context[step] = _samples(findings_repository.layer_samples_at(session, before))

    rechecks: dict[int, RecheckStatus] = {}
    recheck_losses: dict[int, float] = {}
    origins: dict[int, ForwardOrigin] = {}
    for step, status, loss, loss_class, origin in findings_repository.rechecks_first(
            session, run.id, RECHECKS):
        if origin is not None:
            origins[step] = ForwardOrigin(str(origin["module"]), bool(origin["input_finite"]),
                                          str(origin["format"]))
        known = _recheck_status(status)
        if known is not None:
            rechecks[step] = known
        value = from_storage(loss, loss_class)
        if value is not None:
            recheck_losses[step] = value
    return RunData(
        target_format=run.target_format, layers=layers, steps=points, layer_samples=samples,
        nonfinite=nonfinite,
        misuse=[MisuseEvent(step, kind, detail)
                for step, kind, detail in findings_repository.misuse_first(
                    session, run.id, MISUSE_EVENTS)],
        misuse_totals={kind: (steps, first, last) for kind, steps, first, last
                       in findings_repository.misuse_totals(session, run.id)},
        nan_context=nan_context,
        swallowed=[
            SwallowedSample(step, index, frac)
            for step, index, frac in findings_repository.swallowed_last(
                session, run.id, RECENT_LAYER_STEPS)
            if frac is not None],
        rechecks=rechecks, recheck_losses=recheck_losses, forward_origins=origins,
        shadows=[
            _shadow_sample(step, from_storage(loss, loss_class), data)
            for step, loss, loss_class, data in findings_repository.shadows_last(
                session, run.id, SHADOW_STEPS)],
        formats=_formats_ends(session, run.id),
        name=run.name,
        first_rank=_first_rank(session, run),
    )


def _formats_ends(session: Session, run_id: str) -> list[FormatsSample]:
    """The run's first and last OUTLIER_SAMPLES formats samples (each once), in step order."""
    first = formats_repository.formats_first(session, run_id, OUTLIER_SAMPLES)
    last = formats_repository.formats_up_to(session, run_id, None, OUTLIER_SAMPLES)
    rows = {row.step_id: row for row in (*first, *reversed(last))}
    return [formats_sample(row) for row in rows.values()]


def formats_sample(row: StepFormats) -> FormatsSample:
    """A stored `step_formats` row as the detectors' `FormatsSample`."""
    unpacked = format_packing.unpack_row(row.recipes, row.layers, row.data)
    return FormatsSample(row.step, tuple(unpacked.recipes), tuple(unpacked.layers),
                         unpacked.values, unpacked.operands)


def _shadow_sample(step: int, loss: float | None, data: bytes) -> ShadowSample:
    """A stored shadow step's rel_err, cosine and FP32 norm columns (`SHADOW_KINDS`)."""
    rel_err, cosine, norm = stat_packing.unpack(data)
    return ShadowSample(step, loss, tuple(rel_err), tuple(norm), tuple(cosine))


def _first_rank(session: Session, run: Run) -> RankStep | None:
    """A distributed run's first step where a rank went non-finite: one index probe."""
    if run.world_size <= 1:
        return None
    found = ranks_repository.first_nonfinite(session, run.id)
    if found is None:
        return None
    step, data = found
    ranks = rank_packing.unpack_ranks(data)
    return RankStep(world_size=run.world_size, step=step,
                    ranks=tuple(rank_packing.origin_ranks(ranks.loss, ranks.nonfinite)),
                    loss=tuple(ranks.loss), nonfinite=tuple(ranks.nonfinite))


@dataclass(frozen=True)
class LiveView:
    """One analysis of a run as the run page and the runs list show it."""

    findings: list[Finding]
    """Grouped, root cause first (`causes.group`), held steady (`stability.track`)."""
    worst: LayerLoss | None
    """The layer losing most to the format, by `gradient_underflow`'s definition."""
    step: int
    """The newest step the analysis saw (-1: none)."""
    memory: Memory
    updated_at: float
    """`run.updated_at` when analysed: unchanged means nothing new to analyse."""
    analysed_at: float
    """time.monotonic() of the analysis."""


_live: OrderedDict[tuple[str, str], LiveView] = OrderedDict()
_cache_lock = threading.Lock()
_run_locks: dict[tuple[str, str], threading.Lock] = {}


def _key(session: Session, run: Run) -> tuple[str, str]:
    return (str(session.get_bind().engine.url), run.id)


def _fresh(view: LiveView | None, run: Run, now: float) -> bool:
    """Whether `view` still answers for `run`: nothing new since, or (while the run is live)
    analysed less than LIVE_REFRESH_S ago (a live run changes ten times a second; its diagnosis
    need not)."""
    return view is not None and (
        view.updated_at == run.updated_at
        # A finished run changes no more: its last batch is analysed at once, not
        # LIVE_REFRESH_S later.
        or (run.status == "active" and now - view.analysed_at < LIVE_REFRESH_S))


def live_view(session: Session, run: Run, now: float | None = None) -> LiveView:
    """The run's current findings (no baseline): analysed again when the run changed and the
    last analysis is older than LIVE_REFRESH_S, through the run's `Memory` so that findings
    hold steady across analyses. Every reader of one server process (run page, runs list,
    report) sees the same view; concurrent readers of one run wait for one analysis. `now`:
    time.monotonic() unless given (tests)."""
    clock = time.monotonic() if now is None else now
    key = _key(session, run)
    with _cache_lock:
        view = _live.get(key)
        lock = _run_locks.setdefault(key, threading.Lock())
    if _fresh(view, run, clock):
        assert view is not None
        return view
    with lock:
        with _cache_lock:
            view = _live.get(key)
        if _fresh(view, run, clock):
            assert view is not None
            return view
        data = load_run_data(session, run)
        # Holding steady is for a run still moving. A finished or crashed run is analysed afresh,
        # so its post-mortem is the same whether or not anyone (or the alert worker) watched it
        # live: nothing held over from an analysis of its first steps.
        memory_in = view.memory if view is not None and run.status == "active" else None
        findings, memory = analyze_live(data, memory_in)
        view = LiveView(findings=findings, worst=gradients.worst_loss(data),
                        step=last_step(data), memory=memory, updated_at=run.updated_at,
                        analysed_at=clock)
        with _cache_lock:
            _live[key] = view
            _live.move_to_end(key)
            while len(_live) > CACHE_RUNS:
                old, _ = _live.popitem(last=False)
                _run_locks.pop(old, None)
    return view


def run_findings(session: Session, run: Run, now: float | None = None) -> list[Finding]:
    """The run's findings (no baseline), as the run page shows them (`live_view`)."""
    return live_view(session, run, now).findings


def _baseline(session: Session, run: Run, baseline_id: str) -> Run:
    if baseline_id == run.id:
        raise InvalidPayload("baseline: must be another run than the one analysed")
    baseline = runs_repository.get_run(session, baseline_id)
    if baseline is None:
        raise RunNotFound(baseline_id)
    return baseline


def findings_of(session: Session, run: Run, baseline_id: str | None) -> list[Finding]:
    """The run's findings, against the run `baseline_id` when given (404 when unknown, 422
    when it is the run itself)."""
    if baseline_id is None:
        return run_findings(session, run)
    baseline = _baseline(session, run, baseline_id)
    return analyze(*_with_baseline(session, run, baseline))


def _with_baseline(session: Session, run: Run, baseline: Run) -> tuple[RunData, RunData]:
    """Both snapshots of a baseline comparison: bounded, around where the runs part."""
    found = divergence_search.search(session, baseline.id, run.id, BASELINE_TOLERANCE,
                                               taken_only=False)
    divergence = None if found is None else found.step
    return (load_run_data(session, run, for_baseline=True, divergence=divergence),
            load_run_data(session, baseline, for_baseline=True, divergence=divergence))


def findings_read(session: Session, run: Run, baseline_id: str | None) -> FindingsRead:
    if baseline_id is not None:
        return FindingsRead(
            run=run.id, baseline=baseline_id,
            findings=[FindingRead.of(f) for f in findings_of(session, run, baseline_id)])
    view = live_view(session, run)
    return FindingsRead(
        run=run.id, baseline=None, findings=[FindingRead.of(f) for f in view.findings],
        step=view.step, worst_loss=None if view.worst is None else LayerLossRead.of(view.worst))


def report_markdown(
    session: Session, run: Run, baseline_id: str | None
) -> tuple[str, list[Finding]]:
    """(the Markdown post-mortem of `ampscope report`, its findings)."""
    if baseline_id is None:
        data = load_run_data(session, run)
        findings = analyze(data)
    else:
        baseline = _baseline(session, run, baseline_id)
        data, baseline_data = _with_baseline(session, run, baseline)
        findings = analyze(data, baseline_data)
    return markdown.render(run.id, data, findings, baseline_id), findings


def histogram_read(session: Session, run: Run, step: int | None) -> HistogramView:
    """The exponent histograms of one sampled step (the newest, or `step`; 404 when the run
    has no histogram at that step), with the scale in effect and the format's limits."""
    limits = FormatLimits.of(FORMATS[run.target_format])
    sampled = findings_repository.histogram_steps_last(session, run.id, HISTOGRAM_STEPS)
    steps = [number for _, number, _, _ in sampled]
    if step is None and not sampled:
        return HistogramView(run=run.id, step=None, scale=None, steps=[], format=limits,
                             min_exp=None, max_exp=None, layers=[], counts=[])
    chosen = sampled[0] if step is None else next((row for row in sampled if row[1] == step), None)
    if chosen is None:
        sampled_text = (f"sampled: the last {len(steps)} are {', '.join(map(str, steps[:5]))}"
                        f"{' …' if len(steps) > 5 else ''}" if steps else "it has none yet")
        raise NotFound(f"run '{run.id}' has no exponent histogram at step {step} "
                       f"({sampled_text})")
    step_id, number, scale, scale_cls = chosen
    names = runs_repository.layer_names(session, run.id)
    rows = steps_repository.histograms_of(session, [step_id])
    return HistogramView(
        run=run.id, step=number, scale=from_storage(scale, scale_cls), steps=steps,
        format=limits, min_exp=rows[0].min_exp if rows else None,
        max_exp=rows[0].max_exp if rows else None,
        layers=[names[r.layer_index] if r.layer_index < len(names) else f"#{r.layer_index}"
                for r in rows],
        counts=[list(r.counts) for r in rows])
