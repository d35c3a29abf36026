"""What a batch's newly stored steps add to their run's counters (`run_counters`), folded in
the batch's transaction: the runs list reads them instead of counting steps
(`runs.summary_cache` keeps the cached analysis beside them)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from ampscope_server.ingest.wire import StepRecord
from ampscope_server.store import run_counters_repository
from ampscope_server.store.float_storage import to_storage
from ampscope_server.store.run_counters_repository import CountersDelta


def counters_delta(new: Sequence[tuple[int, StepRecord]]) -> CountersDelta | None:
    """What a batch's newly stored (step id, record) add to the run's counters; None: nothing."""
    if not new:
        return None
    newest_id, newest = max(new, key=lambda item: item[0])
    return CountersDelta(
        num_steps=len(new),
        skipped_steps=sum(1 for _, record in new if record.skipped),
        nonfinite_steps=sum(1 for _, record in new if record.found_inf),
        last_step=max(record.step for _, record in new),
        last_id=newest_id,
        last_scale=to_storage(newest.scale_after),
        last_loss=to_storage(newest.loss),
    )


def count_new_steps(session: Session, run_id: str, new: Sequence[tuple[int, StepRecord]]) -> None:
    """Fold a batch's newly stored steps (never duplicates) into the run's counters, in the
    batch's transaction."""
    delta = counters_delta(new)
    if delta is not None:
        run_counters_repository.add_steps(session, run_id, delta)
