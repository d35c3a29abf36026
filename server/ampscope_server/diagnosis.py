"""Findings of a stored run: load a bounded snapshot, run the pure engine, shape the output.

What one snapshot reads, whatever the run's length (measured: 0.1 s on SQLite for a run of
100k steps x 200 layers; 1.5 s with a baseline, which reads every step):
- step scalars of the *notable* steps only (skipped or found_inf, scale changes, non-finite
  loss/grad norm, the step after each skip, first and last): O(events), not O(steps);
  with a baseline, every step of both runs (as `GET /api/compare` does), since divergence is
  judged on every common step;
- per-layer statistics of the last RECENT_LAYER_STEPS layer-stat steps (that many x layers
  rows), plus, with a baseline, BASELINE_LAYER_STEPS steps spread evenly by step number
  (picked from a light list of layer-stat step ids);
- the non-finite layers of at most NONFINITE_STEPS found_inf steps (evenly spread over them,
  first and last kept), the layer statistics just before at most NAN_CONTEXT_STEPS NaN steps
  (one index probe each), the first MISUSE_EVENTS misuse events and RECHECKS re-checks, and
  the swallowed fractions of the last RECENT_LAYER_STEPS steps that carry them.

The runs list shows each run's most severe finding. Computing it per list request would read
every run's snapshot each time, so results are cached in process per (database, run,
`updated_at`): a finished run is analysed once per server process, an active one again only
after new data arrived, and for the list at most once per LIST_REFRESH_S (the live runs list
pushes a changed run up to 10 times a second). The caches are bounded (CACHE_RUNS entries).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from ampscope_server import codec, repository
from ampscope_server.errors import InvalidPayload, RunNotFound
from ampscope_server.findings import (
    Finding,
    LayerInfo,
    LayerSample,
    MisuseEvent,
    NonfiniteStep,
    RecheckStatus,
    RunData,
    StepPoint,
    SwallowedSample,
    analyze,
    markdown,
    most_severe,
)
from ampscope_server.findings.model import NonfiniteKind
from ampscope_server.findings.schemas import FindingBrief, FindingRead, FindingsRead
from ampscope_server.findings.timeline import history
from ampscope_server.models import Run

RECENT_LAYER_STEPS = 8
BASELINE_LAYER_STEPS = 256
NONFINITE_STEPS = 1000
NAN_CONTEXT_STEPS = 16
MISUSE_EVENTS = 10_000
RECHECKS = 1000
CACHE_RUNS = 512
LIST_REFRESH_S = 10.0


def _steps(rows: Sequence[tuple[Any, ...]]) -> tuple[list[StepPoint], dict[int, int]]:
    """StepPoints, and {step id: step} of the found_inf steps (in step order)."""
    points: list[StepPoint] = []
    found_inf: dict[int, int] = {}
    for (step_id, step, sb, sbc, sa, sac, fi, sk, loss, lc, gn, gnc, lr, lrc,
         tracker) in rows:
        points.append(StepPoint(
            step=int(step), scale_before=codec.from_storage(sb, sbc),
            scale_after=codec.from_storage(sa, sac), found_inf=bool(fi), skipped=bool(sk),
            loss=codec.from_storage(loss, lc), grad_norm=codec.from_storage(gn, gnc),
            lr=codec.from_storage(lr, lrc),
            growth_tracker=None if tracker is None else int(tracker),
        ))
        if fi:
            found_inf[int(step_id)] = int(step)
    return points, found_inf


def _samples(rows: Sequence[tuple[Any, ...]]) -> list[LayerSample]:
    return [
        LayerSample(
            step=int(step), layer=int(index), scale=codec.from_storage(scale, scale_cls),
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


def load_run_data(session: Session, run: Run, *, for_baseline: bool = False) -> RunData:
    """The run's snapshot for the engine, within the read bounds of the module docstring.

    `for_baseline`: read every step and the spread layer samples too (either side of a
    baseline comparison)."""
    layers = [
        LayerInfo(name=layer.name, dtype=layer.dtype, shape=tuple(layer.shape),
                  numel=int(layer.numel), module_type=layer.module_type)
        for layer in repository.get_layers(session, run.id)
    ]
    points, found_inf = _steps(repository.findings_steps(session, run.id, for_baseline))
    sample_ids = repository.layer_stat_steps_last(session, run.id, RECENT_LAYER_STEPS)
    if for_baseline:
        sample_ids = sorted(set(sample_ids) | set(_spread_by_step(
            repository.layer_stat_steps_all(session, run.id), BASELINE_LAYER_STEPS)))
    samples = _samples(repository.layer_samples_at(session, sample_ids))

    by_step: dict[int, list[tuple[int, NonfiniteKind]]] = {}
    for entry in repository.nonfinite_of(session, _spread(list(found_inf), NONFINITE_STEPS)):
        kind: NonfiniteKind = "nan" if entry.kind == "nan" else "inf"
        by_step.setdefault(found_inf[entry.step_id], []).append((entry.layer_index, kind))
    nonfinite = [NonfiniteStep(step, tuple(entries)) for step, entries in sorted(by_step.items())]

    nan_context: dict[int, list[LayerSample]] = {}
    scalars_only = RunData(target_format=run.target_format, layers=layers, steps=points)
    for step in _nan_candidates(scalars_only, points, nonfinite)[:NAN_CONTEXT_STEPS]:
        before = repository.layer_stat_steps_last(session, run.id, 1, before_step=step)
        if before:
            nan_context[step] = _samples(repository.layer_samples_at(session, before))

    rechecks: dict[int, RecheckStatus] = {}
    for step, status in repository.recheck_statuses(session, run.id, RECHECKS):
        known = _recheck_status(status)
        if known is not None:
            rechecks[step] = known
    return RunData(
        target_format=run.target_format, layers=layers, steps=points, layer_samples=samples,
        nonfinite=nonfinite,
        misuse=[MisuseEvent(step, kind, detail)
                for step, kind, detail in repository.misuse_first(session, run.id, MISUSE_EVENTS)],
        nan_context=nan_context,
        swallowed=[
            SwallowedSample(step, index, frac)
            for step, index, frac in repository.swallowed_last(session, run.id, RECENT_LAYER_STEPS)
            if frac is not None],
        rechecks=rechecks, name=run.name,
    )


_cache: OrderedDict[tuple[str, str, float], list[Finding]] = OrderedDict()
_cache_lock = threading.Lock()


def _cache_key(session: Session, run: Run) -> tuple[str, str, float]:
    return (str(session.get_bind().engine.url), run.id, run.updated_at)


def run_findings(session: Session, run: Run) -> list[Finding]:
    """The run's findings (no baseline), from the cache when the run has not changed."""
    key = _cache_key(session, run)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    findings = analyze(load_run_data(session, run))
    with _cache_lock:
        _cache[key] = findings
        while len(_cache) > CACHE_RUNS:
            _cache.popitem(last=False)
    return findings


