"""Revision 0013 (step and skip counts in the series rollups) backfills exactly what ingest
writes, and keeps every series blob bit for bit, both ways, on both dialects.

The runs of `test_rollup_run_keys` (NaN and ±inf in the series, skipped steps, a resumed
attempt re-sending 100 stored steps with other skip flags) are ingested at the head; the
counts must equal a brute force over each step number's first stored row. After the downgrade
the 0012 rows must be the head's without the counts; after the upgrade the backfilled counts
must be what ingest wrote.
"""

from __future__ import annotations

from typing import Any

import pytest

from ampscope_server.store import db, rollups
from tests.migrations.support import decoded, query
from tests.migrations.test_rollup_run_keys import ingest_runs, snapshot

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow


def _brute_force(url: str) -> dict[tuple[Any, int, int], tuple[int, int]]:
    """{(run id, level, bucket): (step numbers, skipped ones)} from each step number's first
    stored row."""
    firsts: dict[tuple[Any, int], bool] = {}
    for run, step, skipped in query(url, 'SELECT r.id, s.step, s.skipped FROM steps s JOIN runs r '
                                         'ON r."key" = s.run_key ORDER BY s.id'):
        firsts.setdefault((run, int(step)), bool(skipped))
    out: dict[tuple[Any, int, int], tuple[int, int]] = {}
    for (run, step), skipped in firsts.items():
        for level in rollups.SERIES_LEVELS:
            steps, skips = out.get((run, level, step >> level), (0, 0))
            out[(run, level, step >> level)] = (steps + 1, skips + skipped)
    return out


def test_0013_backfills_the_counts_ingest_writes(db_url: str) -> None:
    first, _ = ingest_runs(db_url)
    head = snapshot(db_url, keyed=True, extra=", t.step_count, t.skip_count")
    counts = {(run, int(level), int(bucket)): (int(steps), int(skips))
              for run, level, bucket, _, steps, skips in head["rollups"]}
    assert counts == _brute_force(db_url)
    # The resumed attempt re-sent steps 600-699 skipped where the first rows were not.
    assert counts[(first, 6, 600 >> 6)] == (64, 9)
    assert sum(skips for (run, level, _), (_, skips) in counts.items()
               if run == first and level == 16) == len(
        [step for step in range(760)
         if step % 7 == 3 or 500 <= step < 540 or (step >= 700 and step % 3 == 0)])

    db.downgrade(db_url, "0012")
    down = snapshot(db_url, keyed=True)
    assert down["rollups"] == [row[:4] for row in head["rollups"]]
    # Revision 0015 lays the blobs out anew, value for value.
    assert decoded(down["layer_rollups"]) == decoded(head["layer_rollups"])
    db.upgrade(db_url)
    assert snapshot(db_url, keyed=True, extra=", t.step_count, t.skip_count") == head
