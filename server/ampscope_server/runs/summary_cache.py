"""Service: a run's summary for the runs list, kept as counters at ingest plus a cached analysis.

Two halves (DESIGN.md §8: `GET /api/runs` with 2,000 runs ≤ 150 ms, whatever their length):
- **Counters** (`ingest.counters`), maintained in each batch's transaction: steps, skips,
  non-finite steps, the last step, its scale and loss. Exact at every commit.
- **The cached analysis** (top finding, the layer losing most to the format, the layer closest
  to overflow), stored beside the counters and keyed by their `version`. The analysis reads a
  run's snapshot (`finding_reads.live_view`): far too much to repeat for every run of a page on
  every request. A read analyses at most SYNC_REFRESH stale runs itself; the other stale runs
  of what it read are handed to the `Refresher`, a thread of this process that analyses them
  off the request path, stores the result and tells the runs-list sockets when what they show
  changed. Every summary says which step its analysis is as of (`summary_step`).

An analysis counts as current for the counters' version only when it saw the run as it is
(`LiveView.updated_at == run.updated_at`): `live_view` may answer from an analysis up to
LIVE_REFRESH_S old, which is shown (as of its step) but stays stale and is done again later.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.charts import series_math
from ampscope_server.findings import primary
from ampscope_server.findings import reads as finding_reads
from ampscope_server.findings.formats import FORMATS, FloatFormat
from ampscope_server.findings.schemas import FindingBrief
from ampscope_server.live import hub as live
from ampscope_server.runs.schemas import WorstLayer
from ampscope_server.store import run_counters_repository, runs_repository, steps_repository
from ampscope_server.store.float_storage import from_storage, to_storage
from ampscope_server.store.models import Run, RunCounters

SYNC_REFRESH = 4
"""Stale runs one read analyses itself (the rest: the Refresher). A handful: a list of a few
fresh runs is exact at once, and a page of 100 stale ones (after an upgrade) costs ≤ 4 runs."""
REFRESH_BATCH = 100
"""Runs the Refresher analyses per round (one session)."""

log = logging.getLogger(__name__)


# --- the cached analysis -------------------------------------------------------------------------

@dataclass(frozen=True)
class Analysis:
    """What the runs list shows of a run's analysis, and which counters version it answers."""

    version: int | None
    """The `summary_version` to store with it: the counters' version when the analysis is
    current for it, else the one stored before (the run stays stale: analysed again later)."""
    step: int | None
    """The newest step the analysis saw (None: the run has no step)."""
    top: FindingBrief | None
    underflow: WorstLayer | None
    headroom: WorstLayer | None

    def row(self) -> dict[str, Any]:
        """The `run_counters` columns that store it."""
        bits, bits_class = to_storage(None if self.headroom is None else self.headroom.value)
        return {
            "summary_step": self.step,
            "finding_kind": None if self.top is None else self.top.kind,
            "finding_severity": None if self.top is None else self.top.severity,
            "finding_title": None if self.top is None else self.top.title,
            "underflow_layer": None if self.underflow is None else self.underflow.layer,
            "underflow_frac": None if self.underflow is None else self.underflow.value,
            "headroom_layer": None if self.headroom is None else self.headroom.layer,
            "headroom_bits": bits, "headroom_bits_class": bits_class,
        }


def is_stale(counters: RunCounters | None) -> bool:
    return counters is not None and counters.summary_version != counters.version


def stored(counters: RunCounters | None) -> Analysis:
    """The analysis stored beside the counters (empty for a run without steps or one never
    analysed)."""
    if counters is None or counters.summary_step is None:
        return Analysis(version=None, step=None, top=None, underflow=None, headroom=None)
    top = None
    if counters.finding_kind is not None:
        top = FindingBrief.model_validate({
            "kind": counters.finding_kind, "severity": counters.finding_severity,
            "title": counters.finding_title or ""})
    underflow = None
    if counters.underflow_layer is not None and counters.underflow_frac is not None:
        underflow = WorstLayer(layer=counters.underflow_layer, value=counters.underflow_frac)
    headroom_bits = from_storage(counters.headroom_bits, counters.headroom_bits_class)
    headroom = None
    if counters.headroom_layer is not None and headroom_bits is not None:
        headroom = WorstLayer(layer=counters.headroom_layer, value=headroom_bits)
    return Analysis(version=counters.summary_version, step=counters.summary_step, top=top,
                    underflow=underflow, headroom=headroom)


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
        lost = series_math.lost_frac(zero_frac, underflow_frac)
        if underflow is None or lost > underflow[1]:
            underflow = (name, lost)
        bits = series_math.headroom_bits(amax, scale, fmt)
        if bits is not None and (headroom is None or bits < headroom[1]):
            headroom = (name, bits)
    return underflow, headroom


def _headrooms(session: Session, runs: Sequence[Run]) -> dict[str, WorstLayer]:
    """Each run's layer closest to overflow at its last layer-stat step (two bounded queries
    for all runs)."""
    step_ids = steps_repository.last_layer_stat_steps(session, [run.id for run in runs])
    by_run: dict[str, tuple[float | None, list[LayerAtStep]]] = {}
    for run_id, scale, scale_cls, _, name, zero, under, amax, nonfinite in (
        steps_repository.named_layer_stats(session, step_ids.values())
    ):
        entry = by_run.setdefault(run_id, (from_storage(scale, scale_cls), []))
        # A NaN layer's amax is over its finite elements: 0 there is no "all zero, infinite
        # headroom" (the runs list showed "∞ (all zero)" for a NaN run) but no headroom known.
        entry[1].append((name, zero, under, None if nonfinite and not amax else amax))
    formats = {run.id: run.target_format for run in runs}
    result: dict[str, WorstLayer] = {}
    for run_id, (scale, layers) in by_run.items():
        _, headroom = worst_layers(layers, scale, FORMATS[formats[run_id]])
        if headroom is not None:
            result[run_id] = WorstLayer(layer=headroom[0], value=headroom[1])
    return result


