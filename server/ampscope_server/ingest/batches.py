"""Ingest one wire batch (v1 … v7): all-or-nothing, idempotent, in the caller's transaction.

Rules (docs/contracts.md): per-layer and per-module data must fit the run's tables (422,
`batch_checks`); data for a table the run does not have, or a table that differs from the
stored one, is 409; a (run, attempt, seq) already stored is counted as a duplicate and none of
its children (layer and activation stats, non-finite layers, misuse, histograms, FP32
re-checks, swallowed fractions, per-rank and per-optimizer values, shadow steps, format
what-ifs) is written again. The run's fields (name, host, rank, world size, …) are those of its
first batch. The client's accounting is kept per attempt when it is newer (largest
`produced`). `final` marks the run finished. Live subscribers are told after the transaction
commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from ampscope_server.access.principal import ANONYMOUS, Principal
from ampscope_server.errors import (
    Conflict,
    Forbidden,
    LayerTableConflict,
    ModuleTableConflict,
    RunDeleted,
    RunNotFound,
)
from ampscope_server.ingest import batch_checks, counters
from ampscope_server.ingest.schemas import IngestResult
from ampscope_server.ingest.wire import ClientAccounting, IngestBatch, StepRecord
from ampscope_server.live import hub as live
from ampscope_server.runs.schemas import RunStatus
from ampscope_server.store import (
    access_repository,
    format_packing,
    open_buckets,
    rank_packing,
    rollups,
    rollups_repository,
    runs_repository,
    stat_packing,
    steps_repository,
)
from ampscope_server.store.float_storage import to_storage
from ampscope_server.store.models import (
    CLASSED_STEP_FLOATS,
    CLIENT_FIELDS,
    LAYER_STAT_KINDS,
    LAYER_STAT_NAMES,
    SHADOW_KINDS,
    ActivationStat,
    Attempt,
    Base,
    Histogram,
    LayerStat,
    MisuseEvent,
    StepFormats,
    StepNonfinite,
    StepOptimizers,
    StepRanks,
    StepRecheck,
    StepShadow,
    SwallowedStat,
)

Rows = list[dict[str, Any]]


def ingest_batch(
    session: Session, batch: IngestBatch, now: float | None = None,
    writer: Principal = ANONYMOUS,
) -> IngestResult:
    now = time.time() if now is None else now
    run_id = batch.run.id
    # Packing is CPU work (zlib lets go of the GIL): done before the first write, so that it
    # overlaps with another batch's transaction instead of holding SQLite's write lock.
    packed = [_pack_layers(record, early=True) for record in batch.records]
    # A write first, so SQLite takes the write lock before any read of this transaction (no
    # snapshot to upgrade); a refused batch rolls it back with everything else.
    access_repository.ensure_project(session, batch.run.project, now)
    authorize(session, writer, batch)
    key = runs_repository.touch_run(session, batch.run.model_dump(), now)
    attempt = _attempt(session, batch)
    batch_checks.check_records(
        batch.records, run_id, _layer_table(session, batch), _module_table(session, batch)
    )

    # The run's last step before this batch: which buckets this batch closes (`_layer_rows`).
    extent = rollups_repository.step_extent(session, run_id)
    new_ids = steps_repository.insert_steps(
        session, [_step_row(key, attempt.ordinal, record) for record in batch.records]
    )
    new = [(new_ids[record.seq], record) for record in batch.records if record.seq in new_ids]
    blobs = {record.seq: blob for record, blob in zip(batch.records, packed, strict=True)}
    steps_repository.insert_rows(session, LayerStat, [
        {"step_id": step_id, "run_key": key, "layers": blob[1], "data": blob[0]}
        for step_id, record in new
        if (blob := blobs[record.seq] or _pack_layers(record)) is not None])
    for model, rows_of in _CHILDREN:
        steps_repository.insert_rows(
            session, model, [row for step_id, record in new for row in rows_of(step_id, record)]
        )
    for model, packed_of in _PACKED:
        steps_repository.insert_rows(session, model, [
            {"step_id": step_id, "run_key": key, **row}
            for step_id, record in new if (row := packed_of(record)) is not None])
    _update_rollups(session, run_id, key, new, None if extent is None else extent[1])
    counters.count_new_steps(session, run_id, new)
    if batch.client is not None and is_newer(batch.client, stored_client(attempt)):
        runs_repository.set_attempt_client(session, attempt.id, {
            f"client_{name}": getattr(batch.client, name) for name in CLIENT_FIELDS
        })
    if batch.final:
        runs_repository.set_run_status(session, run_id, RunStatus.FINISHED.value)
    elif new_ids:
        runs_repository.set_run_status(session, run_id, RunStatus.ACTIVE.value)
    live.notify_after_commit(session, run_id)
    return IngestResult(
        run_id=run_id, attempt=attempt.ordinal, accepted=len(new_ids),
        duplicates=len(batch.records) - len(new_ids),
    )


def authorize(session: Session, writer: Principal, batch: IngestBatch) -> None:
    """The writer may add to this run: its project is the writer's (403 for a new run of
    another project, 404 for an existing one: existence is not leaked) and it was not deleted
    (410)."""
    project = batch.run.project
    stored = runs_repository.get_run(session, batch.run.id)
    if stored is not None and not writer.sees(stored.project):
        raise RunNotFound(batch.run.id)
    if not writer.sees(project):
        raise Forbidden(f"this token writes to project '{writer.project}', but the batch's run "
                        f"is in project '{project}' (pass project='{writer.project}' to watch)")
    if stored is None and access_repository.tombstone(session, batch.run.id) is not None:
        raise RunDeleted(batch.run.id)


def _attempt(session: Session, batch: IngestBatch) -> Attempt:
    attempt = runs_repository.get_attempt(session, batch.attempt.id)
    if attempt is None:
        return runs_repository.create_attempt(
            session, batch.attempt.id, batch.run.id, batch.attempt.pid, batch.attempt.started_at
        )
    if attempt.run_id != batch.run.id:
        raise Conflict(
            f"attempt '{batch.attempt.id}' belongs to run '{attempt.run_id}', "
            f"not to run '{batch.run.id}'"
        )
    return attempt


def _layer_table(session: Session, batch: IngestBatch) -> list[int] | None:
    """Store the batch's layer table or check it against the stored one; the numels or None."""
    if batch.layers is None:  # most batches: only the numels are needed, not the table's rows
        return runs_repository.layer_numels(session, batch.run.id) or None
    stored = runs_repository.get_layers(session, batch.run.id)
    if not stored:
        runs_repository.insert_layers(session, [
            {"run_id": batch.run.id, **layer.model_dump()} for layer in batch.layers
        ])
        return [layer.numel for layer in batch.layers]
    batch_checks.compare_tables(
        batch.run.id, stored, batch.layers, batch_checks.LAYER_FIELDS, "layer", LayerTableConflict,
        batch_checks.SAME_LAYER,
    )
    return [layer.numel for layer in stored]