def _baseline(session: Session, run: Run, baseline_id: str) -> Run:
    if baseline_id == run.id:
        raise InvalidPayload("baseline: must be another run than the one analysed")
    baseline = repository.get_run(session, baseline_id)
    if baseline is None:
        raise RunNotFound(baseline_id)
    return baseline


def findings_of(session: Session, run: Run, baseline_id: str | None) -> list[Finding]:
    """The run's findings, against the run `baseline_id` when given (404 when unknown, 422
    when it is the run itself)."""
    if baseline_id is None:
        return run_findings(session, run)
    baseline = _baseline(session, run, baseline_id)
    return analyze(load_run_data(session, run, for_baseline=True),
                   load_run_data(session, baseline, for_baseline=True))


def findings_read(session: Session, run: Run, baseline_id: str | None) -> FindingsRead:
    return FindingsRead(
        run=run.id, baseline=baseline_id,
        findings=[FindingRead.of(f) for f in findings_of(session, run, baseline_id)])


_list_seen: dict[tuple[str, str], tuple[float, list[Finding]]] = {}


def _for_list(session: Session, run: Run) -> list[Finding]:
    """`run_findings`, but an active run that changed within LIST_REFRESH_S of its last analysis
    keeps that one: the live runs list updates up to 10 times a second, and a list needs the
    headline, not a fresh analysis per ingested batch."""
    key = (str(session.get_bind().engine.url), run.id)
    now = time.monotonic()
    with _cache_lock:
        seen = _list_seen.get(key)
    if seen is not None and now - seen[0] < LIST_REFRESH_S:
        return seen[1]
    findings = run_findings(session, run)
    with _cache_lock:
        _list_seen[key] = (now, findings)
        if len(_list_seen) > CACHE_RUNS:
            _list_seen.pop(next(iter(_list_seen)))
    return findings


def top_findings(session: Session, runs: Sequence[Run]) -> dict[str, FindingBrief | None]:
    """{run id: its most severe finding or None}, for the runs list (cached per run)."""
    out: dict[str, FindingBrief | None] = {}
    for run in runs:
        top = most_severe(_for_list(session, run))
        out[run.id] = None if top is None else FindingBrief(
            kind=top.kind, severity=top.severity, title=top.title)
    return out


def report_markdown(
    session: Session, run: Run, baseline_id: str | None
) -> tuple[str, list[Finding]]:
    """(the Markdown post-mortem of `ampscope report`, its findings)."""
    if baseline_id is None:
        data = load_run_data(session, run)
        findings = analyze(data)
    else:
        baseline = _baseline(session, run, baseline_id)
        data = load_run_data(session, run, for_baseline=True)
        findings = analyze(data, load_run_data(session, baseline, for_baseline=True))
    return markdown.render(run.id, data, findings, baseline_id), findings
