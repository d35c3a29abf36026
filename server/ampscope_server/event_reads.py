"""Service: the run page's event list and skip rate, bounded by what the page asks for.

- Events come by page: at most `limit` event steps (skipped or scale change) from `start`, with
  the misuse events in the same step window, the non-finite layers and FP32 re-checks of the
  page's own skipped steps (read by their ids, so a page never reads the run's other skipped
  steps), and `next_start` when more follow. A live page asks only for the steps after those it
  has (`start`), never the whole list again.
- The skip rate comes as at most `max_points` bucket maxima of the rolling rate, plus the last
  window's (step, skipped) so the page continues it exactly from live steps: the page never
  downloads every step. (The server still reads each step's `skipped` flag once per request:
  the rollups do not count skips yet; see the note in docs/contracts.md.)
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from ampscope_server import (
    codec,
    events,
    rollups_repository,
    runs,
    runs_repository,
    skip_rates,
    steps_repository,
)
from ampscope_server.models import Run
from ampscope_server.schemas import EventsRead, SkipRatePoint, SkipRateRead

DEFAULT_EVENT_STEPS = 5000
MAX_EVENT_STEPS = 100_000


def events_page(session: Session, run: Run, start: int | None, end: int | None,
                limit: int | None = DEFAULT_EVENT_STEPS) -> EventsRead:
    """The run's events of at most `limit` event steps (None: all) in [start, end], in step
    order. When the page is cut, it ends before the step of its last event step (so no step's
    events are split) and `next_start` is that step."""
    rows = list(steps_repository.event_rows(session, run.id, start, end,
                                      None if limit is None else limit + 1))
    next_start = None
    if limit is not None and len(rows) > limit:
        next_start = int(rows[limit][1])
        rows = [row for row in rows if int(row[1]) < next_start]
        if not rows:  # one step holds more event rows than a page: give it whole
            rows = list(steps_repository.event_rows(session, run.id, next_start, next_start,
                                                      MAX_EVENT_STEPS))
            next_start = next_start + 1
    last = end if next_start is None else next_start - 1
    steps = [
        events.StepRow(
            step_id=int(step_id), step=int(step), skipped=bool(skipped),
            scale_before=codec.from_storage(before, before_cls),
            scale_after=codec.from_storage(after, after_cls),
            loss=codec.from_storage(loss, loss_cls),
        )
        for step_id, step, skipped, before, before_cls, after, after_cls, loss, loss_cls in rows
    ]
    # The details of this page's skipped steps only, by their ids (a page is bounded; the run's
    # other skipped steps are never read).
    skipped = [row.step_id for row in steps if row.skipped]
    bad_layers: dict[int, list[tuple[int, str]]] = {}
    for entry in steps_repository.nonfinite_of(session, skipped):
        bad_layers.setdefault(entry.step_id, []).append((entry.layer_index, entry.kind))
    misuse = [
        events.MisuseRow(
            step_id=int(step_id), step=int(step),
            scale_before=codec.from_storage(before, before_cls),
            scale_after=codec.from_storage(after, after_cls), kind=kind, detail=detail,
        )
        for step_id, step, before, before_cls, after, after_cls, kind, detail
        in steps_repository.misuse_rows(session, run.id, start, last)
    ]
    names = [layer.name for layer in runs_repository.get_layers(session, run.id)]
    rechecks = {recheck.step_id: runs.recheck_read(recheck)
                for recheck in steps_repository.rechecks_of(session, skipped)}
    return EventsRead(events=events.build_events(steps, misuse, bad_layers, names, rechecks),
                      next_start=next_start)


def skip_rate_read(session: Session, run: Run, max_points: int, window: int,
                   start: int | None = None, end: int | None = None) -> SkipRateRead:
    extent = rollups_repository.step_extent(session, run.id)
    if extent is None:
        return SkipRateRead(window=window, downsampled=False, points=[], tail=[])
    first = extent[0] if start is None else max(start, extent[0])
    last = extent[1] if end is None else min(end, extent[1])
    width = skip_rates.bucket_width(first, last, max_points)
    points, rolling = skip_rates.rolling_max(
        steps_repository.skip_flags(session, run.id, start, end), window, first, width)
    return SkipRateRead(
        window=window, downsampled=width > 1,
        points=[SkipRatePoint(step=step, rate=rate) for step, rate in points],
        tail=rolling.tail)
