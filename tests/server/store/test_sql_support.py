"""Repository support on both dialects: `in_ids` selects exactly the rows of the given ids."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ampscope_server.store import sql_support
from ampscope_server.store.models import Step
from tests.server.wire import batch, new_id, record
from tests.support.ingest import ingest_payload


def test_in_ids_selects_exactly_the_given_ids(sessions: sessionmaker[Session]) -> None:
    run_id = new_id()
    ingest_payload(sessions, batch([record(seq, with_layers=False) for seq in range(1200)],
                                   run_id=run_id))
    with sessions() as session:
        ids = list(session.scalars(select(Step.id).order_by(Step.id)))
        for asked in ([], ids[:1], ids[::7], ids[:sql_support.KEYS_PER_STATEMENT],
                      [ids[-1] + 1, ids[3], -5]):
            found = session.scalars(select(Step.id).where(
                sql_support.in_ids(session, Step.id, asked)).order_by(Step.id))
            assert list(found) == sorted(set(asked) & set(ids))
