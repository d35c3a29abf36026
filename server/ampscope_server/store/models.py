"""SQLAlchemy 2 ORM models: the storage layout of DESIGN.md §5.

Timestamps are unix seconds (float), as on the wire. Every step float that may be non-finite is
stored as a nullable value plus a `<name>_class` small int (`float_storage.FloatClass`), because
SQLite turns NaN into NULL: both dialects then give back exactly what was sent.

Wire v3 (revision 0004) adds two step children: the FP32 re-check of an overflow step
(`step_rechecks`) and the swallowed-update fraction per layer (`swallowed_stats`).

Wire v2 (revision 0002) adds the module table, per-step children (non-finite layers, misuse,
activation statistics, exponent histograms), `steps.captured` and the client's accounting on
`attempts`. A wire list that may be null ("not measured") or empty ("measured, none") keeps its
length on the step (`nonfinite_count`, `misuse_count`: NULL = not measured).

Revision 0006 packs the per-layer statistics of a step into one row (`LayerStat.data`) and keeps
per-layer rollups apart from the series rollups, from coarser buckets (`LayerRollup`).

Wire v4 (revision 0020) adds the run's `world_size` and two step children, one row per step
each however many ranks or optimizers: the per-rank loss and non-finite counts
(`step_ranks`) and the per-optimizer skip flags and learning rates (`step_optimizers`).

Revision 0010 gives each run an integer `key` that the large tables carry instead of the run's
36-character id; revision 0011 packs activation statistics, histograms and swallowed fractions
one row per step with that key, as 0006 did the layer statistics. Revision 0012 keys the
rollup tables by it too.

Wire v6 (revision 0024) adds the sampled FP32 shadow step (`step_shadows`); wire v7 (revision
0025) the sampled scaled-format what-ifs of each module's GEMM operands (`step_formats`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ampscope_server.store.format_packing import RECIPES_LENGTH

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments an INTEGER PRIMARY KEY; Postgres gets a 64-bit identity.
StepId = BigInteger().with_variant(Integer, "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Run(Base):
    """A training run. `id` is the public run id (the wire's, the API's); `key` is the small
    integer the large tables (`steps`, `layer_stats`, the rollups) carry instead (revisions 0010,
    0012): a 36-char id repeated in every step row and in three indexes cost more than the
    step's own values.
    Postgres numbers it (identity); on SQLite, whose writers are serialised, `touch_run` gives
    it the largest key + 1."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_key", "key", unique=True),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[int] = mapped_column(Integer, Identity())
    project: Mapped[str] = mapped_column(String(200))
    name: Mapped[str] = mapped_column(String(200))
    tags: Mapped[list[str]] = mapped_column(JSON)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    host: Mapped[str] = mapped_column(String(255))
    rank: Mapped[int] = mapped_column(Integer)
    target_format: Mapped[str] = mapped_column(String(16))
    target_format_reason: Mapped[str | None] = mapped_column(String(200))
    """Why that format (wire `run.target_format_reason`); null from clients before it."""
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)
    world_size: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    """The processes of the distributed job the run records (wire v4; 1 before it)."""
    notes: Mapped[str] = mapped_column(Text, server_default=text("''"))
    """Free text a person wrote on the run page (PATCH /api/runs/{id}; revision 0021)."""


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("run_id", "ordinal"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    ordinal: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Double)
    # The sender's latest accounting (wire v2 `client`), all NULL until a batch carries one.
    client_produced: Mapped[int | None] = mapped_column(BigInteger)
    client_acknowledged: Mapped[int | None] = mapped_column(BigInteger)
    client_spooled: Mapped[int | None] = mapped_column(BigInteger)
    client_dropped: Mapped[int | None] = mapped_column(BigInteger)
    client_replayed: Mapped[int | None] = mapped_column(BigInteger)


CLIENT_FIELDS = ("produced", "acknowledged", "spooled", "dropped", "replayed")