def _module_table(session: Session, batch: IngestBatch) -> int | None:
    """Store the batch's module table or check it against the stored one; its length or None."""
    stored = runs_repository.get_modules(session, batch.run.id)
    if batch.modules is None:
        return len(stored) if stored else None
    if not stored:
        runs_repository.insert_modules(session, [
            {"run_id": batch.run.id, **module.model_dump()} for module in batch.modules
        ])
        return len(batch.modules)
    batch_checks.compare_tables(
        batch.run.id, stored, batch.modules, batch_checks.MODULE_FIELDS, "module",
        ModuleTableConflict,
    )
    return len(stored)


def _update_rollups(session: Session, run_id: str, key: int,
                    new: list[tuple[int, StepRecord]], old_last: int | None) -> None:
    """Fold the newly stored steps (never duplicates) into the run's rollups (`key`: its
    `runs.key`); `old_last` is the run's last step before them.

    Read-modify-write is safe: `touch_run` already wrote the run's row, so batches of one run
    are serialised (row lock on Postgres, the write lock on SQLite) until this one commits.
    """
    if not new:
        return
    ordered = sorted(new, key=lambda item: (item[1].step, item[0]))
    # Which new steps are the first stored of their step number (the skip counts take each
    # step number once): not stored before this batch, nor earlier in it.
    seen = _seen_steps(session, run_id, new, old_last)
    firsts: list[bool] = []
    for _, record in ordered:
        firsts.append(record.step not in seen)
        seen.add(record.step)
    delta = rollups.accumulate(
        rollups.StepInput(
            step=record.step,
            series=[getattr(record, name) for name in rollups.SERIES],
            layers=None if record.layers is None else {
                name: getattr(record.layers, name) for name in LAYER_STAT_NAMES
            },
            skipped=record.skipped,
            first=first,
        )
        for (_, record), first in zip(ordered, firsts, strict=True)
    )
    kept = sorted(bucket for bucket in delta if bucket[0] in rollups.SERIES_LEVELS)
    for level, index, series_blob, step_count, skip_count in rollups_repository.get_rollups(
        session, run_id, kept, ("series", "step_count", "skip_count")
    ):
        got = delta[(level, index)]
        stored = rollups.unpack_series(series_blob)
        for mine, theirs in zip(stored, got.series, strict=True):
            mine.merge(theirs)
        got.series = stored
        got.steps += int(step_count)
        got.skips += int(skip_count)
    rollups_repository.upsert_rollups(
        session, [rollups.to_row(key, bucket, delta[bucket]) for bucket in kept]
    )
    new_last = max(ordered[-1][1].step, -1 if old_last is None else old_last)
    first_new_id = min(step_id for step_id, _ in new)
    rows, earlier = _layer_rows(session, (run_id, key), delta, first_new_id, old_last,
                                new_last)
    rollups_repository.upsert_layer_rollups(session, [
        rollups.to_layer_row(key, bucket, arrays) for bucket, arrays in rows
    ])
    open_buckets.remember(session, (run_id, key), _open_bucket(
        session, (run_id, key), new, delta, first_new_id, old_last, new_last, earlier))


