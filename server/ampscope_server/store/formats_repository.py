"""Repository: wire v7's scaled-format what-ifs (`step_formats`, one row per sampled step).
Functions take a Session and never commit."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from ampscope_server.store.models import StepFormats
from ampscope_server.store.sql_support import KEYS_PER_STATEMENT, in_ids


def formats_of(session: Session, step_ids: Sequence[int]) -> list[StepFormats]:
    """The rows of the given steps (most steps have none), by step id; KEYS_PER_STATEMENT ids a
    statement."""
    ids = sorted(set(step_ids))
    out: list[StepFormats] = []
    for first in range(0, len(ids), KEYS_PER_STATEMENT):
        out.extend(session.scalars(
            select(StepFormats)
            .where(in_ids(session, StepFormats.step_id, ids[first:first + KEYS_PER_STATEMENT]))
            .order_by(StepFormats.step_id)))
    return out
