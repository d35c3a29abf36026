"""Rollups: per-run min/max/last buckets of 4, 16, … 65536 steps for bounded chart queries.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

One new table, `rollups`, keyed by (run_id, level, bucket), cascading with its run. The upgrade
backfills it from the stored steps and layer statistics, run by run in step order, with the
pure functions ingest used at this revision, frozen below (a copy of `ampscope_server.rollups`
as it was): a migration never imports live application code, whose later changes would
silently rewrite what this revision does. An upgraded database charts exactly as one that
ingested with rollups from the start. The backfill reads every stored step
once; on a large database it takes about as long as reading the data. Downgrade drops the table
(its content is derived: nothing is lost).
"""


# No `from __future__ import annotations`: Alembic loads this file outside `sys.modules`, where
# `dataclasses` cannot resolve string annotations.
import math
import struct
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import add

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CHUNK = 4096  # steps per backfill round trip


# --- frozen: ampscope_server.rollups at revision 0003 ---------------------------------------

LEVELS = (2, 4, 6, 8, 10, 12, 14, 16)
"""log2 of the bucket widths. The finest (4 steps) bounds the raw rows a query reads."""

SERIES = ("scale_before", "loss", "grad_norm", "lr", "duration")
"""The step columns charted as series, in their order inside the packed `series` blob."""

_SERIES = struct.Struct("<qdddq")  # count, min, max, last, last step

INT_STATS = frozenset({"nan_count", "inf_count"})
DIRECTION: Mapping[str, str] = {
    "amax": "max", "amin_nz": "min", "zero_frac": "max", "subnormal_frac": "max",
    "underflow_frac": "max", "lost_frac": "max", "nan_count": "max", "inf_count": "max",
    "l2": "max", "amax_scaled": "max",
}
"""The stored per-layer rollup statistics and the direction that is worse for each."""
ROLLUP_STATS = tuple(DIRECTION)
MISSING: Mapping[str, float] = {
    name: (-1 if name in INT_STATS else (math.inf if way == "min" else -math.inf))
    for name, way in DIRECTION.items()
}
"""The value of a layer without data: it loses every comparison in the stat's direction."""

@dataclass
class SeriesAcc:
    """Min/max/last of one series over one bucket; `n` counts the non-null values."""

    n: int = 0
    lo: float = math.nan
    hi: float = math.nan
    last: float = math.nan
    last_step: int = -1

    def add(self, step: int, value: float) -> None:
        """Fold in a value that comes after every value folded in so far."""
        self.n += 1
        if not math.isnan(value):
            self.lo = value if math.isnan(self.lo) else min(self.lo, value)
            self.hi = value if math.isnan(self.hi) else max(self.hi, value)
        self.last, self.last_step = value, step

    def merge(self, newer: "SeriesAcc") -> None:
        """Fold in `newer`, whose values were stored later (or lie at later steps)."""
        if newer.n == 0:
            return
        if self.n == 0 or newer.last_step >= self.last_step:
            self.last, self.last_step = newer.last, newer.last_step
        self.n += newer.n
        for value in (newer.lo, newer.hi):
            if not math.isnan(value):
                self.lo = value if math.isnan(self.lo) else min(self.lo, value)
                self.hi = value if math.isnan(self.hi) else max(self.hi, value)


LayerArrays = dict[str, list[float]]


@dataclass
class Bucket:
    series: list[SeriesAcc] = field(default_factory=lambda: [SeriesAcc() for _ in SERIES])
    layers: LayerArrays | None = None

    def merge(self, newer: "Bucket") -> None:
        for mine, theirs in zip(self.series, newer.series, strict=True):
            mine.merge(theirs)
        self.layers = merge_layers(self.layers, newer.layers)


def merge_layers(a: LayerArrays | None, b: LayerArrays | None) -> LayerArrays | None:
    if a is None:
        return b
    if b is None:
        return a
    return reduce_layers([a, b])


def reduce_layers(arrays: Sequence[LayerArrays]) -> LayerArrays:
    """The per-layer worst of several buckets' (or steps') arrays, in one pass per statistic:
    `map(max, *lists)` compares k values per call rather than two (ingest's hot loop)."""
    if len(arrays) == 1:
        return arrays[0]
    return {
        name: list(map(max if DIRECTION[name] == "max" else min, *(a[name] for a in arrays)))
        for name in ROLLUP_STATS
    }


@dataclass(frozen=True)
class StepInput:
    """What a rollup needs of one stored step: `series` in `SERIES` order (None = not sent),
    `layers` the eight stored statistics per layer (None = no layer statistics)."""

    step: int
    series: Sequence[float | None]
    layers: Mapping[str, Sequence[float | None]] | None


def _or(values: Sequence[float | None], missing: float) -> list[float]:
    if None not in values:  # the common case, a scan in C: fractions and counts never are None
        return list(values)  # type: ignore[arg-type]  # no None in it, as just checked
    return [missing if v is None else v for v in values]


def step_layers(layers: Mapping[str, Sequence[float | None]], scale: float | None) -> LayerArrays:
    """One step's per-layer values in rollup form (missing values replaced by `MISSING`).

    `amax_scaled` is amax · scale in effect (a null scale counts as 1, as in headroom_bits);
    a scale that is not a positive finite number gives no headroom, hence no value.
    """
    out = {name: _or(layers[name], MISSING[name]) for name in ROLLUP_STATS
           if name not in ("lost_frac", "amax_scaled")}
    out["lost_frac"] = list(map(add, out["zero_frac"], out["underflow_frac"]))
    effective = 1.0 if scale is None else scale
    if math.isfinite(effective) and effective > 0:
        out["amax_scaled"] = [a * effective if a >= 0 else a for a in out["amax"]]
    else:
        out["amax_scaled"] = [-math.inf] * len(out["amax"])
    return out


