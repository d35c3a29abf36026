"""Service: the run page's event list and skip rate, bounded by what the page asks for.

- Events come by page: at most `limit` event steps (skipped or scale change) from `start`, with
  the misuse events in the same step window, the non-finite layers and FP32 re-checks of the
  page's own skipped steps (read by their ids, so a page never reads the run's other skipped
  steps), and `next_start` when more follow. A live page asks only for the steps after those it
  has (`start`), never the whole list again.
- The skip rate comes as at most `max_points` bucket maxima of the rolling rate, plus the last
  window's (step, skipped) so the page continues it exactly from live steps: the page never
  downloads every step. A long range is read from the skip counts of the series rollups
  (revision 0013), not from every step's flag (`skip_rate_read` says what is guaranteed).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from ampscope_server.charts import events, skip_rates
from ampscope_server.charts.schemas import EventsRead, SkipRatePoint, SkipRateRead
from ampscope_server.runs import reads as runs
from ampscope_server.store import rollups, rollups_repository, runs_repository, steps_repository
from ampscope_server.store.float_storage import from_storage
from ampscope_server.store.models import Run

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
            scale_before=from_storage(before, before_cls),
            scale_after=from_storage(after, after_cls),
            loss=from_storage(loss, loss_cls), found_inf=bool(found_inf),
        )
        for (step_id, step, skipped, found_inf, before, before_cls, after, after_cls, loss,
             loss_cls) in rows
    ]
    # The details of this page's skipped and non-finite steps only, by their ids (a page is
    # bounded; the run's other such steps are never read).
    skipped = [row.step_id for row in steps if row.skipped]
    bad_layers: dict[int, list[tuple[int, str]]] = {}
    nonfinite = [row.step_id for row in steps if row.skipped or row.found_inf]
    for entry in steps_repository.nonfinite_of(session, nonfinite):
        bad_layers.setdefault(entry.step_id, []).append((entry.layer_index, entry.kind))
    misuse = [
        events.MisuseRow(
            step_id=int(step_id), step=int(step),
            scale_before=from_storage(before, before_cls),
            scale_after=from_storage(after, after_cls), kind=kind, detail=detail,
        )
        for step_id, step, before, before_cls, after, after_cls, kind, detail
        in steps_repository.misuse_rows(session, run.id, start, last)
    ]
    names = runs_repository.layer_names(session, run.id)
    rechecks = {recheck.step_id: runs.recheck_read(recheck)
                for recheck in steps_repository.rechecks_of(session, skipped)}
    applied = [row.step_id for row in steps if row.found_inf and not row.skipped]
    shadows = {shadow.step_id: runs.shadow_read(shadow)
               for shadow in steps_repository.shadows_of(session, applied)}
    return EventsRead(events=events.build_events(steps, misuse, bad_layers, names, rechecks,
                                                 shadows),
                      next_start=next_start)


def skip_rate_read(session: Session, run: Run, max_points: int, window: int,
                   start: int | None = None, end: int | None = None) -> SkipRateRead:
    """The rolling skip rate over [start, end] (the run's steps when None): at most
    `max_points` points, each the highest rate in its bucket of steps, and the last window's
    (step, skipped) to go on live.

    A range of at most `skip_rates.EXACT_STEPS` steps gets the exact rolling rate, from every
    step's flag. A longer one is read from the skip counts of the series rollups
    (`rollups_repository.skip_block_maxima`), in blocks of k stored buckets of b steps
    (`skip_rates.blocks`: b a stored level, k·b ≤ window < (k+1)·b, k ≥ 4 when the window
    allows); a point's rate is the highest block rate among the blocks that end in its bucket
    of steps, a block's rate being its skipped steps over its stored steps (each step number
    once). What is guaranteed, for a window of at least 16 steps:

    - a burst of `window` consecutive step numbers, all stored and skipped, shows a rate of at
      least (2k-1)/(2k) ≥ 1/2 (≥ 7/8 when k ≥ 4) at the point whose bucket holds the end of
      a block that overlaps the burst at least that much, a block ending at most b steps
      after the burst; a burst of 2·window - 1 such steps shows 1.0 there;
    - a rate is never averaged over more than `window` steps (a block is at most the window);
      it may exceed the exact rolling maximum of its bucket, as a block is up to b - 1 steps
      shorter than the window and the range's first and last buckets of b steps may reach up
      to b - 1 steps beyond it;
    - a bucket of points holds a point only if a block ends in it, so there are at most
      `max_points` points and a point's `step` is its bucket's first step.

    For a window narrower than the finest stored bucket (16 steps), no block fits: the rates
    are then exact, computed from the raw flags around the 16-step buckets that hold a skip
    (a window ending elsewhere holds none, rate 0), so the cost grows with those buckets.
    """
    extent = rollups_repository.step_extent(session, run.id)
    if extent is None:
        return SkipRateRead(window=window, downsampled=False, points=[], tail=[])
    first = extent[0] if start is None else max(start, extent[0])
    last = extent[1] if end is None else min(end, extent[1])
    width = skip_rates.bucket_width(first, last, max_points)
    if last - first + 1 <= skip_rates.EXACT_STEPS:
        points, rolling = skip_rates.rolling_max(
            steps_repository.skip_flags(session, run.id, start, end), window, first, width)
        return SkipRateRead(
            window=window, downsampled=width > 1,
            points=[SkipRatePoint(step=step, rate=rate) for step, rate in points],
            tail=rolling.tail)
    shape = skip_rates.blocks(window, last - first + 1, rollups.SERIES_LEVELS)
    if shape is not None:
        columns = rollups_repository.skip_block_maxima(
            session, run.id, shape.level, shape.units, first, last, width)
    else:
        columns = _narrow_window_columns(session, run.id, window, first, last, width)
    return SkipRateRead(
        window=window, downsampled=True,
        points=[SkipRatePoint(step=step, rate=rate)
                for step, rate in skip_rates.column_points(columns, first, last, width)],
        tail=_tail(session, run.id, window, first, last))


def _narrow_window_columns(session: Session, run_id: str, window: int, first: int, last: int,
                           width: int) -> list[tuple[int, float]]:
    """(column, rate) for a window narrower than the finest stored bucket: every column in
    which a stored bucket ends at rate 0, and the positive exact rates of the steps whose
    window may hold a skip (those of a bucket with a skip and of the bucket after it), from
    the raw flags."""
    level = rollups.SERIES_LEVELS[0]
    columns = [(column, 0.0) for column, _ in rollups_repository.skip_block_maxima(
        session, run_id, level, 1, first, last, width)]
    spans: list[list[int]] = []
    for bucket in rollups_repository.skipped_buckets(session, run_id, level, first, last):
        if spans and spans[-1][1] >= bucket - 1:
            spans[-1][1] = bucket + 1
        else:
            spans.append([bucket, bucket + 1])
    for lo, hi in spans:
        since = max(first, lo << level)
        flags = steps_repository.skip_flags(
            session, run_id, max(first, since - window + 1), min(last, ((hi + 1) << level) - 1))
        columns.extend(((step - first) // width, rate)
                       for step, rate in skip_rates.rates_from(flags, window, since) if rate)
    return columns


def _tail(session: Session, run_id: str, window: int, first: int, last: int
          ) -> list[tuple[int, bool]]:
    """(step, skipped) of the last window's steps in [first, last], oldest first: what the
    rolling state holds after the range's last step."""
    final = rollups_repository.last_step_in(session, run_id, first, last)
    if final is None:
        return []
    rolling = skip_rates.RollingSkips(window)
    for step, skipped in steps_repository.skip_flags(
            session, run_id, max(first, final - window + 1), final):
        rolling.push(step, skipped)
    return rolling.tail
