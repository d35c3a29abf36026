"""Revision 0010 (integer run keys in `steps` and `layer_stats`) keeps every value and every
step id, both ways, on both dialects.

Two runs are ingested at the head (then taken to 0010), one of them resumed by a second
attempt, with non-finite losses, scales and grad norms, null statistics, counts past 2^53,
activation statistics with NaN and ±inf, histograms, non-finite layers, misuse, re-checks and
swallowed fractions. Every
row is read by raw SQL in terms of the public ids (the layout-independent view), so the 0009
rows must equal the head's, and the head's after downgrade and upgrade again. Step ids go on
after the round trip (no id handed out twice), and a run deleted cascades to its steps.
"""

from __future__ import annotations

from typing import Any

import pytest

from ampscope_server.store import db
from tests.migrations.support import delete_run, query
from tests.server.wire import activations, batch_v2, histogram, layer_stats, new_id, record_v2
from tests.support.ingest import ingest_into

# One revision's data kept both ways on both dialects: `make test` runs it; `make test-fast`
# leaves it to whoever touches the migrations (test_migrations.py keeps the models-against-
# schema check in the fast tier).
pytestmark = pytest.mark.slow

NONFINITE = [{"layer": 1, "kind": "inf"}, {"layer": 0, "kind": "nan"}]
MISUSE = [{"kind": "unscale_twice", "detail": "unscale_ called twice\nbefore step"}]
RECHECK = {"status": "persisted", "loss": "nan", "layers": [{"layer": 1, "kind": "nan"}],
           "detail": None}
SHARED = ("seq", "step", "wall_time", "loss", "loss_class", "scale_before",
          "scale_before_class", "scale_after", "scale_after_class", "growth_tracker",
          "found_inf", "skipped", "grad_norm", "grad_norm_class", "lr", "lr_class", "duration",
          "duration_class", "captured", "nonfinite_count", "misuse_count")
CHILDREN = {"step_nonfinite": "step_id, position", "misuse_events": "step_id, position",
            "activation_stats": "step_id, module_index", "histograms": "step_id, layer_index",
            "step_rechecks": "step_id", "swallowed_stats": "step_id, layer_index"}


def _record(seq: int) -> dict[str, Any]:
    stats = layer_stats(seed=1.0 + seq % 5)
    stats["amax"] = [None if seq % 4 == 0 else 0.5 + seq, 0.0]
    stats["inf_count"] = [2**62 + seq, 0]
    odd = seq % 2 == 1
    rec = record_v2(
        seq, step=seq * 3, loss={3: "nan", 5: "inf"}.get(seq, 1.0 + seq),
        scale_before={4: "inf", 6: "-inf", 7: None}.get(seq, 65536.0),
        grad_norm="nan" if seq == 2 else 0.5, found_inf=odd, skipped=odd,
        captured="before_unscale", nonfinite=NONFINITE if odd else [],
        misuse=MISUSE if seq == 1 else [], activations=activations() if seq % 3 == 0 else None,
        histogram=histogram() if seq % 3 == 1 else None,
        layers=stats if seq % 2 == 0 else None,
        recheck=RECHECK if odd else None, swallowed=[0.5, None] if seq % 3 == 2 else None)
    return rec


def _ingest_seqs(url: str, run_id: str, seqs: range, attempt_id: str | None = None) -> None:
    payload = batch_v2([_record(seq) for seq in seqs], run_id=run_id, attempt_id=attempt_id)
    payload["schema_version"] = 3
    ingest_into(url, payload)


def _snapshot(url: str, keyed: bool) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of `steps`, `layer_stats` and the step children, by the public ids."""
    if keyed:
        steps = ('JOIN runs r ON r."key" = s.run_key '
                 "JOIN attempts a ON a.run_id = r.id AND a.ordinal = s.attempt")
        stats = 'JOIN runs r ON r."key" = l.run_key'
    else:
        steps = "JOIN runs r ON r.id = s.run_id JOIN attempts a ON a.id = s.attempt_id"
        stats = "JOIN runs r ON r.id = l.run_id"
    out = {
        "steps": query(url, f"SELECT s.id, r.id, a.id, {', '.join(f's.{c}' for c in SHARED)} "
                            f"FROM steps s {steps} ORDER BY s.id"),
        "layer_stats": query(url, f"SELECT l.step_id, r.id, l.layers, l.data FROM "
                                  f"layer_stats l {stats} ORDER BY l.step_id"),
    }
    for table, order in CHILDREN.items():
        out[table] = query(url, f"SELECT * FROM {table} ORDER BY {order}")
    return out


def ingest_runs(url: str) -> tuple[str, str]:
    """Two runs at the head, the first resumed by a second attempt; (first, second)."""
    db.upgrade(url)
    first, second = new_id(), new_id()
    _ingest_seqs(url, first, range(0, 9))
    _ingest_seqs(url, second, range(0, 6))
    _ingest_seqs(url, first, range(0, 4), attempt_id=new_id())  # resumed: attempt 2
    return first, second


def test_0010_keeps_every_value_and_step_id_both_ways(db_url: str) -> None:
    first, second = ingest_runs(db_url)
    db.downgrade(db_url, "0010")  # the step children one row per entry, as 0010 has them
    head = _snapshot(db_url, keyed=True)
    assert len(head["steps"]) == 19 and len(head["layer_stats"]) == 10
    assert {table: len(rows) for table, rows in head.items() if table in CHILDREN} == {
        "step_nonfinite": 18, "misuse_events": 3, "activation_stats": 21, "histograms": 12,
        "step_rechecks": 9, "swallowed_stats": 12}
    # Non-finite values are stored as their class, never lost: NaN loss (class 1), +inf (2).
    assert {(row[3], row[6], row[7]) for row in head["steps"] if row[3] in (3, 5)} == {
        (3, None, 1), (5, None, 2)}

    db.downgrade(db_url, "0009")
    assert _snapshot(db_url, keyed=False) == head
    assert query(db_url, "SELECT count(*) FROM steps s JOIN attempts a ON a.id = s.attempt_id "
                         "WHERE a.ordinal = 2") == [(4,)]

    db.upgrade(db_url, "0010")
    assert _snapshot(db_url, keyed=True) == head
    db.upgrade(db_url)
    last_id = max(row[0] for row in head["steps"])
    _ingest_seqs(db_url, first, range(9, 11))
    new_ids = [row[0] for row in query(db_url, "SELECT id FROM steps WHERE step >= 27")]
    assert len(new_ids) == 2 and min(new_ids) > last_id

    # The run key cascades: deleting a run deletes its steps and their children, only its.
    keys = query(db_url, f"SELECT \"key\" FROM runs WHERE id = '{second}'")
    delete_run(db_url, second)
    assert query(db_url, f"SELECT count(*) FROM steps WHERE run_key = {keys[0][0]}") == [(0,)]
    assert query(db_url, "SELECT count(*) FROM steps") == [(15,)]
    assert query(db_url, "SELECT count(*) FROM layer_stats l LEFT JOIN steps s "
                         "ON s.id = l.step_id WHERE s.id IS NULL") == [(0,)]