class Layer(Base):
    __tablename__ = "layers"

    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(500))
    shape: Mapped[list[int]] = mapped_column(JSON)
    dtype: Mapped[str] = mapped_column(String(32))
    numel: Mapped[int] = mapped_column(BigInteger)
    module_type: Mapped[str] = mapped_column(String(200))
    # Nullable only so that revision 0018 could add it in place; it backfilled every row and
    # ingest always writes it (`wire.LayerInfo` fills it with `name` when a client sent none).
    raw_name: Mapped[str | None] = mapped_column(String(500))


STEP_IS_EVENT = ("skipped OR found_inf OR scale_before <> scale_after "
                 "OR scale_before_class <> scale_after_class")
"""A step the events list shows: skipped, a gradient non-finite (`found_inf`: with a scaler the
skipped steps again; without one, BF16 or FP32, steps the optimizer applied all the same), or its
scale changed (or became non-finite). One SQL text for the partial index below and the query
that uses it (`steps_repository.event_rows`): SQLite takes a partial index only for a query
holding the index's condition as written (revision 0019)."""


STEP_HAS_MISUSE = "misuse_count > 0"
"""A step that reported scaler misuse (wire v2): one SQL text for the partial index below and
the query that uses it (`steps_repository.misuse_rows`), as `STEP_IS_EVENT`."""


STEP_IS_NOTABLE = (
    "skipped OR found_inf OR scale_before <> scale_after "
    "OR scale_before_class <> scale_after_class OR loss_class <> 0 OR grad_norm_class <> 0")
"""A step the findings read (`findings_repository.findings_steps`): skipped or `found_inf`,
its scale changed, its loss or grad norm non-finite (class 0 is `float_storage.FloatClass`'s finite
or null). One SQL text for the partial index below and its query, as `STEP_IS_EVENT`."""