def _open_bucket(
    session: Session, run: open_buckets.RunKey, new: list[tuple[int, StepRecord]],
    delta: dict[tuple[int, int], rollups.Bucket], first_new_id: int, old_last: int | None,
    new_last: int, earlier: open_buckets.OpenBucket | None,
) -> open_buckets.OpenBucket | None:
    """The fold of the `LAYER_FINEST` bucket this batch leaves open (holding `new_last`), for
    the next batch (`open_buckets`); None when it is not known without reading raw steps.

    Its earlier steps: none when the bucket is new to the run; else the fold of the bucket
    that held `old_last`, as `_layer_rows` found it (`earlier`), or remembered from the batch
    before."""
    finest = rollups.LAYER_FINEST
    index = new_last >> finest
    if old_last is None or old_last >> finest != index:
        old = None
    else:
        old = earlier if earlier is not None else open_buckets.recall(session, run, index,
                                                                      first_new_id)
        if old is None:
            return None
    ids = [step_id for step_id, record in new
           if record.layers is not None and record.step >> finest == index]
    got = delta.get((finest, index))
    if not ids or got is None or got.layers is None:
        return old
    if old is None:
        return open_buckets.OpenBucket(index, got.layers, got.layer_steps, min(ids), max(ids))
    layers = rollups.merge_layers(old.layers, got.layers)
    assert layers is not None  # both sides hold layers
    return open_buckets.OpenBucket(index, layers, old.layer_steps + got.layer_steps,
                                   min(old.first_id, *ids), max(old.last_id, *ids))


def _seen_steps(session: Session, run_id: str, new: list[tuple[int, StepRecord]],
                old_last: int | None) -> set[int]:
    """The step numbers of `new` that the run stored before this batch (a resumed attempt
    re-sending steps): their skip flags are counted already. Asked only when a new step lies
    at or before the run's last one, so a run that only moves on pays no query."""
    if old_last is None:
        return set()
    earlier = [record.step for _, record in new if record.step <= old_last]
    if not earlier:
        return set()
    return rollups_repository.stored_steps(session, run_id, earlier,
                                           min(step_id for step_id, _ in new))


