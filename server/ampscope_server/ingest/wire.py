"""The wire, client → server: docs/contracts.md "Wire v1" … "v7", as strict pydantic models.

Strict means no string → number coercion and unknown fields refused, so that a client drifting
from the contract fails loudly in the contract tests. Each version is the previous one plus
optional fields; a batch that carries a field of a later version than its own is refused as an
unknown field. Checks that need the run's stored
tables (array lengths, layer indices, histogram sums) are made at ingest (`batch_checks`).
Every float that may be non-finite is parsed by `runs.json_floats` (`WireFloat`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ampscope_server.runs import json_floats
from ampscope_server.store import format_packing
from ampscope_server.store.format_packing import (
    FORMAT_STATS,
    MAX_RECIPES,
    OPERAND_STATS,
    OPERANDS,
    RECIPE_PATTERN,
)

SCHEMA_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8)
SCHEMA_VERSION = SCHEMA_VERSIONS[-1]
"""The newest version; every version in `SCHEMA_VERSIONS` is accepted."""
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
HISTOGRAM_EXP_LIMIT = 1100
"""|min_exp|, |max_exp| bound: wider than float64's exponents (2^-1074 … 2^1023)."""
HISTOGRAM_EXTRA_BINS = 5
"""Bins beside one per exponent: zero, non-finite, below 2^min_exp, and at/above 2^(max_exp+1)
(with the per-exponent bins counted as max_exp - min_exp + 1, the total is max - min + 5)."""

V2_BATCH_FIELDS = ("modules", "client")
V2_RECORD_FIELDS = ("captured", "nonfinite", "misuse", "activations", "histogram")
V3_RECORD_FIELDS = ("recheck", "swallowed")
V4_RUN_FIELDS = ("world_size",)
V4_RECORD_FIELDS = ("ranks", "optimizers")
PACKED_SINCE = 5
"""v5: a record's `layers`/`activations` may arrive packed (`json_floats.unpack_stats`)."""
V6_RUN_FIELDS = ("target_format_reason",)
V6_RECORD_FIELDS = ("shadow",)
V7_RECORD_FIELDS = ("formats",)
ORIGIN_SINCE = 6
"""`records[].recheck.origin` (a field inside a v3 object) is v6's."""
SCALES_SINCE = 8
"""`records[].formats.scales` (a field inside a v7 object) is v8's: a server built before it
refuses it as an unknown field in a v7 batch, so it is a version of its own."""
LATER_FIELDS: dict[int, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    2: (V2_BATCH_FIELDS, (), V2_RECORD_FIELDS),
    3: ((), (), V3_RECORD_FIELDS),
    4: ((), V4_RUN_FIELDS, V4_RECORD_FIELDS),
    6: ((), V6_RUN_FIELDS, V6_RECORD_FIELDS),
    7: ((), (), V7_RECORD_FIELDS),
}
"""Per version: the (batch, run, record) fields it added; a batch of an earlier version may not
carry them. v6 (issue #30) holds two optional fields first shipped inside v5: a server built
before them refuses them as unknown fields in a v5 batch, so they are a version of their own,
which such a server refuses by its `schema_version` alone (the hook then sends v5 without them);
and the FP32 shadow step (`records[].shadow`). v7 (issue #33): the scaled-format what-ifs
(`records[].formats`); v8: their block scales' exponents (`records[].formats.scales`)."""
MAX_WORLD_SIZE = 65536
MAX_OPTIMIZERS = 64
MAX_PARAM_GROUPS = 1024


# --- field types -------------------------------------------------------------------------------

def _wire_float(value: object) -> float | None:
    try:
        return json_floats.decode_wire(value)
    except json_floats.CodecError as exc:
        raise PydanticCustomError("wire_float", str(exc)) from None


def _finite_stat(value: object) -> float | None:
    decoded = _wire_float(value)
    if decoded is not None and not math.isfinite(decoded):
        raise PydanticCustomError(
            "finite_stat", "is defined over finite elements, so it must be a finite number or null"
        )
    return decoded


def _non_negative_tagged(value: object) -> float | None:
    decoded = _wire_float(value)
    if decoded is not None and decoded < 0:  # NaN compares False: it passes, as a tag
        raise PydanticCustomError(
            "greater_than_equal", "Input should be greater than or equal to 0"
        )
    return decoded


