"""Ingest one wire batch: all-or-nothing, idempotent, in the caller's transaction.

Rules (docs/contracts.md): per-layer arrays must match the run's layer table (422); layer stats
for a run without a layer table, or a layer table that differs from the stored one, are 409;
a (run, attempt, seq) already stored is counted as a duplicate and left as it is. `final`
marks the run finished. Live subscribers are told after the transaction commits.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from ampscope_server import codec, live, repository
from ampscope_server.errors import Conflict, InvalidPayload, LayerTableConflict, LayerTableMissing
from ampscope_server.models import CLASSED_STEP_FLOATS, LAYER_STAT_NAMES, Layer
from ampscope_server.schemas import IngestBatch, IngestResult, LayerInfo, RunStatus, StepRecord

_LAYER_FIELDS = ("index", "name", "shape", "dtype", "numel", "module_type")


def ingest_batch(session: Session, batch: IngestBatch, now: float | None = None) -> IngestResult:
    now = time.time() if now is None else now
    run_id = batch.run.id
    repository.touch_run(session, batch.run.model_dump(), now)
    ordinal = _attempt_ordinal(session, batch)
    num_layers = _layer_table(session, batch)
    _check_layer_arrays(batch.records, num_layers, run_id)

    new_ids = repository.insert_steps(
        session, [_step_row(run_id, batch.attempt.id, record) for record in batch.records]
    )
    repository.insert_layer_stats(session, [
        row
        for record in batch.records
        if record.seq in new_ids and record.layers is not None
        for row in _layer_stat_rows(new_ids[record.seq], record)
    ])
    if batch.final:
        repository.set_run_status(session, run_id, RunStatus.FINISHED.value)
    elif new_ids:
        repository.set_run_status(session, run_id, RunStatus.ACTIVE.value)
    live.notify_after_commit(session, run_id)
    return IngestResult(
        run_id=run_id, attempt=ordinal, accepted=len(new_ids),
        duplicates=len(batch.records) - len(new_ids),
    )


def _attempt_ordinal(session: Session, batch: IngestBatch) -> int:
    attempt = repository.get_attempt(session, batch.attempt.id)
    if attempt is None:
        attempt = repository.create_attempt(
            session, batch.attempt.id, batch.run.id, batch.attempt.pid, batch.attempt.started_at
        )
    elif attempt.run_id != batch.run.id:
        raise Conflict(
            f"attempt '{batch.attempt.id}' belongs to run '{attempt.run_id}', "
            f"not to run '{batch.run.id}'"
        )
    return attempt.ordinal


def _layer_table(session: Session, batch: IngestBatch) -> int | None:
    """Store the batch's layer table or check it against the stored one; its length or None."""
    stored = repository.get_layers(session, batch.run.id)
    if batch.layers is None:
        return len(stored) if stored else None
    if not stored:
        repository.insert_layers(session, [
            {"run_id": batch.run.id, **layer.model_dump()} for layer in batch.layers
        ])
        return len(batch.layers)
    _compare_tables(batch.run.id, stored, batch.layers)
    return len(stored)


def _compare_tables(run_id: str, stored: Sequence[Layer], sent: Sequence[LayerInfo]) -> None:
    if len(stored) != len(sent):
        raise LayerTableConflict(
            f"the layer table sent for run '{run_id}' has {len(sent)} layers, "
            f"the stored one has {len(stored)}"
        )
    for old, new in zip(stored, sent, strict=True):
        for field in _LAYER_FIELDS:
            if getattr(old, field) != getattr(new, field):
                raise LayerTableConflict(
                    f"the layer table sent for run '{run_id}' differs from the stored one at "
                    f"layer {new.index}: {field} is {getattr(new, field)!r}, "
                    f"stored {getattr(old, field)!r}"
                )


def _check_layer_arrays(
    records: Sequence[StepRecord], num_layers: int | None, run_id: str
) -> None:
    for position, record in enumerate(records):
        if record.layers is None:
            continue
        if num_layers is None:
            raise LayerTableMissing(
                f"records[{position}] carries layer statistics, but run '{run_id}' has no layer "
                "table yet and this batch sends none"
            )
        for name in LAYER_STAT_NAMES:
            count = len(getattr(record.layers, name))
            if count != num_layers:
                raise InvalidPayload(
                    f"records[{position}].layers.{name} has {count} entries, but the run's "
                    f"layer table has {num_layers} layers"
                )


def _step_row(run_id: str, attempt_id: str, record: StepRecord) -> dict[str, Any]:
    row: dict[str, Any] = {
        "run_id": run_id,
        "attempt_id": attempt_id,
        "seq": record.seq,
        "step": record.step,
        "wall_time": record.wall_time,
        "growth_tracker": record.growth_tracker,
        "found_inf": record.found_inf,
        "skipped": record.skipped,
    }
    for name in CLASSED_STEP_FLOATS:
        row[name], row[f"{name}_class"] = codec.to_storage(getattr(record, name))
    return row


def _layer_stat_rows(step_id: int, record: StepRecord) -> list[dict[str, Any]]:
    assert record.layers is not None
    columns = [getattr(record.layers, name) for name in LAYER_STAT_NAMES]
    return [
        {"step_id": step_id, "layer_index": index,
         **dict(zip(LAYER_STAT_NAMES, values, strict=True))}
        for index, values in enumerate(zip(*columns, strict=True))
    ]