def analyse(
    session: Session, runs: Sequence[Run], counters: Mapping[str, RunCounters]
) -> dict[str, Analysis]:
    """Analyse `runs` (each with its counters row) as the runs list shows them."""
    if not runs:
        return {}
    headrooms = _headrooms(session, runs)
    result: dict[str, Analysis] = {}
    for run in runs:
        view = finding_reads.live_view(session, run)
        top = primary(view.findings)
        row = counters.get(run.id)
        version = None if row is None else (
            row.version if view.updated_at == run.updated_at else row.summary_version)
        result[run.id] = Analysis(
            version=version,
            step=None if view.step < 0 else view.step,
            top=None if top is None else FindingBrief(kind=top.kind, severity=top.severity,
                                                      title=top.title),
            underflow=None if view.worst is None else WorstLayer(layer=view.worst.layer,
                                                                 value=view.worst.lost_frac),
            headroom=headrooms.get(run.id),
        )
    return result


def current(
    session: Session, runs: Sequence[Run], counters: Mapping[str, RunCounters],
    factory: sessionmaker[Session] | None,
) -> dict[str, Analysis]:
    """{run id: the analysis to show}: the stored one when current, else analysed now (at most
    SYNC_REFRESH runs) or the stored one while the Refresher analyses it. With `factory`, what
    was analysed here is handed to the Refresher to store, and the rest to analyse."""
    stale = [run for run in runs if is_stale(counters.get(run.id))]
    shown = {run.id: stored(counters.get(run.id)) for run in runs}
    analysed = analyse(session, stale[:SYNC_REFRESH], counters)
    shown.update(analysed)
    if stale and factory is not None:
        REFRESHER.submit(factory, [run.id for run in stale[SYNC_REFRESH:]], analysed)
    return shown


def store(factory: sessionmaker[Session], analyses: Mapping[str, Analysis],
          before: Mapping[str, Analysis] | None = None) -> None:
    """Store each analysis in a short write transaction of its own. With `before` (what the
    runs-list sockets were shown), those whose shown summary changed are notified."""
    for run_id, analysis in analyses.items():
        with factory.begin() as writer:
            run_counters_repository.store_summary(
                writer, run_id, {**analysis.row(), "summary_version": analysis.version})
            if before is not None and _shown(analysis) != _shown(before[run_id]):
                live.notify_after_commit(writer, run_id)


def refresh(factory: sessionmaker[Session], run_ids: Collection[str]) -> int:
    """Analyse the stale runs among `run_ids` and store the results; the runs-list sockets are
    told of those whose shown summary changed. The number of runs analysed."""
    with factory() as session:
        runs = runs_repository.get_runs(session, run_ids)
        counters = run_counters_repository.counters_of(session, [run.id for run in runs])
        stale = [run for run in runs if is_stale(counters.get(run.id))]
        before = {run.id: stored(counters.get(run.id)) for run in stale}
        results = analyse(session, stale, counters)
    store(factory, results, before)
    return len(results)


def _shown(analysis: Analysis) -> tuple[object, ...]:
    return analysis.step, analysis.top, analysis.underflow, analysis.headroom


class Refresher:
    """One thread per process that stores analyses made by reads and analyses stale runs off
    the request path, REFRESH_BATCH at a time, each run at most once per round however many
    reads asked for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wanted: dict[sessionmaker[Session], set[str]] = {}
        self._made: dict[sessionmaker[Session], dict[str, Analysis]] = {}
        self._wake = threading.Event()
        self._working = False
        self._thread: threading.Thread | None = None

    def submit(self, factory: sessionmaker[Session], run_ids: Collection[str],
               analysed: Mapping[str, Analysis]) -> None:
        """Analyse `run_ids` and store `analysed` (made by a read), off the request path."""
        with self._lock:
            if run_ids:
                self._wanted.setdefault(factory, set()).update(run_ids)
            if analysed:
                self._made.setdefault(factory, {}).update(analysed)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ampscope-summaries",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def idle(self) -> bool:
        """Nothing asked for is left to do (bench and tests wait for this)."""
        with self._lock:
            return not self._wanted and not self._made and not self._working

    def _take(self) -> tuple[sessionmaker[Session], dict[str, Analysis], list[str]] | None:
        with self._lock:
            for factory in {*self._made, *self._wanted}:
                made = self._made.pop(factory, {})
                ids = self._wanted.get(factory, set())
                batch = sorted(ids - set(made))[:REFRESH_BATCH]
                ids.difference_update(batch, made)
                if not ids:
                    self._wanted.pop(factory, None)
                self._working = True
                return factory, made, batch
            self._working = False
            self._wake.clear()
            return None

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                self._wake.wait()
                continue
            factory, made, run_ids = taken
            try:
                store(factory, made)
                if run_ids:
                    refresh(factory, run_ids)
            except Exception as exc:  # the database went away or the run was deleted: the
                # next read asks again; the thread must outlive any one failure.
                log.warning("run summaries not refreshed (%s): %s", type(exc).__name__, exc)


REFRESHER = Refresher()
