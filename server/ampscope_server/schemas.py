"""Pydantic models: the wire (client → server, docs/contracts.md "Wire v1") and the API output.

Wire models are strict (no string → number coercion, unknown fields refused) so that a client
drifting from the contract fails loudly in the contract tests. Every float that may be
non-finite goes through `codec`: `WireFloat` parses the tags, `Tagged` writes them back.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ampscope_server import codec

SCHEMA_VERSION = 1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


# --- field types -------------------------------------------------------------------------------

def _wire_float(value: object) -> float | None:
    try:
        return codec.decode_wire(value)
    except codec.CodecError as exc:
        raise PydanticCustomError("wire_float", str(exc)) from None


def _finite_stat(value: object) -> float | None:
    decoded = _wire_float(value)
    if decoded is not None and not math.isfinite(decoded):
        raise PydanticCustomError(
            "finite_stat", "is defined over finite elements, so it must be a finite number or null"
        )
    return decoded


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


WireFloat = Annotated[float | None, BeforeValidator(_wire_float)]
"""A JSON number, "nan", "inf", "-inf" or null."""
FiniteStat = Annotated[Annotated[float, Field(ge=0)] | None, BeforeValidator(_finite_stat)]
Fraction = Annotated[StrictFloat, Field(ge=0, le=1, allow_inf_nan=False)]
Count = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
Int32 = Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]
Int64 = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
FiniteFloat = Annotated[StrictFloat, Field(allow_inf_nan=False)]
UUID_PATTERN = (
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
Uuid = Annotated[str, StringConstraints(strict=True, pattern=UUID_PATTERN)]
TargetFormat = Literal["fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2"]

Tagged = Annotated[float, PlainSerializer(codec.encode, return_type=float | str | None)]
"""An output float: finite → number, non-finite → "nan" / "inf" / "-inf"."""


# --- wire v1 -----------------------------------------------------------------------------------

class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunInfo(WireModel):
    id: Uuid
    project: Text200 = "default"
    name: Text200 = ""
    tags: list[Text200] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)
    host: Text255 = ""
    rank: Int32 = 0
    target_format: TargetFormat = "fp16"


class AttemptInfo(WireModel):
    id: Uuid
    pid: Int32
    started_at: FiniteFloat


class LayerInfo(WireModel):
    model_config = ConfigDict(extra="forbid", from_attributes=True)

    index: Int32
    name: Text500
    shape: list[Int64]
    dtype: Text32
    numel: Int64
    module_type: Text200


class LayerStatArrays(WireModel):
    """Per-layer statistics of one step, each array indexed by layer index (true units)."""

    amax: list[FiniteStat]
    amin_nz: list[FiniteStat]
    zero_frac: list[Fraction]
    subnormal_frac: list[Fraction]
    underflow_frac: list[Fraction]
    nan_count: list[Count]
    inf_count: list[Count]
    l2: list[FiniteStat]


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
    layers: LayerStatArrays | None = None


class IngestBatch(WireModel):
    schema_version: Literal[1]
    run: RunInfo
    attempt: AttemptInfo
    layers: list[LayerInfo] | None = None
    records: list[StepRecord]
    final: StrictBool = False

    # Model-level checks: their messages name the field themselves.
    @model_validator(mode="after")
    def _indices_in_order(self) -> IngestBatch:
        for position, layer in enumerate(self.layers or ()):
            if layer.index != position:
                raise PydanticCustomError(
                    "layer_order",
                    "layers[{position}].index is {index}; indices must be 0, 1, 2, … in order",
                    {"position": position, "index": layer.index},
                )
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


# --- API output --------------------------------------------------------------------------------

class RunStatus(str, Enum):
    ACTIVE = "active"
    FINISHED = "finished"
    CRASHED = "crashed"


class ErrorBody(BaseModel):
    detail: str


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class IngestResult(BaseModel):
    run_id: str
    attempt: int
    accepted: int
    duplicates: int


class RunSummary(BaseModel):
    id: str
    project: str
    name: str
    tags: list[str]
    status: RunStatus
    created_at: float
    """Unix seconds, server clock."""
    updated_at: float
    num_steps: int
    last_step: int | None
    last_scale: Tagged | None
    skipped_steps: int
    num_layers: int


class AttemptRead(BaseModel):
    ordinal: int
    id: str
    pid: int
    started_at: float


class RunDetail(RunSummary):
    config: dict[str, Any]
    host: str
    rank: int
    target_format: str
    attempts: list[AttemptRead]


class StepScalars(BaseModel):
    id: int
    attempt: int
    seq: int
    step: int
    wall_time: float
    loss: Tagged | None
    scale_before: Tagged | None
    scale_after: Tagged | None
    growth_tracker: int | None
    found_inf: bool
    skipped: bool
    grad_norm: Tagged | None
    lr: Tagged | None
    duration: Tagged | None


class LayerStatsRead(BaseModel):
    amax: list[float | None]
    amin_nz: list[float | None]
    zero_frac: list[float]
    subnormal_frac: list[float]
    underflow_frac: list[float]
    nan_count: list[int]
    inf_count: list[int]
    l2: list[float | None]


class StepFull(StepScalars):
    layers: LayerStatsRead | None


class StepsPage(BaseModel):
    steps: list[StepScalars]
    last_id: int


SeriesName = Literal["scale", "loss", "grad_norm", "lr", "duration"]


class SeriesPointRead(BaseModel):
    step: int
    min: Tagged | None
    max: Tagged | None
    last: Tagged | None


class SeriesRead(BaseModel):
    name: SeriesName
    downsampled: bool
    points: list[SeriesPointRead]


EventKind = Literal["skipped", "backoff", "growth"]


class EventRead(BaseModel):
    step: int
    kind: EventKind
    scale_before: Tagged | None
    scale_after: Tagged | None


class EventsRead(BaseModel):
    events: list[EventRead]


HeatmapStat = Literal[
    "amax", "amin_nz", "zero_frac", "subnormal_frac", "underflow_frac", "nan_count", "inf_count",
    "l2", "lost_frac", "headroom_bits",
]


class HeatmapRead(BaseModel):
    stat: HeatmapStat
    layers: list[str]
    steps: list[int]
    z: list[list[Tagged | None]]


class ExportRead(BaseModel):
    run: RunDetail
    layers: list[LayerInfo]
    steps: list[StepFull]


class LiveSteps(BaseModel):
    type: Literal["steps"] = "steps"
    run_id: str
    steps: list[StepFull]
    last_id: int


class LiveStatus(BaseModel):
    type: Literal["status"] = "status"
    status: RunStatus
