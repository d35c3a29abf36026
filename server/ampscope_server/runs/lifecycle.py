"""Run lifecycle beyond ingest: delete a run (admin), prune a project's old runs (a service).

A deleted run leaves a tombstone, so its hook, still sending, gets 410 `RunDeleted` rather
than recreating the run from its next batch.
"""

from __future__ import annotations

import time

from sqlalchemy.orm import Session

from ampscope_server.live import hub as live
from ampscope_server.runs.schemas import DeletedRead
from ampscope_server.store import access_repository, steps_repository
from ampscope_server.store.models import Run


def delete_run(session: Session, run: Run, now: float | None = None) -> DeletedRead:
    now = time.time() if now is None else now
    steps = steps_repository.step_aggregates(session, [run.id]).get(run.id, (0, None, 0, None))[0]
    access_repository.delete_run(session, run, now)
    live.notify_after_commit(session, run.id)  # its open pages learn it is gone
    return DeletedRead(id=run.id, project=run.project, deleted_at=now, steps=steps)


def prune(session: Session, project: str, older_than_s: float, now: float | None = None
          ) -> list[DeletedRead]:
    """Delete the project's runs whose last ingest is older than `older_than_s` seconds."""
    now = time.time() if now is None else now
    return [delete_run(session, run, now)
            for run in access_repository.runs_older_than(session, project, now - older_than_s)]


def parse_age(text: str) -> float:
    """An age such as '30d', '12h' or '90m' (units d, h, m, s) → seconds; ValueError with the
    accepted forms otherwise."""
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    number, unit = text[:-1], text[-1:].lower()
    if unit not in units or not number.isdigit():
        raise ValueError(f"age {text!r} is not a whole number followed by d, h, m or s "
                         "(e.g. 30d)")
    return int(number) * units[unit]