def accumulate(steps: Iterable[StepInput]) -> dict[tuple[int, int], Bucket]:
    """Buckets of every level for steps given in (step, ingest) order: {(level, bucket): …}."""
    finest = LEVELS[0]
    out: dict[tuple[int, int], Bucket] = {}
    layers: dict[int, list[LayerArrays]] = {}  # finest bucket → its steps' arrays
    for item in steps:
        index = item.step >> finest
        bucket = out.setdefault((finest, index), Bucket())
        for acc, value in zip(bucket.series, item.series, strict=True):
            if value is not None:
                acc.add(item.step, value)
        if item.layers is not None:
            scale = item.series[0]
            layers.setdefault(index, []).append(step_layers(item.layers, scale))
    for index, arrays in layers.items():
        out[(finest, index)].layers = reduce_layers(arrays)
    for coarser, finer in zip(LEVELS[1:], LEVELS, strict=False):
        shift = coarser - finer
        groups: dict[int, list[Bucket]] = {}
        for (level, index), bucket in sorted(out.items()):
            if level == finer:
                groups.setdefault(index >> shift, []).append(bucket)
        for index, group in groups.items():
            target = out.setdefault((coarser, index), Bucket())
            for bucket in group:
                for mine, theirs in zip(target.series, bucket.series, strict=True):
                    mine.merge(theirs)
            with_layers = [bucket.layers for bucket in group if bucket.layers is not None]
            if with_layers:
                target.layers = reduce_layers(with_layers)
    return out


# --- packing -----------------------------------------------------------------------------------

def pack_series(accs: Sequence[SeriesAcc]) -> bytes:
    return b"".join(_SERIES.pack(a.n, a.lo, a.hi, a.last, a.last_step) for a in accs)


def pack_stat(name: str, values: Sequence[float]) -> bytes:
    if name in INT_STATS:
        return array("q", [int(v) for v in values]).tobytes()
    return array("d", values).tobytes()


def to_row(run_id: str, key: tuple[int, int], bucket: Bucket) -> dict[str, object]:
    level, index = key
    row: dict[str, object] = {
        "run_id": run_id, "level": level, "bucket": index,
        "series": pack_series(bucket.series),
    }
    for name in ROLLUP_STATS:
        row[name] = None if bucket.layers is None else pack_stat(name, bucket.layers[name])
    return row


# --- the migration --------------------------------------------------------------------------


_STORED = ("amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac", "nan_count",
           "inf_count", "l2")


def upgrade() -> None:
    table = op.create_table(
        "rollups",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("series", sa.LargeBinary(), nullable=False),
        *[sa.Column(name, sa.LargeBinary(), nullable=True) for name in ROLLUP_STATS],
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_rollups_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "level", "bucket", name=op.f("pk_rollups")),
    )
    assert table is not None
    _backfill(op.get_bind(), table)


def _value(value: float | None, cls: int) -> float | None:
    return {1: float("nan"), 2: float("inf"), 3: float("-inf")}.get(cls, value)


def _backfill(connection: sa.Connection, table: sa.Table) -> None:
    run_ids = [row[0] for row in connection.execute(sa.text("SELECT id FROM runs"))]
    columns = ", ".join(f"{name}, {name}_class" for name in SERIES)
    for run_id in run_ids:
        buckets: dict[tuple[int, int], Bucket] = {}
        after: tuple[int, int] = (-1, -1)
        while True:
            steps = connection.execute(sa.text(
                f"SELECT id, step, {columns} FROM steps WHERE run_id = :run AND "
                "(step > :step OR (step = :step AND id > :id)) ORDER BY step, id LIMIT :n"
            ), {"run": run_id, "step": after[0], "id": after[1], "n": _CHUNK}).all()
            if not steps:
                break
            after = (int(steps[-1][1]), int(steps[-1][0]))
            layers: dict[int, dict[str, list[float | None]]] = {}
            stats = connection.execute(
                sa.text(f"SELECT step_id, {', '.join(_STORED)} FROM layer_stats "
                        "WHERE step_id IN :ids ORDER BY step_id, layer_index")
                .bindparams(sa.bindparam("ids", expanding=True)),
                {"ids": [int(row[0]) for row in steps]},
            )
            for step_id, *values in stats:
                entry = layers.setdefault(int(step_id), {name: [] for name in _STORED})
                for name, value in zip(_STORED, values, strict=True):
                    entry[name].append(value)
            inputs = [
                StepInput(
                    step=int(row[1]),
                    series=[_value(row[2 + 2 * i], row[3 + 2 * i])
                            for i in range(len(SERIES))],
                    layers=layers.get(int(row[0])),
                )
                for row in steps
            ]
            for key, bucket in accumulate(inputs).items():
                if key in buckets:
                    buckets[key].merge(bucket)
                else:
                    buckets[key] = bucket
            # Buckets that end before the last step read are complete: write them out.
            done = [key for key in buckets if ((key[1] + 1) << key[0]) <= after[0]]
            _write(connection, table, run_id, {key: buckets.pop(key) for key in done})
        _write(connection, table, run_id, buckets)


def _write(connection: sa.Connection, table: sa.Table, run_id: str,
           buckets: dict[tuple[int, int], Bucket]) -> None:
    rows = [to_row(run_id, key, bucket) for key, bucket in buckets.items()]
    for start in range(0, len(rows), 1000):
        connection.execute(table.insert(), rows[start:start + 1000])


def downgrade() -> None:
    op.drop_table("rollups")