class Step(Base):
    """One logged optimizer step. The run is `run_key` (`runs.key`) and the attempt its ordinal
    within the run (`attempts.ordinal`): integers, not the 36-character ids (revision 0010).
    Columns go widest first (8-byte, then 4-byte, 2-byte, 1-byte, text) so that Postgres puts
    no alignment padding between them."""

    __tablename__ = "steps"
    __table_args__ = (
        UniqueConstraint("run_key", "attempt", "seq"),
        Index("ix_steps_run_key_step", "run_key", "step"),
        Index("ix_steps_run_key_id", "run_key", "id"),
        # The event steps only (about 1 in 500 at the hook's usual skip rate): the first page
        # of /events no longer scans a run's steps from its start (revision 0014).
        Index("ix_steps_run_key_event_step", "run_key", "step",
              sqlite_where=text(STEP_IS_EVENT), postgresql_where=text(STEP_IS_EVENT)),
        # The steps with misuse events (rare: a training loop's bug): an events page reads
        # them without joining every step of its range to `misuse_events` (revision 0016).
        Index("ix_steps_run_key_misuse_step", "run_key", "step",
              sqlite_where=text(STEP_HAS_MISUSE), postgresql_where=text(STEP_HAS_MISUSE)),
        # The steps the live findings read (revision 0017): O(events) of a 1M-step run.
        Index("ix_steps_run_key_notable_step", "run_key", "step",
              sqlite_where=text(STEP_IS_NOTABLE), postgresql_where=text(STEP_IS_NOTABLE)),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(StepId, primary_key=True, autoincrement=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    step: Mapped[int] = mapped_column(BigInteger)
    wall_time: Mapped[float] = mapped_column(Double)
    loss: Mapped[float | None] = mapped_column(Double)
    scale_before: Mapped[float | None] = mapped_column(Double)
    scale_after: Mapped[float | None] = mapped_column(Double)
    growth_tracker: Mapped[int | None] = mapped_column(BigInteger)
    grad_norm: Mapped[float | None] = mapped_column(Double)
    lr: Mapped[float | None] = mapped_column(Double)
    duration: Mapped[float | None] = mapped_column(Double)
    run_key: Mapped[int] = mapped_column(ForeignKey("runs.key", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    # v2: list lengths, NULL = not measured.
    nonfinite_count: Mapped[int | None] = mapped_column(Integer)
    misuse_count: Mapped[int | None] = mapped_column(Integer)
    loss_class: Mapped[int] = mapped_column(SmallInteger)
    scale_before_class: Mapped[int] = mapped_column(SmallInteger)
    scale_after_class: Mapped[int] = mapped_column(SmallInteger)
    grad_norm_class: Mapped[int] = mapped_column(SmallInteger)
    lr_class: Mapped[int] = mapped_column(SmallInteger)
    duration_class: Mapped[int] = mapped_column(SmallInteger)
    found_inf: Mapped[bool] = mapped_column(Boolean)
    skipped: Mapped[bool] = mapped_column(Boolean)
    # v2: "before_unscale" | "after_unscale" | NULL.
    captured: Mapped[str | None] = mapped_column(String(16))


# The step floats that may be non-finite, each stored as (value, value_class).
CLASSED_STEP_FLOATS = ("loss", "scale_before", "scale_after", "grad_norm", "lr", "duration")


class LayerStat(Base):
    """The gradient statistics of every layer at one step (DESIGN.md §3), true units, packed.

    `data` is `stat_packing` of the eight `LAYER_STAT_NAMES` columns (one value per layer, in
    layer order; amax, amin_nz and l2 are over finite elements, so finite or None when none
    is): one row per step rather than per layer per step, so a step's statistics cost what
    their values carry (revision 0006). `run_key` (`runs.key`, revision 0010) lets a run's rows
    be found, partitioned and deleted without going through `steps`. `layers` is the layer
    count, readable without unpacking.
    """

    __tablename__ = "layer_stats"
    __table_args__ = (Index("ix_layer_stats_run_key_step_id", "run_key", "step_id"),)

    step_id: Mapped[int] = mapped_column(
        StepId, ForeignKey("steps.id", ondelete="CASCADE"), primary_key=True,
        autoincrement=False,
    )
    run_key: Mapped[int] = mapped_column(ForeignKey("runs.key", ondelete="CASCADE"))
    layers: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


LAYER_STAT_NAMES = (
    "amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac", "nan_count", "inf_count",
    "l2",
)
LAYER_STAT_KINDS = "dddddqqd"
"""`stat_packing` kinds of LAYER_STAT_NAMES: the two counts are int64, the rest float64."""


# --- wire v2 -----------------------------------------------------------------------------------

class Module(Base):
    """The module table of the `activation` source, stored once per run like `layers`."""

    __tablename__ = "modules"

    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(500))
    module_type: Mapped[str] = mapped_column(String(200))


class StepNonfinite(Base):
    """A layer whose gradient held NaN or ±inf; `position` is its place in backward order."""

    __tablename__ = "step_nonfinite"

    step_id: Mapped[int] = mapped_column(
        StepId, ForeignKey("steps.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    layer_index: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(8))


class MisuseEvent(Base):
    """An AMP usage error seen in a step, in the order the hook reported them."""

    __tablename__ = "misuse_events"

    step_id: Mapped[int] = mapped_column(
        StepId, ForeignKey("steps.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str] = mapped_column(String(1000))


class ActivationStat(Base):
    """The `grad_output` statistics of every module at one step, true units, packed like
    `LayerStat` (revision 0011): `data` is `stat_packing` of the eight `LAYER_STAT_NAMES`
    columns (kinds `LAYER_STAT_KINDS`), one value per module in module order; `modules` is the
    module count. Unlike `LayerStat`, amax, amin_nz and l2 may be NaN or ±inf
    (wire.ActivationStatArrays): their float64 bits keep them exactly, and the reads give them
    back as (value, class) like the step floats (`steps_repository.ActivationStatRow`).
    """

    __tablename__ = "activation_stats"
    __table_args__ = (Index("ix_activation_stats_run_key_step_id", "run_key", "step_id"),)

    step_id: Mapped[int] = mapped_column(
        StepId, ForeignKey("steps.id", ondelete="CASCADE"), primary_key=True,
        autoincrement=False,
    )
    run_key: Mapped[int] = mapped_column(ForeignKey("runs.key", ondelete="CASCADE"))
    modules: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


CLASSED_ACTIVATION_STATS = ("amax", "amin_nz", "l2")


class Histogram(Base):
    """The exponent histograms of every layer at one step (revision 0011: one row per step).

    `data` is `stat_packing` of one int64 column: each layer's max_exp - min_exp + 5 counts
    (the wire's list), layer after layer; `layers` is the layer count. Always read whole
    (export, "what if the scale were higher" in the browser), never bin by bin; int64 keeps
    every count exact (the wire bounds them by INT64_MAX).
    """

    __tablename__ = "histograms"
    __table_args__ = (Index("ix_histograms_run_key_step_id", "run_key", "step_id"),)

    step_id: Mapped[int] = mapped_column(
        StepId, ForeignKey("steps.id", ondelete="CASCADE"), primary_key=True,
        autoincrement=False,
    )
    run_key: Mapped[int] = mapped_column(ForeignKey("runs.key", ondelete="CASCADE"))
    min_exp: Mapped[int] = mapped_column(Integer)
    max_exp: Mapped[int] = mapped_column(Integer)
    layers: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


# --- wire v3 (revision 0004) -------------------------------------------------------------------

class StepRecheck(Base):
    """The FP32 re-check of an overflow step (wire `recheck`); no row = not re-checked.

    `layers` is the wire's list of `{"layer", "kind"}` in backward order, kept as one JSON
    array: it is short, always read whole with its step, never queried by layer.
    """

    __tablename__ = "step_rechecks"

    step_id: Mapped[int] = mapped_column(
        StepId, ForeignKey("steps.id", ondelete="CASCADE"), primary_key=True
    )
    status: Mapped[str] = mapped_column(String(16))
    loss: Mapped[float | None] = mapped_column(Double)
    loss_class: Mapped[int] = mapped_column(SmallInteger)
    layers: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    detail: Mapped[str | None] = mapped_column(String(1000))
    origin: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """The wire's `origin` (`{"module", "input_finite", "format"}`, revision 0023): where the
    forward overflow began; null when none was read (or before 0023)."""


class SwallowedStat(Base):
    """The swallowed-update fraction of every layer at one step (wire `swallowed`): among the
    elements with a finite non-zero gradient, the share whose low-precision value did not
    change in the optimizer step. `data` is `stat_packing` of one float64 column, a fraction
    per layer, None where not measured (not FP16/BF16, no non-zero gradient); `layers` is the
    layer count. A step has a row exactly when the record carried `swallowed` (revision 0011:
    one row per step, not per layer)."""

    __tablename__ = "swallowed_stats"
    __table_args__ = (Index("ix_swallowed_stats_run_key_step_id", "run_key", "step_id"),)

    step_id: Mapped[int] = mapped_column(
        StepId, ForeignKey("steps.id", ondelete="CASCADE"), primary_key=True,
        autoincrement=False,
    )
    run_key: Mapped[int] = mapped_column(ForeignKey("runs.key", ondelete="CASCADE"))
    layers: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


# --- wire v6 (revision 0024) -------------------------------------------------------------------

class StepShadow(Base):
    """The sampled FP32 shadow step of an applied step (wire v6 `shadow`); no row = none ran.

    `data` is `stat_packing` of three float64 columns of `layers` values (`SHADOW_KINDS`), in
    layer order: each layer's `rel_err`, cosine and FP32 gradient norm (the float64 bits: NaN
    and ±inf kept exactly; None where the layer had no gradient to compare); null for a
    `failed` shadow step, whose `detail` says why. The FP32 loss as value + class, like
    `step_rechecks.loss`."""

    __tablename__ = "step_shadows"
    __table_args__ = (Index("ix_step_shadows_run_key_step_id", "run_key", "step_id"),)

    step_id: Mapped[int] = mapped_column(
        StepId, ForeignKey("steps.id", ondelete="CASCADE"), primary_key=True,
        autoincrement=False,
    )
    run_key: Mapped[int] = mapped_column(ForeignKey("runs.key", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16))
    loss: Mapped[float | None] = mapped_column(Double)
    loss_class: Mapped[int] = mapped_column(SmallInteger)
    layers: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes | None] = mapped_column(LargeBinary)
    detail: Mapped[str | None] = mapped_column(String(1000))


SHADOW_KINDS = "ddd"
"""`stat_packing` kinds of `step_shadows.data`: rel_err, cosine, FP32 norm (float64)."""


# --- wire v7 (revision 0025) -------------------------------------------------------------------

class StepFormats(Base):
    """What scaled low-precision recipes (FP8, MX, NVFP4) would do to each sampled module's
    three GEMM operands at one sampled step (wire v7 `formats`); no row = not sampled.

    `data` is the wire's `values` then `operands`, float64 little-endian bits as sent
    (`format_packing`: NaN, ±inf and -0.0 bit for bit, uncompressed so that a trend cuts one
    layer's 72 bytes out in SQL); `layers` the layer-table indices and `recipes` the names,
    comma-joined, in the order of the arrays. `step` repeats the step's number (as
    `step_ranks.step`): the index (run_key, step, step_id) thins a run's sampled steps and finds
    the one at or before a step without reading `steps`. `trained` (null: no module trains in
    a recipe) names per layer the recipe its module trains in (empty: none), `trained_data` the
    wire's `trained.amax` then `trained.scale`; `scales` (null: a client before wire v8) the
    block scales' exponents (`format_packing.SCALE_WIDTH` per layer, operand and recipe).
    Columns widest first, as `steps`."""

    __tablename__ = "step_formats"
    __table_args__ = (Index("ix_step_formats_run_key_step", "run_key", "step", "step_id"),)

    step_id: Mapped[int] = mapped_column(
        StepId, ForeignKey("steps.id", ondelete="CASCADE"), primary_key=True,
        autoincrement=False,
    )
    step: Mapped[int] = mapped_column(BigInteger)
    run_key: Mapped[int] = mapped_column(ForeignKey("runs.key", ondelete="CASCADE"))
    recipes: Mapped[str] = mapped_column(String(RECIPES_LENGTH))
    layers: Mapped[str] = mapped_column(Text)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    trained: Mapped[str | None] = mapped_column(Text)
    trained_data: Mapped[bytes | None] = mapped_column(LargeBinary)
    scales: Mapped[bytes | None] = mapped_column(LargeBinary)


# --- wire v4 (revision 0020) -------------------------------------------------------------------

RANKS_NONFINITE = "nonfinite_ranks > 0"
"""A step where some rank's loss was NaN/±inf or some rank's gradient held one: one SQL text
for the partial index below and the query that uses it (`rank_reads`), as `STEP_IS_EVENT`."""


class StepRanks(Base):
    """The per-rank values of one step of a distributed run (wire v4 `ranks`): one row per step
    whatever the world size. `data` is `stat_packing` of two columns of `ranks` values, rank r
    at index r (`RANK_KINDS`): each rank's loss (float64 bits: NaN and ±inf kept exactly, None
    when the rank recorded none) and its count of layers with a non-finite gradient (None:
    unknown). `nonfinite_ranks` counts the ranks with a non-finite loss or a count > 0 and
    `step` repeats the step's number, so the first step where a rank went non-finite is one
    index probe (`ix_step_ranks_run_key_nonfinite_step`), not a scan of every blob."""

    __tablename__ = "step_ranks"
    __table_args__ = (
        Index("ix_step_ranks_run_key_step_id", "run_key", "step_id"),
        Index("ix_step_ranks_run_key_nonfinite_step", "run_key", "step",
              sqlite_where=text(RANKS_NONFINITE), postgresql_where=text(RANKS_NONFINITE)),
    )

    step_id: Mapped[int] = mapped_column(
        StepId, ForeignKey("steps.id", ondelete="CASCADE"), primary_key=True,
        autoincrement=False,
    )
    step: Mapped[int] = mapped_column(BigInteger)
    run_key: Mapped[int] = mapped_column(ForeignKey("runs.key", ondelete="CASCADE"))
    ranks: Mapped[int] = mapped_column(Integer)
    nonfinite_ranks: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


RANK_KINDS = "dq"
"""`stat_packing` kinds of `step_ranks.data`: loss (float64), nonfinite (int64)."""


class StepOptimizers(Base):
    """The watched optimizers of one step (wire v4 `optimizers`), in watch order, one row per
    step. `data` is `stat_packing` of two int64 columns of `optimizers` values: whether the
    optimizer's update was skipped (1, 0, None: unknown) and its number of parameter groups;
    `lr` is `stat_packing` of one float64 column, every group's lr, optimizer after optimizer
    (None: the group has none; NaN and ±inf kept as their bits)."""

    __tablename__ = "step_optimizers"
    __table_args__ = (Index("ix_step_optimizers_run_key_step_id", "run_key", "step_id"),)

    step_id: Mapped[int] = mapped_column(
        StepId, ForeignKey("steps.id", ondelete="CASCADE"), primary_key=True,
        autoincrement=False,
    )
    run_key: Mapped[int] = mapped_column(ForeignKey("runs.key", ondelete="CASCADE"))
    optimizers: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    lr: Mapped[bytes] = mapped_column(LargeBinary)


# --- rollups (revision 0003) -------------------------------------------------------------------

class _RunBucket:
    """The key of a rollup row: a run's steps [bucket·2^level, (bucket+1)·2^level). The run is
    `run_key` (`runs.key`, revision 0012), not the 36-character id, in the row and in the
    primary key (run_key, level, bucket)."""

    run_key: Mapped[int] = mapped_column(
        ForeignKey("runs.key", ondelete="CASCADE"), primary_key=True
    )
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True)


class Rollup(_RunBucket, Base):
    """Min/max/last of a run's chart series over one bucket of 2^level steps, the levels of
    `rollups.SERIES_LEVELS` (from 16 steps; a 4-step bucket is folded from its raw steps,
    revision 0009), and its step and skip counts, maintained at ingest (`rollups.py` packs
    `series`)."""

    __tablename__ = "rollups"
    # SQLite: clustered by (run_key, level, bucket), so a level's buckets are read in order
    # without a table probe per row (revision 0013).
    __table_args__ = ({"sqlite_with_rowid": False},)

    series: Mapped[bytes] = mapped_column(LargeBinary)
    step_count: Mapped[int] = mapped_column(Integer)
    """The bucket's stored step numbers, each once (a step a resumed attempt sent again is not
    counted again; revision 0013)."""
    skip_count: Mapped[int] = mapped_column(Integer)
    """Of those, the skipped ones (by the step's first stored row, as the rolling skip rate
    reads them): the long-range skip rate comes from these two (`skip_rates.blocks`)."""


class LayerRollup(_RunBucket, Base):
    """Worst-direction per-layer statistics over one bucket of 2^level steps, at the levels of
    `rollups.LAYER_LEVELS` only (from 64 steps: finer ones would cost about as much as the data
    they summarise, revision 0006). `data` is `stat_packing` of the `rollups.ROLLUP_STATS`
    columns. Written once the bucket is closed (a stored step lies past its end), and at 64
    steps only with more than `rollups.DENSE_STEPS` layer steps (revision 0009). No row: no
    step of the bucket carried layer statistics, or it is open, or a sparse 64-step one (a
    read folds those, `rollups_repository.layer_rollup_arrays`)."""

    __tablename__ = "layer_rollups"

    data: Mapped[bytes] = mapped_column(LargeBinary)


# --- team mode (revision 0005) ------------------------------------------------------------------

class Project(Base):
    """A project owns runs (by `runs.project`, its name) and the tokens made for it. Created by the
    first token or run that names it."""

    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    created_at: Mapped[float] = mapped_column(Double)


class ApiToken(Base):
    """An API token: only the SHA-256 of its secret is stored (the secret is 256 random bits, so
    a slow KDF would add nothing). `project` NULL = every project. Revoked tokens are kept, so
    `token list` shows what existed and when it stopped."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    project: Mapped[str | None] = mapped_column(String(200))
    scope: Mapped[str] = mapped_column(String(16))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Double)
    revoked_at: Mapped[float | None] = mapped_column(Double)
    last_used_at: Mapped[float | None] = mapped_column(Double)


class BrowserSession(Base):
    """A signed-in browser: the cookie's secret is stored only as its SHA-256 (`id`). The session
    lives no longer than its token: revoking the token ends it."""

    __tablename__ = "browser_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[str] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"))
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)


class DeletedRun(Base):
    """A tombstone: the hook of a deleted live run gets 410 instead of recreating the run."""

    __tablename__ = "deleted_runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project: Mapped[str] = mapped_column(String(200))
    deleted_at: Mapped[float] = mapped_column(Double)


# --- run counters (revision 0007) ----------------------------------------------------------------

class RunCounters(Base):
    """A run's summary kept as counters at ingest (`ingest.counters.count_new_steps`, in the
    batch's transaction), so the runs list reads one row per run, never the run's steps.

    `version` grows by one with every batch that stored new steps. The `summary_*` block is a
    cache of what the runs list shows beside the counters but must analyse to know (the top
    finding, the layer losing most to the format, the layer closest to overflow): computed off
    the ingest path, as of `summary_version` (stale when it differs from `version`) and
    `summary_step` (the newest step the analysis saw). No row: a run without steps.
    """

    __tablename__ = "run_counters"

    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(BigInteger)
    num_steps: Mapped[int] = mapped_column(BigInteger)
    skipped_steps: Mapped[int] = mapped_column(BigInteger)
    nonfinite_steps: Mapped[int] = mapped_column(BigInteger)
    """Steps with `found_inf` (some gradient held NaN or ±inf)."""
    last_step: Mapped[int | None] = mapped_column(BigInteger)
    """The highest step number stored."""
    last_id: Mapped[int | None] = mapped_column(BigInteger)
    """The id of the newest stored step (ingest order); its scale and loss are `last_*`."""
    last_scale: Mapped[float | None] = mapped_column(Double)
    last_scale_class: Mapped[int] = mapped_column(SmallInteger)
    last_loss: Mapped[float | None] = mapped_column(Double)
    last_loss_class: Mapped[int] = mapped_column(SmallInteger)
    summary_version: Mapped[int | None] = mapped_column(BigInteger)
    summary_step: Mapped[int | None] = mapped_column(BigInteger)
    finding_kind: Mapped[str | None] = mapped_column(String(64))
    finding_severity: Mapped[str | None] = mapped_column(String(16))
    finding_title: Mapped[str | None] = mapped_column(String(1000))
    underflow_layer: Mapped[str | None] = mapped_column(String(500))
    underflow_frac: Mapped[float | None] = mapped_column(Double)
    headroom_layer: Mapped[str | None] = mapped_column(String(500))
    headroom_bits: Mapped[float | None] = mapped_column(Double)
    headroom_bits_class: Mapped[int] = mapped_column(SmallInteger)


# --- alerts (revision 0008) ---------------------------------------------------------------------

class AlertRule(Base):
    """When to alert, per project (alerts.rules says what each kind and its `params` mean).
    `severity`: the least severe finding a `finding` rule reacts to; the level of the alerts a
    `series` or `state` rule raises. `builtin`: which shipped default this is (None: made by a
    user); a default can be turned off, and is not made again."""

    __tablename__ = "alert_rules"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project: Mapped[str] = mapped_column(ForeignKey("projects.name", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    severity: Mapped[str] = mapped_column(String(8))
    cooldown_s: Mapped[float] = mapped_column(Double)
    enabled: Mapped[bool] = mapped_column(Boolean)
    builtin: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[float] = mapped_column(Double)


class AlertDestination(Base):
    """Where a project's alerts go. `url` (Slack's and Discord's carry their secret in it) and
    `signing_secret` (the HMAC key of a generic webhook) are never returned by the API."""

    __tablename__ = "alert_destinations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project: Mapped[str] = mapped_column(ForeignKey("projects.name", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))
    url: Mapped[str] = mapped_column(String(2000))
    signing_secret: Mapped[str | None] = mapped_column(String(128))
    min_severity: Mapped[str] = mapped_column(String(8))
    enabled: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[float] = mapped_column(Double)


class AlertDefaults(Base):
    """A project whose default rules were made: they are made once, so one turned off (or
    deleted) stays so."""

    __tablename__ = "alert_defaults"

    project: Mapped[str] = mapped_column(
        ForeignKey("projects.name", ondelete="CASCADE"), primary_key=True)
    seeded_at: Mapped[float] = mapped_column(Double)


class AlertEpisode(Base):
    """One stretch of time during which a rule's condition held for a run (`key` tells apart
    what it held for: a finding's identity, a state); `ordinal` counts the episodes of one
    (rule, run, key). An episode alerts once, when it opens, unless the rule alerted for the run
    less than its cooldown ago (`alerted` false)."""

    __tablename__ = "alert_episodes"
    __table_args__ = (UniqueConstraint("rule_id", "run_id", "key", "ordinal"),)

    id: Mapped[int] = mapped_column(StepId, primary_key=True, autoincrement=True)
    rule_id: Mapped[str] = mapped_column(ForeignKey("alert_rules.id", ondelete="CASCADE"))
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(300))
    ordinal: Mapped[int] = mapped_column(Integer)
    opened_at: Mapped[float] = mapped_column(Double)
    closed_at: Mapped[float | None] = mapped_column(Double)
    alerted: Mapped[bool] = mapped_column(Boolean)


class Alert(Base):
    """One alert as sent (the history): `event` is `fired`, `recovered` or `test`. `dedup_key`
    (rule, run, episode, event) makes deciding it twice impossible; receivers get it as the
    delivery id, so a redelivery after a crash is recognisable."""

    __tablename__ = "alerts"
    __table_args__ = (
        Index("ix_alerts_run_id_id", "run_id", "id"),
        Index("ix_alerts_project_id", "project", "id"),
        Index("ix_alerts_rule_id_run_id", "rule_id", "run_id"),
    )

    id: Mapped[int] = mapped_column(StepId, primary_key=True, autoincrement=True)
    dedup_key: Mapped[str] = mapped_column(String(400), unique=True)
    rule_id: Mapped[str | None] = mapped_column(
        ForeignKey("alert_rules.id", ondelete="SET NULL"))
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    project: Mapped[str] = mapped_column(String(200))
    event: Mapped[str] = mapped_column(String(16))
    severity: Mapped[str] = mapped_column(String(8))
    title: Mapped[str] = mapped_column(String(500))
    explanation: Mapped[str] = mapped_column(String(4000))
    recommendation: Mapped[str] = mapped_column(String(4000))
    step_start: Mapped[int | None] = mapped_column(BigInteger)
    step_end: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Double)


class AlertDelivery(Base):
    """The outbox: one alert to one destination, retried with backoff until delivered or given
    up (`failed`). Written in the transaction that decides the alert, so none is lost."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        UniqueConstraint("alert_id", "destination_id"),
        Index("ix_alert_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(StepId, primary_key=True, autoincrement=True)
    alert_id: Mapped[int] = mapped_column(StepId, ForeignKey("alerts.id", ondelete="CASCADE"))
    destination_id: Mapped[str] = mapped_column(
        ForeignKey("alert_destinations.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[float] = mapped_column(Double)
    last_error: Mapped[str | None] = mapped_column(String(500))
    delivered_at: Mapped[float | None] = mapped_column(Double)