def _layer_rows(
    session: Session, run: open_buckets.RunKey, delta: dict[tuple[int, int], rollups.Bucket],
    first_new_id: int, old_last: int | None, new_last: int,
) -> tuple[list[tuple[tuple[int, int], rollups.LayerArrays]], open_buckets.OpenBucket | None]:
    """The per-layer rollup rows this batch writes, finest level first, and the fold of the
    `LAYER_FINEST` bucket that held `old_last` over its earlier steps when this batch needed it
    (None otherwise).

    Only closed buckets have rows (`rollups.is_closed`). A bucket this batch closes holds only
    new steps, except the one that held `old_last` at each level: at `LAYER_FINEST` its older
    raw steps are folded in (at most 63), above it its children's rows (at most 3) and the
    child this batch closed. A closed bucket that gets steps again (a resumed attempt) merges
    them into its row; a `LAYER_FINEST` one without a row (sparse) is folded again from its
    raw steps.
    """
    finest = rollups.LAYER_FINEST
    before = -1 if old_last is None else old_last
    held = {level: None if old_last is None else before >> level
            for level in rollups.LAYER_LEVELS}
    settle: dict[int, set[int]] = {level: set() for level in rollups.LAYER_LEVELS}
    for (level, index), bucket in delta.items():
        if level in settle and bucket.layers is not None and rollups.is_closed(
                level, index, new_last):
            settle[level].add(index)
    children: list[tuple[int, int]] = []
    for level in rollups.LAYER_LEVELS:
        tail = held[level]
        if tail is not None and rollups.is_closed(level, tail, new_last):
            settle[level].add(tail)
            if level != finest:
                closed, _ = rollups.open_children(level, tail, before)
                children.extend((rollups.children(level, tail)[0], child) for child in closed)
    run_id = run[0]
    keys = [(level, index) for level, indices in settle.items() for index in indices]
    stored = rollups_repository.get_layer_rollups(session, run_id, keys + children)
    refold = [index for index in settle[finest] if (finest, index) not in stored
              and (index == held[finest] or rollups.is_closed(finest, index, old_last))]
    refold += [child for level, child in children
               if level == finest and (level, child) not in stored]
    # The bucket that held `old_last` was folded by the batch before, as its open bucket.
    earlier, tail = None, held[finest]
    if tail is not None and tail in refold:
        refold.remove(tail)
        earlier = _earlier_fold(session, run, tail, first_new_id)
    raw = rollups_repository.fold_finest(session, run_id, refold, before_id=first_new_id)
    if earlier is not None:
        raw[earlier.bucket] = (earlier.layers, earlier.layer_steps)
    finals: dict[tuple[int, int], rollups.LayerArrays | None] = {}
    out: list[tuple[tuple[int, int], rollups.LayerArrays]] = []
    for level in rollups.LAYER_LEVELS:
        for index in sorted(settle[level]):
            key = (level, index)
            got = delta.get(key)
            mine = None if got is None else got.layers
            if key in stored:
                row = rollups.unpack_layers(stored[key])
                merged = rollups.merge_layers(row, mine)
                # Nothing worse arrived for any layer: not rewritten (no packing, no dead row).
                keep = merged != row
            elif level == finest:
                old, count = raw.get(index, (None, 0))
                merged = rollups.merge_layers(old, mine)
                keep = rollups.keeps_row(level, merged,
                                         count + (0 if got is None else got.layer_steps))
            elif index == held[level]:
                # Its children: closed before (rows, or raw when sparse), the one that held
                # `old_last` and any later ones, all settled above.
                finer, every = rollups.children(level, index)
                parts = [part for child in every
                         if (part := _final(finer, child, finals, stored, raw)) is not None]
                merged = rollups.reduce_layers(parts) if parts else None
                keep = merged is not None
            else:
                merged, keep = mine, mine is not None
            finals[key] = merged
            if keep and merged is not None:
                out.append((key, merged))
    return out, earlier


def _earlier_fold(session: Session, run: open_buckets.RunKey, index: int, first_new_id: int
                  ) -> open_buckets.OpenBucket | None:
    """The fold of a `LAYER_FINEST` bucket over its steps stored before this batch: remembered
    (`open_buckets`), else read from its raw steps; None when none of them has layers."""
    remembered = open_buckets.recall(session, run, index, first_new_id)
    if remembered is not None:
        return remembered
    folded = rollups_repository.fold_finest(session, run[0], [index], before_id=first_new_id)
    if index not in folded:
        return None
    width = 1 << rollups.LAYER_FINEST
    _, first, last = rollups_repository.layer_step_marks(
        session, run[0], index * width, (index + 1) * width - 1, first_new_id)
    assert first is not None and last is not None  # the fold found steps
    layers, count = folded[index]
    return open_buckets.OpenBucket(index, layers, count, first, last)


