"""Service: the per-layer fold of each run's open `LAYER_FINEST` bucket, remembered in this
process from one ingest batch to the next.

Why: a batch that closes the bucket holding the run's last step folds that bucket's earlier
steps, stored by earlier batches: up to 63 raw steps read back, unpacked and reduced on nearly
every batch (at 50 records a batch with statistics on every step, about as much work as the
batch's own steps). Ingest remembers the fold of the bucket its batch leaves open once the batch
has committed (`remember`); the next batch takes it (`recall`) when the database holds exactly
the steps it was folded from: as many layer steps in the bucket below the batch's first id,
with the same smallest and largest ids (`rollups_repository.layer_step_marks`, an index read).
Anything else (another process's batch in between, a rolled-back batch, a resumed attempt
re-sending old steps, an evicted entry) finds other marks, and the bucket is folded from its
raw steps as before. Exact either way: both are the same fold of the same steps.

One cache per engine (a database's run keys mean nothing in another's), keyed by the run's id
and key, at most CAPACITY runs each, the least recently used dropped first.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session

from ampscope_server.store import rollups, rollups_repository

CAPACITY = 128
"""Runs remembered per engine: ~160 KB each at 500 layers, so ~20 MB at most."""

_PENDING = "ampscope.open_buckets"


@dataclass(frozen=True)
class OpenBucket:
    """The fold of a run's `LAYER_FINEST` bucket over its layer steps with ids first…last."""

    bucket: int
    layers: rollups.LayerArrays
    layer_steps: int
    first_id: int
    last_id: int


RunKey = tuple[str, int]  # (runs.id, runs.key)
_caches: weakref.WeakKeyDictionary[Engine, OrderedDict[RunKey, OpenBucket]] = (
    weakref.WeakKeyDictionary())
_lock = threading.Lock()


def _engine(session: Session) -> Engine:
    bind = session.get_bind()
    return bind if isinstance(bind, Engine) else bind.engine


def recall(session: Session, run: RunKey, bucket: int, before_id: int
           ) -> OpenBucket | None:
    """The remembered fold of `bucket`, if it is still the fold of the run's layer steps in it
    with ids below `before_id`."""
    with _lock:
        entry = _caches.get(_engine(session), OrderedDict()).get(run)
    if entry is None or entry.bucket != bucket:
        return None
    width = 1 << rollups.LAYER_FINEST
    count, first, last = rollups_repository.layer_step_marks(
        session, run[0], bucket * width, (bucket + 1) * width - 1, before_id)
    if (count, first, last) != (entry.layer_steps, entry.first_id, entry.last_id):
        return None
    return entry


def remember(session: Session, run: RunKey, entry: OpenBucket | None) -> None:
    """Keep `entry` as the run's open bucket once this session's transaction commits (None:
    forget the run's, as its fold is not known)."""
    session.info.setdefault(_PENDING, []).append((_engine(session), run, entry))


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    pending = session.info.pop(_PENDING, ())
    with _lock:
        for engine, run, entry in pending:
            cache = _caches.setdefault(engine, OrderedDict())
            cache.pop(run, None)
            if entry is not None:
                cache[run] = entry
                if len(cache) > CAPACITY:
                    cache.popitem(last=False)


@event.listens_for(Session, "after_soft_rollback")
def _after_rollback(session: Session, _previous: object) -> None:
    session.info.pop(_PENDING, None)