def _one_when_null(value: object) -> object:
    return 1 if value is None else value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("nul_char", "must not contain NUL characters")
    return value


_NoNul = AfterValidator(_no_nul)
# Lengths match the columns in models.py: Postgres refuses longer strings, SQLite would not.
Text32 = Annotated[str, StringConstraints(strict=True, max_length=32), _NoNul]
Text200 = Annotated[str, StringConstraints(strict=True, max_length=200), _NoNul]
Text255 = Annotated[str, StringConstraints(strict=True, max_length=255), _NoNul]
Text500 = Annotated[str, StringConstraints(strict=True, max_length=500), _NoNul]
Text1000 = Annotated[str, StringConstraints(strict=True, max_length=1000), _NoNul]


WireFloat = Annotated[float | None, BeforeValidator(_wire_float)]
"""A JSON number, "nan", "inf", "-inf" or null."""
FiniteStat = Annotated[Annotated[float, Field(ge=0)] | None, BeforeValidator(_finite_stat)]

_FLOAT_OR_NULL = frozenset({float, type(None)})


def _finite_stats(value: object, handler: ValidatorFunctionWrapHandler) -> object:
    """A list of FiniteStat, checked as a whole when it is plain: floats (and nulls) whose sum
    is finite (no NaN, no inf) and whose least is ≥ 0 are exactly what the per-value check
    accepts, a scan in C instead of a Python call per value (ingest's hot path). Anything else
    (ints, tags, a sum that overflows) goes through the per-value check and its messages."""
    if type(value) is list and value and set(map(type, value)) <= _FLOAT_OR_NULL:
        present = value if None not in value else [v for v in value if v is not None]
        if not present or (math.isfinite(sum(present)) and min(present) >= 0):
            return value
    return handler(value)