def _final(level: int, index: int, finals: dict[tuple[int, int], rollups.LayerArrays | None],
           stored: dict[tuple[int, int], bytes],
           raw: dict[int, tuple[rollups.LayerArrays, int]]) -> rollups.LayerArrays | None:
    """A closed child's per-layer arrays after this batch: settled by it, else its row, else
    (at `LAYER_FINEST`) its raw steps."""
    if (level, index) in finals:
        return finals[(level, index)]
    if (level, index) in stored:
        return rollups.unpack_layers(stored[(level, index)])
    return raw[index][0] if level == rollups.LAYER_FINEST and index in raw else None


ClientKey = tuple[int, int, int, int]


def _client_key(produced: int, acknowledged: int, dropped: int, replayed: int) -> ClientKey:
    # Ties on `produced` (a close() batch adds acks, not records) go to the more advanced one.
    return produced, acknowledged, dropped, replayed


def stored_client(attempt: Attempt) -> ClientKey | None:
    if attempt.client_produced is None:
        return None
    return _client_key(
        attempt.client_produced, attempt.client_acknowledged or 0, attempt.client_dropped or 0,
        attempt.client_replayed or 0,
    )


def is_newer(sent: ClientAccounting, stored: ClientKey | None) -> bool:
    """Whether the sent accounting replaces the stored one: the largest `produced` wins."""
    key = _client_key(sent.produced, sent.acknowledged, sent.dropped, sent.replayed)
    return stored is None or key > stored


# --- rows ----------------------------------------------------------------------------------------

def _step_row(run_key: int, attempt: int, record: StepRecord) -> dict[str, Any]:
    """The `steps` row of a record: the run and the attempt by their integer keys (`runs.key`,
    `attempts.ordinal`)."""
    row: dict[str, Any] = {
        "run_key": run_key,
        "attempt": attempt,
        "seq": record.seq,
        "step": record.step,
        "wall_time": record.wall_time,
        "growth_tracker": record.growth_tracker,
        "found_inf": record.found_inf,
        "skipped": record.skipped,
        "captured": record.captured,
        "nonfinite_count": None if record.nonfinite is None else len(record.nonfinite),
        "misuse_count": None if record.misuse is None else len(record.misuse),
    }
    for name in CLASSED_STEP_FLOATS:
        row[name], row[f"{name}_class"] = to_storage(getattr(record, name))
    return row


def _pack_layers(record: StepRecord, early: bool = False) -> tuple[bytes, int] | None:
    """The record's layer statistics packed for `layer_stats.data`, and the layer count; None
    without layer statistics. `early` (before `batch_checks`): arrays of unequal lengths give
    None too, and the checks then refuse the batch with their own message."""
    layers = record.layers
    if layers is None:
        return None
    columns = [getattr(layers, name) for name in LAYER_STAT_NAMES]
    try:
        return stat_packing.pack(columns, LAYER_STAT_KINDS), len(columns[0])
    except ValueError:
        if early:
            return None
        raise


def _activation_row(record: StepRecord) -> dict[str, Any] | None:
    """The record's activation statistics packed for `activation_stats` (NaN and ±inf as
    their float64 bits), or None."""
    if record.activations is None:
        return None
    columns = [getattr(record.activations, name) for name in LAYER_STAT_NAMES]
    return {"modules": len(columns[0]),
            "data": stat_packing.pack(columns, LAYER_STAT_KINDS)}


def _nonfinite_rows(step_id: int, record: StepRecord) -> Rows:
    return [
        {"step_id": step_id, "position": position, "layer_index": entry.layer,
         "kind": entry.kind}
        for position, entry in enumerate(record.nonfinite or ())
    ]


def _misuse_rows(step_id: int, record: StepRecord) -> Rows:
    return [
        {"step_id": step_id, "position": position, "kind": entry.kind, "detail": entry.detail}
        for position, entry in enumerate(record.misuse or ())
    ]


