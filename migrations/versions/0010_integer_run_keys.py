"""Integer run keys in the large tables: `runs.key`, `steps.run_key` and `steps.attempt`,
`layer_stats.run_key`.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

Before, every `steps` row carried the run's and the attempt's 36-character ids, and so did
the unique (run_id, attempt_id, seq) index and the (run_id, step), (run_id, id) indexes;
`layer_stats` had run_id in the row and in its index. At the hook's default cadence that was
~540 bytes a step on Postgres, more than the step's own values (issue #11). After:

- `runs.key`: an integer per run, unique (Postgres: an identity column; on SQLite the row's
  rowid is copied in, and the server gives a new run the largest key + 1);
- `steps.run_key` (`runs.key`, ON DELETE CASCADE) and `steps.attempt` (the attempt's ordinal
  within the run, `attempts.ordinal`) instead of `run_id` and `attempt_id`; unique
  (run_key, attempt, seq), indexes (run_key, step) and (run_key, id); the columns widest
  first, so Postgres pads nothing between them;
- `layer_stats.run_key` instead of `run_id`, index (run_key, step_id).

`steps` and `layer_stats` are rebuilt (rename, create, copy with INSERT … SELECT, drop): every
value is copied by the database itself, so NaN-as-NULL with its class, ±inf, nulls and blobs
stay bit for bit. Step ids are kept, so every step child still points at its step. On SQLite,
foreign keys are on and a renamed parent drags its children's references along, so the step
children (unchanged) are rebuilt too from their own stored DDL; on Postgres their foreign key
is pointed at the new `steps`. The downgrade rebuilds the old layout the same way and drops
`runs.key`. Nothing here imports application code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STEP_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_CHILDREN = ("step_nonfinite", "misuse_events", "activation_stats", "histograms",
             "step_rechecks", "swallowed_stats")
"""The tables whose rows point at a step (besides `layer_stats`); unchanged here."""
_EIGHT = ("seq", "step", "wall_time", "loss", "scale_before", "scale_after", "growth_tracker",
          "grad_norm", "lr", "duration")
_CLASSES = ("loss_class", "scale_before_class", "scale_after_class", "grad_norm_class",
            "lr_class", "duration_class")
_REST = ("nonfinite_count", "misuse_count", *_CLASSES, "found_inf", "skipped", "captured")
"""The step columns both layouts share, besides id and the run and attempt keys."""


def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _step_columns(new: bool) -> list[sa.Column[Any]]:
    eight: list[sa.Column[Any]] = [
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("wall_time", sa.Double(), nullable=False),
        sa.Column("loss", sa.Double(), nullable=True),
        sa.Column("scale_before", sa.Double(), nullable=True),
        sa.Column("scale_after", sa.Double(), nullable=True),
        sa.Column("growth_tracker", sa.BigInteger(), nullable=True),
        sa.Column("grad_norm", sa.Double(), nullable=True),
        sa.Column("lr", sa.Double(), nullable=True),
        sa.Column("duration", sa.Double(), nullable=True),
    ]
    keys: list[sa.Column[Any]] = (
        [sa.Column("run_key", sa.Integer(), nullable=False),
         sa.Column("attempt", sa.Integer(), nullable=False)] if new else
        [sa.Column("run_id", sa.String(length=64), nullable=False),
         sa.Column("attempt_id", sa.String(length=64), nullable=False)])
    rest: list[sa.Column[Any]] = [
        sa.Column("nonfinite_count", sa.Integer(), nullable=True),
        sa.Column("misuse_count", sa.Integer(), nullable=True),
        *[sa.Column(name, sa.SmallInteger(), nullable=False) for name in _CLASSES],
        sa.Column("found_inf", sa.Boolean(), nullable=False),
        sa.Column("skipped", sa.Boolean(), nullable=False),
        sa.Column("captured", sa.String(length=16), nullable=True),
    ]
    # Widest first (the new layout); the old one's order does not matter to what it stores.
    return [sa.Column("id", STEP_ID, autoincrement=True, nullable=False), *eight, *keys, *rest]


def _create_steps(new: bool) -> None:
    if new:
        constraints: list[sa.Constraint] = [
            sa.ForeignKeyConstraint(["run_key"], ["runs.key"], name="fk_steps_run_key_runs",
                                    ondelete="CASCADE"),
            sa.UniqueConstraint("run_key", "attempt", "seq",
                                name="uq_steps_run_key_attempt_seq"),
        ]
        indexed = "run_key"
    else:
        constraints = [
            sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"],
                                    name="fk_steps_attempt_id_attempts", ondelete="CASCADE"),
            sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_steps_run_id_runs",
                                    ondelete="CASCADE"),
            sa.UniqueConstraint("run_id", "attempt_id", "seq",
                                name="uq_steps_run_id_attempt_id_seq"),
        ]
        indexed = "run_id"
    op.create_table("steps", *_step_columns(new), *constraints,
                    sa.PrimaryKeyConstraint("id", name="pk_steps"), sqlite_autoincrement=True)
    op.create_index(f"ix_steps_{indexed}_step", "steps", [indexed, "step"])
    op.create_index(f"ix_steps_{indexed}_id", "steps", [indexed, "id"])


def _create_layer_stats(new: bool) -> None:
    run = "run_key" if new else "run_id"
    op.create_table(
        "layer_stats",
        sa.Column("step_id", STEP_ID, autoincrement=False, nullable=False),
        (sa.Column("run_key", sa.Integer(), nullable=False) if new
         else sa.Column("run_id", sa.String(length=64), nullable=False)),
        sa.Column("layers", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint([run], ["runs.key" if new else "runs.id"],
                                name=f"fk_layer_stats_{run}_runs", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"], name="fk_layer_stats_step_id_steps",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("step_id", name="pk_layer_stats"),
    )
    op.create_index(f"ix_layer_stats_{run}_step_id", "layer_stats", [run, "step_id"])
    if _postgres():
        # The blobs are compressed already (revision 0006).
        op.execute("ALTER TABLE layer_stats ALTER COLUMN data SET STORAGE EXTERNAL")


def _set_aside(table: str, suffix: str, indexes: Sequence[str],
               constraints: Sequence[str]) -> None:
    """Rename `table` to `table + suffix`, out of the way of its successor's names: its indexes
    dropped (their names are schema-wide on both dialects; the copy needs none), on Postgres
    its primary and unique constraints renamed (their indexes' names are schema-wide too)."""
    for index in indexes:
        op.drop_index(index, table_name=table)
    op.rename_table(table, table + suffix)
    if _postgres():
        for name in constraints:
            op.execute(f'ALTER TABLE {table}{suffix} RENAME CONSTRAINT "{name}" '
                       f'TO "{name}{suffix}"')


def _rebuild(new: bool) -> None:
    """Replace `steps` and `layer_stats` by the `new` (0010) or old (0009) layout, keeping every
    row and every step id."""
    connection = op.get_bind()
    postgres = _postgres()
    suffix = "_0009" if new else "_0010"
    run = "run_id" if new else "run_key"  # the layout being replaced
    child_sql: dict[str, str] = {}
    if not postgres:
        # Their DDL as stored, read before `steps` is renamed (which rewrites its REFERENCES).
        child_sql = {name: str(sql) for name, sql in connection.execute(sa.text(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN "
            f"({', '.join(repr(name) for name in _CHILDREN)})"))}
    sequence = None
    if postgres:
        sequence = connection.execute(sa.text(
            "SELECT pg_get_serial_sequence('steps', 'id')")).scalar_one()
        op.execute(f"ALTER SEQUENCE {sequence} RENAME TO steps{suffix}_id_seq")
    _set_aside("steps", suffix, [f"ix_steps_{run}_step", f"ix_steps_{run}_id"],
               ["pk_steps", "uq_steps_run_id_attempt_id_seq" if new
                else "uq_steps_run_key_attempt_seq"])
    _set_aside("layer_stats", suffix, [f"ix_layer_stats_{run}_step_id"], ["pk_layer_stats"])
    if not postgres:
        for name in _CHILDREN:
            op.rename_table(name, name + suffix)
    _create_steps(new)
    _create_layer_stats(new)

    shared = ", ".join(("id", *_EIGHT, *_REST))
    picked = ", ".join(f"s.{name}" for name in ("id", *_EIGHT, *_REST))
    if new:
        op.execute(
            f"INSERT INTO steps ({shared}, run_key, attempt) SELECT {picked}, r.\"key\", "
            f"a.ordinal FROM steps{suffix} s JOIN runs r ON r.id = s.run_id "
            "JOIN attempts a ON a.id = s.attempt_id")
        op.execute(
            "INSERT INTO layer_stats (step_id, run_key, layers, data) SELECT l.step_id, "
            f"r.\"key\", l.layers, l.data FROM layer_stats{suffix} l JOIN runs r "
            "ON r.id = l.run_id")
    else:
        op.execute(
            f"INSERT INTO steps ({shared}, run_id, attempt_id) SELECT {picked}, r.id, a.id "
            f"FROM steps{suffix} s JOIN runs r ON r.\"key\" = s.run_key "
            "JOIN attempts a ON a.run_id = r.id AND a.ordinal = s.attempt")
        op.execute(
            "INSERT INTO layer_stats (step_id, run_id, layers, data) SELECT l.step_id, r.id, "
            f"l.layers, l.data FROM layer_stats{suffix} l JOIN runs r ON r.\"key\" = l.run_key")

    if postgres:
        for name in _CHILDREN:
            op.execute(f'ALTER TABLE {name} DROP CONSTRAINT "fk_{name}_step_id_steps"')
            op.execute(f'ALTER TABLE {name} ADD CONSTRAINT "fk_{name}_step_id_steps" '
                       "FOREIGN KEY (step_id) REFERENCES steps (id) ON DELETE CASCADE")
        # Step ids go on from where the replaced table's sequence was.
        op.execute(f"SELECT setval(pg_get_serial_sequence('steps', 'id'), last_value, "
                   f"is_called) FROM steps{suffix}_id_seq")
    else:
        for name in _CHILDREN:
            op.execute(child_sql[name])
            op.execute(f"INSERT INTO {name} SELECT * FROM {name}{suffix}")
            op.drop_table(name + suffix)
        # AUTOINCREMENT: never hand out an id the replaced table handed out.
        op.execute(
            "UPDATE sqlite_sequence SET seq = max(seq, coalesce((SELECT seq FROM "
            f"sqlite_sequence WHERE name = 'steps{suffix}'), 0)) WHERE name = 'steps'")
        op.execute(
            f"INSERT INTO sqlite_sequence (name, seq) SELECT 'steps', seq FROM sqlite_sequence "
            f"WHERE name = 'steps{suffix}' AND NOT EXISTS (SELECT 1 FROM sqlite_sequence "
            "WHERE name = 'steps')")
    op.drop_table("layer_stats" + suffix)
    op.drop_table("steps" + suffix)


def upgrade() -> None:
    if _postgres():
        # An identity column added to a table numbers its existing rows.
        op.add_column("runs", sa.Column("key", sa.Integer(), sa.Identity(), nullable=False))
    else:
        # SQLite adds a NOT NULL column only with a default; every row then gets its own key.
        op.execute('ALTER TABLE runs ADD COLUMN "key" INTEGER NOT NULL DEFAULT 0')
        op.execute('UPDATE runs SET "key" = rowid')
    op.create_index("ix_runs_key", "runs", ["key"], unique=True)
    _rebuild(new=True)


def downgrade() -> None:
    _rebuild(new=False)
    op.drop_index("ix_runs_key", table_name="runs")
    if _postgres():
        op.drop_column("runs", "key")
    else:
        # Not batch mode: recreating `runs` would, with foreign keys on, delete every child.
        op.execute('ALTER TABLE runs DROP COLUMN "key"')