FiniteStats = Annotated[list[FiniteStat], WrapValidator(_finite_stats)]
TaggedStat = Annotated[float | None, BeforeValidator(_non_negative_tagged)]
"""A number ≥ 0, "nan", "inf" or null (an activation statistic, see `ActivationStatArrays`)."""
Fraction = Annotated[StrictFloat, Field(ge=0, le=1, allow_inf_nan=False)]
Count = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
Int32 = Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]
Int64 = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
Exponent = Annotated[StrictInt, Field(ge=-HISTOGRAM_EXP_LIMIT, le=HISTOGRAM_EXP_LIMIT)]
FiniteFloat = Annotated[StrictFloat, Field(allow_inf_nan=False)]
UUID_PATTERN = (
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
Uuid = Annotated[str, StringConstraints(strict=True, pattern=UUID_PATTERN),
                 AfterValidator(str.lower)]
"""A UUID in its canonical lower-case form, whatever case the client sent: one run per UUID."""
TargetFormat = Literal["fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2"]
Captured = Literal["before_unscale", "after_unscale"]
NonfiniteKind = Literal["nan", "inf"]
MisuseKind = Literal["step_bypassed_scaler", "clip_before_unscale", "unscale_twice"]
RecheckStatus = Literal["persisted", "vanished", "failed"]


MAX_TAGS = 32
MAX_CONFIG_BYTES = 64 * 1024
MAX_CONFIG_DEPTH = 16
MAX_RECORDS = 10_000
MAX_TABLE = 100_000
"""Limits (DESIGN.md §7): each is a 422 whose message names it. Runs are listed with their tags,
so tags stay small; a config is stored and sent back whole, so it is bounded in size and depth
(a deeper one could be stored, then never serialised again)."""


def _readable_config(value: dict[str, Any]) -> dict[str, Any]:
    """A config every dialect stores and gives back: bounded, finite numbers, no NUL."""
    _check_json(value, "config", 1)
    size = len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    if size > MAX_CONFIG_BYTES:
        raise PydanticCustomError(
            "config_size", "is {size} bytes as JSON; the limit is {limit}",
            {"size": size, "limit": MAX_CONFIG_BYTES})
    return value


def _check_json(value: object, where: str, depth: int) -> None:
    if depth > MAX_CONFIG_DEPTH:
        raise PydanticCustomError(
            "config_depth", "{where} is nested deeper than {limit} levels",
            {"where": where, "limit": MAX_CONFIG_DEPTH})
    if isinstance(value, float) and not math.isfinite(value):
        raise PydanticCustomError(
            "config_number", "{where} is a non-finite number (NaN, Infinity or an overflowing "
            "literal such as 1e400): write it as a string", {"where": where})
    if isinstance(value, str) and "\x00" in value:
        raise PydanticCustomError("nul_char", "{where} contains a NUL character", {"where": where})
    if isinstance(value, dict):
        for key, item in value.items():
            if "\x00" in key:
                raise PydanticCustomError(
                    "nul_char", "a key of {where} contains a NUL character", {"where": where})
            _check_json(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]", depth + 1)


class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- v1 ----------------------------------------------------------------------------------------

class RunInfo(WireModel):
    id: Uuid
    project: Text200 = "default"
    name: Text200 = ""
    tags: Annotated[list[Text200], Field(max_length=MAX_TAGS)] = Field(default_factory=list)
    config: Annotated[dict[str, Any], AfterValidator(_readable_config)] = Field(
        default_factory=dict)
    host: Text255 = ""
    rank: Int32 = 0
    target_format: TargetFormat = "fp16"
    # v4
    world_size: Annotated[StrictInt, Field(ge=1, le=MAX_WORLD_SIZE),
                          BeforeValidator(_one_when_null)] = 1
    """The processes of the distributed job (torch.distributed's world size); absent or null:
    1. Kept from the run's first batch, like every run field."""
    # v6
    target_format_reason: Text200 | None = None
    """Why the hook judges against `target_format` (given, or inferred from the parameters'
    dtype and the loss scaling, issue #30); absent or null from clients before it."""


class AttemptInfo(WireModel):
    id: Uuid
    pid: Int32
    started_at: FiniteFloat


class LayerInfo(WireModel):
    model_config = ConfigDict(extra="forbid", from_attributes=True)

    index: Int32
    name: Text500
    shape: Annotated[list[Int64], Field(max_length=32)]
    dtype: Text32
    numel: Int64
    module_type: Text200
    raw_name: Text500 | None = None
    """The parameter's name as the model gave it, wrappers' components included (`name` is the
    canonical one, `layer_names`). Optional: clients before it sent the raw name as `name`, so
    absent means equal to `name`, and it is filled in so (stored, compared, returned)."""

    @model_validator(mode="after")
    def _raw_name_defaults_to_name(self) -> LayerInfo:
        if self.raw_name is None:
            self.raw_name = self.name
        return self


class LayerStatArrays(WireModel):
    """Per-layer statistics of one step, each array indexed by layer index (true units)."""

    amax: FiniteStats
    amin_nz: FiniteStats
    zero_frac: list[Fraction]
    subnormal_frac: list[Fraction]
    underflow_frac: list[Fraction]
    nan_count: list[Count]
    inf_count: list[Count]
    l2: FiniteStats


# --- v2 additions ------------------------------------------------------------------------------

class ModuleInfo(WireModel):
    """One entry of the module table of the `activation` source."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)

    index: Int32
    name: Text500
    module_type: Text200


class ClientAccounting(WireModel):
    """The sender's counters when the batch was built (records, cumulative per attempt)."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)

    produced: Count
    acknowledged: Count
    spooled: Count
    dropped: Count
    replayed: Count


class NonfiniteLayer(WireModel):
    layer: Int32
    kind: NonfiniteKind


class Misuse(WireModel):
    kind: MisuseKind
    detail: Text1000


class ActivationStatArrays(WireModel):
    """Per-module statistics of `grad_output` at one step, indexed by module index (true units).

    The definitions are those of `LayerStatArrays`, but amax, amin_nz and l2 may also arrive as
    "nan"/"inf": the activation source reduces a gradient as it flowed in low precision, where a
    reduction can overflow. Such values are stored and served back as sent.
    """

    amax: list[TaggedStat]
    amin_nz: list[TaggedStat]
    zero_frac: list[Fraction]
    subnormal_frac: list[Fraction]
    underflow_frac: list[Fraction]
    nan_count: list[Count]
    inf_count: list[Count]
    l2: list[TaggedStat]


class Histogram(WireModel):
    """Exponent histogram of the `param` gradients, `counts[layer][bin]` (bins: contracts.md)."""

    min_exp: Exponent
    max_exp: Exponent
    counts: list[list[Count]]

    @property
    def num_bins(self) -> int:
        return self.max_exp - self.min_exp + HISTOGRAM_EXTRA_BINS


# --- v3 additions ------------------------------------------------------------------------------

class ForwardOrigin(WireModel):
    """Where a forward overflow began, read in the re-check's re-run: the first module in
    forward order (a submodule before the module holding it) whose output was NaN/inf
    (`format` `fp32`: in the FP32 re-run itself) or whose output or input was beyond the
    training format's range (`format`: that format), and whether its inputs held no NaN/inf."""

    module: Text500
    input_finite: StrictBool
    format: Literal["fp16", "bf16", "fp32"]


class Recheck(WireModel):
    """The FP32 re-check of an overflow step: did the NaN/inf persist without autocast and
    scaling (`persisted`: data or model) or not (`vanished`: dynamic range); `failed`: the
    user's closure raised (`detail`). `layers`: parameters whose FP32 gradient was non-finite,
    in backward order; `loss`: the FP32 loss (null when not given)."""

    status: RecheckStatus
    loss: WireFloat = None
    layers: list[NonfiniteLayer] = Field(default_factory=list)
    detail: Text1000 | None = None
    origin: ForwardOrigin | None = None
    """v6, optional: where the forward overflow began (null: every output fit, or not read)."""


class Shadow(WireModel):
    """The sampled FP32 shadow step (v6): the user's closure re-run in FP32 from the same
    weights and batch as an applied AMP step, each layer's gradient compared with the AMP one
    (`rel_err = ||g_amp - g_fp32|| / ||g_fp32||`, the cosine, `||g_fp32||` itself in true
    units; null: no gradient to compare); `failed`: the closure raised (`detail`), nothing else
    carried."""

    status: Literal["ok", "failed"]
    loss: WireFloat = None
    rel_err: Annotated[list[WireFloat], Field(max_length=MAX_TABLE)] | None = None
    cosine: Annotated[list[WireFloat], Field(max_length=MAX_TABLE)] | None = None
    norm: Annotated[list[WireFloat], Field(max_length=MAX_TABLE)] | None = None
    detail: Text1000 | None = None


# --- v7 additions ------------------------------------------------------------------------------

def _float_block(value: object) -> bytes:
    """Float64 values as little-endian bytes: `{"f64le": "<base64>"}` taken as sent (no
    Python call per value), or a JSON array of numbers and "nan", "inf", "-inf" (never null:
    NaN is what says "not measured")."""
    if json_floats.packed(value):
        block = cast(Mapping[str, object], value)
        if set(block) != {json_floats.PACKED}:
            raise PydanticCustomError(
                "packed_floats", "a packed block has the one key '{key}', got {keys}",
                {"key": json_floats.PACKED, "keys": str(sorted(block))})
        try:
            return json_floats.unpack_bytes(block[json_floats.PACKED])
        except json_floats.CodecError as exc:
            raise PydanticCustomError("packed_floats", str(exc)) from None
    if type(value) is not list:
        raise PydanticCustomError(
            "float_block", 'expected {"f64le": "<base64>"} or an array of numbers')
    if value and set(map(type, value)) == {float} and math.isfinite(sum(value)):
        return format_packing.pack(value)  # plain finite floats: at once, in C
    floats: list[float] = []
    for i, item in enumerate(value):
        try:
            decoded = json_floats.decode_wire(item)
        except (json_floats.CodecError, OverflowError) as exc:
            raise PydanticCustomError("wire_float", "entry {i}: {reason}",
                                      {"i": i, "reason": str(exc)}) from None
        if decoded is None:
            raise PydanticCustomError(
                "wire_float", 'entry {i} is null: a value not measured is "nan"', {"i": i})
        floats.append(decoded)
    return format_packing.pack(floats)


FloatBlock = Annotated[bytes, PlainValidator(_float_block), WithJsonSchema({"anyOf": [
    {"type": "object", "properties": {"f64le": {"type": "string", "contentEncoding": "base64"}},
     "required": ["f64le"], "additionalProperties": False},
    {"type": "array", "items": {"anyOf": [{"type": "number"},
                                          {"enum": ["nan", "inf", "-inf"]}]}},
]})]
"""float64 values (`_float_block`), held as the little-endian bytes that are stored."""
RecipeName = Annotated[str, StringConstraints(strict=True, pattern=RECIPE_PATTERN)]


class Trained(WireModel):
    """The recipe each listed module really trains in (null: none; torchao's Float8Linear),
    and per layer and operand the amax that recipe computed its scale from and the scale
    (len(layers) x 3 each, over (layer, `OPERANDS`); a row-wise recipe's: its largest row's;
    NaN: not kept)."""

    recipes: Annotated[list[RecipeName | None], Field(min_length=1, max_length=MAX_TABLE)]
    amax: FloatBlock
    scale: FloatBlock


class Formats(WireModel):
    """What scaled low-precision recipes would do to each sampled module's three GEMM operands
    at this step (v7; `format_packing` holds the names and the layout). `layers`: the modules'
    weights' rows of the layer table; `values`: len(layers) x 3 x len(recipes) x 5 float64
    values, row-major over (layer, `OPERANDS`, recipe, `FORMAT_STATS`); `operands`:
    len(layers) x 3 x 4 over (layer, operand, `OPERAND_STATS`). NaN: not measured (a module
    without a gradient this step); ±inf are data."""

    recipes: Annotated[list[RecipeName], Field(min_length=1, max_length=MAX_RECIPES)]
    layers: Annotated[list[Int32], Field(min_length=1, max_length=MAX_TABLE)]
    values: FloatBlock
    operands: FloatBlock
    trained: Trained | None = None
    """Only when some listed module really trains in a recipe (absent: none does)."""
    scales: FloatBlock | None = None
    """v8: len(layers) x 3 x len(recipes) x `SCALE_WIDTH` over (layer, operand, recipe): the
    greatest exponent of the blocks' scales (NaN: no block holds a non-zero value, or not
    measured), then their counts by binades below it (`format_packing.SCALE_WIDTH`)."""


# --- v4 additions ------------------------------------------------------------------------------

class RankValues(WireModel):
    """One value per rank of the job (`run.world_size` of each), rank r at index r: the loss
    rank r computed this step (null: it recorded none) and how many watched layers held a NaN
    or ±inf in rank r's gradient (its local shard under FSDP) at the capture (null: unknown)."""

    loss: Annotated[list[WireFloat], Field(max_length=MAX_WORLD_SIZE)]
    nonfinite: Annotated[list[Count | None], Field(max_length=MAX_WORLD_SIZE)]


class OptimizerStep(WireModel):
    """One watched optimizer at one step: whether its update was skipped (GradScaler found inf
    in its gradients; null: unknown) and the lr of each of its parameter groups (null: that
    group has none)."""

    skipped: StrictBool | None = None
    lr: Annotated[list[WireFloat], Field(max_length=MAX_PARAM_GROUPS)]


# --- records and the batch ---------------------------------------------------------------------

def _unpacked(value: object) -> object:
    """A packed statistics block (v5) as its JSON form; anything else as it is."""
    if not json_floats.packed(value):
        return value
    try:
        return json_floats.unpack_stats(cast(Mapping[str, object], value))
    except json_floats.CodecError as exc:
        raise PydanticCustomError("packed_stats", str(exc)) from None


Unpacked = BeforeValidator(_unpacked)


class StepRecord(WireModel):
    seq: Int64
    step: Int64
    wall_time: FiniteFloat
    loss: WireFloat = None
    scale_before: WireFloat = None
    scale_after: WireFloat = None
    growth_tracker: Annotated[StrictInt, Field(ge=-INT64_MAX, le=INT64_MAX)] | None = None
    found_inf: StrictBool
    skipped: StrictBool
    grad_norm: WireFloat = None
    lr: WireFloat = None
    duration: WireFloat = None
    layers: Annotated[LayerStatArrays | None, Unpacked] = None
    # v2
    captured: Captured | None = None
    nonfinite: list[NonfiniteLayer] | None = None
    misuse: list[Misuse] | None = None
    activations: Annotated[ActivationStatArrays | None, Unpacked] = None
    histogram: Histogram | None = None
    # v3
    recheck: Recheck | None = None
    swallowed: list[Fraction | None] | None = None
    # v4
    ranks: RankValues | None = None
    optimizers: Annotated[list[OptimizerStep],
                          Field(min_length=1, max_length=MAX_OPTIMIZERS)] | None = None
    # v6
    shadow: Shadow | None = None
    # v7
    formats: Formats | None = None
    """Absent or null: not sampled on this step."""


def _in_order(name: str, items: Sequence[LayerInfo | ModuleInfo] | None) -> None:
    for position, item in enumerate(items or ()):
        if item.index != position:
            raise PydanticCustomError(
                "index_order",
                "{name}[{position}].index is {index}; indices must be 0, 1, 2, … in order",
                {"name": name, "position": position, "index": item.index},
            )


class IngestBatch(WireModel):
    schema_version: Literal[1, 2, 3, 4, 5, 6, 7, 8]
    run: RunInfo
    attempt: AttemptInfo
    layers: Annotated[list[LayerInfo], Field(max_length=MAX_TABLE)] | None = None
    records: Annotated[list[StepRecord], Field(max_length=MAX_RECORDS)]
    final: StrictBool = False
    # v2
    modules: Annotated[list[ModuleInfo], Field(max_length=MAX_TABLE)] | None = None
    client: ClientAccounting | None = None

    @model_validator(mode="before")
    @classmethod
    def _packed_only_from_v5(cls, data: object) -> object:
        """Packed statistics are v5's: an earlier batch carrying them is refused by name."""
        if not isinstance(data, dict):
            return data
        version, records = data.get("schema_version"), data.get("records")
        if type(version) is not int or version >= PACKED_SINCE or type(records) is not list:
            return data
        for position, record in enumerate(records):
            for name in ("layers", "activations"):
                if isinstance(record, dict) and json_floats.packed(record.get(name)):
                    raise PydanticCustomError(
                        "later_version_field",
                        "records[{position}].{name}: packed statistics need schema_version 5, "
                        "not {version}", {"position": position, "name": name, "version": version})
        return data

    # Model-level checks: their messages name the field themselves.
    @model_validator(mode="after")
    def _no_fields_of_later_versions(self) -> IngestBatch:
        version = self.schema_version
        later = [fields for added, fields in sorted(LATER_FIELDS.items()) if added > version]
        unknown = [name for batch_fields, _, _ in later for name in batch_fields
                   if name in self.model_fields_set]
        unknown += [f"run.{name}" for _, run_fields, _ in later for name in run_fields
                    if name in self.run.model_fields_set]
        unknown += [
            f"records[{position}].{name}"
            for position, record in enumerate(self.records)
            for _, _, record_fields in later
            for name in record_fields
            if name in record.model_fields_set
        ]
        if version < ORIGIN_SINCE:
            unknown += [f"records[{position}].recheck.origin"
                        for position, record in enumerate(self.records)
                        if record.recheck is not None
                        and "origin" in record.recheck.model_fields_set]
        if version < SCALES_SINCE:
            unknown += [f"records[{position}].formats.scales"
                        for position, record in enumerate(self.records)
                        if record.formats is not None
                        and "scales" in record.formats.model_fields_set]
        if unknown:
            raise PydanticCustomError(
                "later_version_field",
                "; ".join(f"{name}: unknown field in schema_version {version}"
                          for name in unknown),
            )
        return self

    @model_validator(mode="after")
    def _indices_in_order(self) -> IngestBatch:
        _in_order("layers", self.layers)
        _in_order("modules", self.modules)
        return self

    @model_validator(mode="after")
    def _unique_seqs(self) -> IngestBatch:
        seen: set[int] = set()
        for position, record in enumerate(self.records):
            if record.seq in seen:
                raise PydanticCustomError(
                    "duplicate_seq",
                    "records[{position}].seq {seq} appears more than once in this batch",
                    {"position": position, "seq": record.seq},
                )
            seen.add(record.seq)
        return self

    @model_validator(mode="after")
    def _records_consistent(self) -> IngestBatch:
        """Checks within one record: nonfinite layers listed once, histogram bin counts."""
        for position, record in enumerate(self.records):
            where = f"records[{position}]"
            seen: set[int] = set()
            for i, entry in enumerate(record.nonfinite or ()):
                if entry.layer in seen:
                    raise PydanticCustomError(
                        "duplicate_layer",
                        "{where}.nonfinite[{i}].layer {layer} appears more than once",
                        {"where": where, "i": i, "layer": entry.layer},
                    )
                seen.add(entry.layer)
            if record.recheck is not None:
                _check_recheck(record.recheck, f"{where}.recheck")
            if record.shadow is not None:
                _check_shadow(record.shadow, f"{where}.shadow")
            if record.formats is not None:
                _check_formats(record.formats, f"{where}.formats")
            if record.ranks is not None:
                _check_ranks(record.ranks, f"{where}.ranks", self.run.world_size)
            histogram = record.histogram
            if histogram is None:
                continue
            if histogram.max_exp < histogram.min_exp:
                raise PydanticCustomError(
                    "histogram_range",
                    "{where}.histogram.max_exp {max_exp} is less than min_exp {min_exp}",
                    {"where": where, "max_exp": histogram.max_exp, "min_exp": histogram.min_exp},
                )
            for i, counts in enumerate(histogram.counts):
                if len(counts) != histogram.num_bins:
                    raise PydanticCustomError(
                        "histogram_bins",
                        "{where}.histogram.counts[{i}] has {n} bins; min_exp {min_exp} and "
                        "max_exp {max_exp} need {bins} (max_exp - min_exp + 5)",
                        {"where": where, "i": i, "n": len(counts), "min_exp": histogram.min_exp,
                         "max_exp": histogram.max_exp, "bins": histogram.num_bins},
                    )
        return self


def _check_shadow(shadow: Shadow, where: str) -> None:
    """A failed shadow step carries its detail and nothing else; a run one carries the three
    per-layer arrays, equally long, and no detail."""
    arrays = (shadow.rel_err, shadow.cosine, shadow.norm)
    if shadow.status == "failed":
        if shadow.loss is not None or any(a is not None for a in arrays):
            raise PydanticCustomError(
                "shadow_status",
                "{where}: a failed shadow step carries no loss, rel_err, cosine or norm",
                {"where": where})
        if shadow.detail is None:
            raise PydanticCustomError(
                "shadow_status", "{where}.detail: a failed shadow step says why",
                {"where": where})
        return
    if shadow.detail is not None:
        raise PydanticCustomError(
            "shadow_status", "{where}.detail: only a failed shadow step carries a detail",
            {"where": where})
    if shadow.rel_err is None or shadow.cosine is None or shadow.norm is None:
        raise PydanticCustomError(
            "shadow_status", "{where}: a shadow step that ran carries rel_err, cosine and norm",
            {"where": where})
    for name, values in (("cosine", shadow.cosine), ("norm", shadow.norm)):
        if len(values) != len(shadow.rel_err):
            raise PydanticCustomError(
                "shadow_lengths",
                "{where}.rel_err has {n} entries and {name} {m}: one per layer each",
                {"where": where, "n": len(shadow.rel_err), "name": name, "m": len(values)})


def _check_formats(formats: Formats, where: str) -> None:
    """Recipes and layers listed once each; as many values and operand statistics as they say
    (whether the layers are in the run's table is `batch_checks`')."""
    for name, items in (("recipes", formats.recipes), ("layers", formats.layers)):
        seen: set[object] = set()
        for i, item in enumerate(items):
            if item in seen:
                raise PydanticCustomError(
                    "duplicate_entry", "{where}.{name}[{i}] {item} appears more than once",
                    {"where": where, "name": name, "i": i, "item": repr(item)})
            seen.add(item)
    layers, recipes = len(formats.layers), len(formats.recipes)
    for name, block, expected, shape in (
        ("values", formats.values, format_packing.values_count(layers, recipes),
         f"{layers} layers x {len(OPERANDS)} operands x {recipes} recipes x "
         f"{len(FORMAT_STATS)} statistics"),
        ("operands", formats.operands, format_packing.operands_count(layers),
         f"{layers} layers x {len(OPERANDS)} operands x {len(OPERAND_STATS)} statistics"),
        ("scales", formats.scales, format_packing.scales_count(layers, recipes),
         f"{layers} layers x {len(OPERANDS)} operands x {recipes} recipes x "
         f"{format_packing.SCALE_WIDTH} values"),
    ):
        if block is None:
            continue
        count = len(block) // format_packing.VALUE_BYTES
        if count != expected:
            raise PydanticCustomError(
                "formats_length", "{where}.{name} has {count} entries, expected {expected}: "
                "{shape}", {"where": where, "name": name, "count": count,
                            "expected": expected, "shape": shape})
    if formats.scales is not None:
        _check_scales(format_packing.unpack(formats.scales), f"{where}.scales")
    trained = formats.trained
    if trained is None:
        return
    if len(trained.recipes) != layers:
        raise PydanticCustomError(
            "formats_length", "{where}.trained.recipes has {count} entries, expected {layers}: "
            "one per layer", {"where": where, "count": len(trained.recipes), "layers": layers})
    for name, block in (("amax", trained.amax), ("scale", trained.scale)):
        count = len(block) // format_packing.VALUE_BYTES
        if count != layers * len(OPERANDS):
            raise PydanticCustomError(
                "formats_length", "{where}.trained.{name} has {count} entries, expected "
                "{expected}: {layers} layers x {operands} operands",
                {"where": where, "name": name, "count": count,
                 "expected": layers * len(OPERANDS), "layers": layers,
                 "operands": len(OPERANDS)})


def _check_scales(values: Sequence[float], where: str) -> None:
    """Each (layer, operand, recipe)'s `SCALE_WIDTH` values are all NaN (not measured), or a
    NaN top over counts of 0 (no block held a value), or a whole top within float64's exponents
    over whole counts from 0 to 2^53: what the API gives back as integers, exactly."""
    width = format_packing.SCALE_WIDTH
    for start in range(0, len(values), width):
        # Builtins over each group (no Python step per value: a 100-layer, six-recipe sample
        # is 1,800 groups); the first bad entry is looked for only once a group fails.
        top, counts = values[start], values[start + 1 : start + width]
        if math.isnan(top):
            if all(map(math.isnan, counts)) or not any(counts):
                continue
        elif (-1074 <= top <= 1023 and top.is_integer() and all(map(float.is_integer, counts))
              and min(counts) >= 0 and max(counts) <= 2**53):
            continue
        entry = next((start + 1 + k for k, c in enumerate(counts)
                      if not (_whole(c) and 0 <= c <= 2**53)), start)
        raise PydanticCustomError(
            "formats_scales", "{where}[{entry}] is {value}: each {width} values are a "
            "whole exponent from -1074 to 1023 (nan: no block held a value, then counts "
            "of 0) and {bins} whole counts from 0 to 2^53, or all nan (not measured)",
            {"where": where, "entry": entry, "value": json_floats.encode(values[entry]),
             "width": width, "bins": format_packing.SCALE_BINS})


def _whole(value: float) -> bool:
    return math.isfinite(value) and value == int(value)


def _check_recheck(recheck: Recheck, where: str) -> None:
    """Layers listed once; the status agrees with what the re-check found."""
    seen: set[int] = set()
    for i, entry in enumerate(recheck.layers):
        if entry.layer in seen:
            raise PydanticCustomError(
                "duplicate_layer", "{where}.layers[{i}].layer {layer} appears more than once",
                {"where": where, "i": i, "layer": entry.layer},
            )
        seen.add(entry.layer)
    nonfinite_loss = recheck.loss is not None and not math.isfinite(recheck.loss)
    if recheck.status == "failed":
        if recheck.layers or recheck.loss is not None or recheck.origin is not None:
            raise PydanticCustomError(
                "recheck_status",
                "{where}: a failed re-check carries no loss, no layers and no origin",
                {"where": where})
        return
    if recheck.detail is not None:
        raise PydanticCustomError(
            "recheck_status", "{where}.detail: only a failed re-check carries a detail",
            {"where": where})
    persisted = nonfinite_loss or bool(recheck.layers)
    if persisted != (recheck.status == "persisted"):
        raise PydanticCustomError(
            "recheck_status",
            "{where}.status is '{status}', but the FP32 loss is {loss} and {n} layers were "
            "non-finite: 'persisted' exactly when the loss is non-finite or a layer is listed",
            {"where": where, "status": recheck.status, "loss": json_floats.encode(recheck.loss),
             "n": len(recheck.layers)},
        )


def _check_ranks(ranks: RankValues, where: str, world_size: int) -> None:
    """One value per rank of the batch's `run.world_size` in each array."""
    for name in ("loss", "nonfinite"):
        count = len(getattr(ranks, name))
        if count != world_size:
            raise PydanticCustomError(
                "ranks_length", "{where}.{name} has {count} values for a world_size of {size}",
                {"where": where, "name": name, "count": count, "size": world_size})