def _histogram_row(record: StepRecord) -> dict[str, Any] | None:
    """The record's exponent histograms packed for `histograms`: every layer's counts, layer
    after layer, in one int64 column; or None."""
    histogram = record.histogram
    if histogram is None:
        return None
    flat = [count for counts in histogram.counts for count in counts]
    return {"min_exp": histogram.min_exp, "max_exp": histogram.max_exp,
            "layers": len(histogram.counts), "data": stat_packing.pack([flat], stat_packing.INT)}


def _recheck_rows(step_id: int, record: StepRecord) -> Rows:
    recheck = record.recheck
    if recheck is None:
        return []
    loss, loss_class = to_storage(recheck.loss)
    return [{
        "step_id": step_id, "status": recheck.status, "loss": loss, "loss_class": loss_class,
        "layers": [entry.model_dump() for entry in recheck.layers], "detail": recheck.detail,
        "origin": None if recheck.origin is None else recheck.origin.model_dump(),
    }]


def _swallowed_row(record: StepRecord) -> dict[str, Any] | None:
    """The record's swallowed fractions packed for `swallowed_stats` (None kept), or None."""
    if record.swallowed is None:
        return None
    return {"layers": len(record.swallowed),
            "data": stat_packing.pack([record.swallowed], stat_packing.FLOAT)}


def _shadow_row(record: StepRecord) -> dict[str, Any] | None:
    """The record's FP32 shadow step for `step_shadows`: rel_err, cosine and the FP32 norm packed
    (NaN, ±inf and None kept), the loss as value + class; or None."""
    shadow = record.shadow
    if shadow is None:
        return None
    loss, loss_class = to_storage(shadow.loss)
    rel_err, cosine, norm = shadow.rel_err, shadow.cosine, shadow.norm
    return {"status": shadow.status, "loss": loss, "loss_class": loss_class,
            "layers": len(rel_err) if rel_err is not None else 0,
            "data": stat_packing.pack([rel_err, cosine, norm], SHADOW_KINDS)
            if rel_err is not None and cosine is not None and norm is not None else None,
            "detail": shadow.detail}


def _formats_row(record: StepRecord) -> dict[str, Any] | None:
    """The record's format what-ifs for `step_formats`: its values then its operand statistics,
    the float64 bytes as they arrived (`format_packing`), the layers and recipes comma-joined;
    or None."""
    formats = record.formats
    if formats is None:
        return None
    trained = formats.trained
    return {"step": record.step, "recipes": format_packing.join(formats.recipes),
            "layers": format_packing.join(formats.layers),
            "data": formats.values + formats.operands,
            "trained": None if trained is None else format_packing.join_trained(trained.recipes),
            "trained_data": None if trained is None else trained.amax + trained.scale,
            "scales": formats.scales}


_CHILDREN: Sequence[tuple[type[Base], Callable[[int, StepRecord], Rows]]] = (
    (StepNonfinite, _nonfinite_rows),
    (MisuseEvent, _misuse_rows),
    (StepRecheck, _recheck_rows),
)
"""Each table a step's row-per-entry children go to, with the function that builds a step's
rows for it."""

def _ranks_row(record: StepRecord) -> dict[str, Any] | None:
    ranks = record.ranks
    return None if ranks is None else rank_packing.ranks_row(record.step, ranks.loss,
                                                             ranks.nonfinite)


def _optimizers_row(record: StepRecord) -> dict[str, Any] | None:
    if record.optimizers is None:
        return None
    return rank_packing.optimizers_row([(opt.skipped, opt.lr) for opt in record.optimizers])


_PACKED: Sequence[tuple[type[Base], Callable[[StepRecord], dict[str, Any] | None]]] = (
    (ActivationStat, _activation_row),
    (Histogram, _histogram_row),
    (SwallowedStat, _swallowed_row),
    (StepShadow, _shadow_row),
    (StepFormats, _formats_row),
    (StepRanks, _ranks_row),
    (StepOptimizers, _optimizers_row),
)
"""The tables that take one packed row per step with the run's key (besides `layer_stats`,
packed before the transaction), with the function that packs a record's row (None: the record
carries none)."""
