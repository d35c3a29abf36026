"""Request and response bodies of the alert API (apart from the ORM models, as every schema)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from ampscope_server.findings import KINDS

Severity = Literal["info", "warning", "error"]
FindingKind = Literal[KINDS]  # type: ignore[valid-type]


def _storable(value: str) -> str:
    """Text both databases store and give back: no NUL, no lone UTF-16 surrogate (which a
    JSON body may carry as an escape, and which is not text)."""
    if "\x00" in value:
        raise PydanticCustomError("nul_char", "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError(
            "surrogate", "must not contain a lone UTF-16 surrogate such as \\ud800") from None
    return value


Storable = AfterValidator(_storable)
Name = Annotated[str, Field(min_length=1, max_length=200), Storable]
Project = Annotated[str, Field(max_length=200), Storable]


class FindingCondition(BaseModel):
    """A finding of `finding_kind` (null: any kind) at least as severe as the rule."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["finding"]
    finding_kind: FindingKind | None = None


class SeriesCondition(BaseModel):
    """Over the run's last `window` steps: skip rate above `threshold` (a share), a non-finite
    loss, the loss scale at or below `threshold`, or the worst layer's lost share above it."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["series"]
    metric: Literal["skip_rate", "nonfinite_loss", "scale", "layer_lost"]
    threshold: float = Field(0.0, allow_inf_nan=False)
    window: int = Field(100, ge=1, le=10_000)


class StateCondition(BaseModel):
    """The run crashed, finished, or stalled: no record for `stall_factor` x its usual interval
    between records, and at least `stall_min_s` seconds."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["state"]
    state: Literal["crashed", "stalled", "finished"]
    stall_factor: float = Field(10.0, gt=1, le=1000, allow_inf_nan=False)
    stall_min_s: float = Field(120.0, ge=1, le=7 * 86400, allow_inf_nan=False)


Condition = Annotated[FindingCondition | SeriesCondition | StateCondition,
                      Field(discriminator="kind")]


class RuleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    project: Project
    name: Name
    condition: Condition
    severity: Severity = "error"
    """A finding rule: the least severe finding it alerts on. Else: the level of its alerts."""
    cooldown_s: float = Field(600.0, ge=0, le=7 * 86400, allow_inf_nan=False)
    """After an alert, the same rule stays quiet for the same run this long."""
    enabled: bool = True


class RuleUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Name | None = None
    severity: Severity | None = None
    cooldown_s: float | None = Field(None, ge=0, le=7 * 86400, allow_inf_nan=False)
    enabled: bool | None = None


class RuleRead(BaseModel):
    id: str
    project: str
    name: str
    condition: FindingCondition | SeriesCondition | StateCondition
    severity: Severity
    cooldown_s: float
    enabled: bool
    builtin: str | None
    """Which shipped default this is (null: made by a user)."""
    created_at: float


class DestinationCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    project: Project
    name: Name
    kind: Literal["slack", "discord", "webhook"]
    url: Annotated[str, Field(min_length=1, max_length=2000), Storable]
    """Kept on the server and never returned: Slack's and Discord's carry their secret."""
    min_severity: Severity = "warning"
    signing_secret: Annotated[str, Field(min_length=16, max_length=128), Storable] | None = None
    """`webhook` only: the HMAC key; made by the server (and returned once) when not given."""
    enabled: bool = True


class DestinationRead(BaseModel):
    id: str
    project: str
    name: str
    kind: Literal["slack", "discord", "webhook"]
    target: str
    """Where it posts, without the path (which may hold a secret): `https://hooks.slack.com/…`."""
    min_severity: Severity
    signed: bool
    enabled: bool
    created_at: float


class DestinationCreated(DestinationRead):
    signing_secret: str | None
    """In this answer only (a generic webhook's HMAC key)."""


class DeliveryRead(BaseModel):
    destination_id: str
    destination: str
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    next_attempt_at: float
    last_error: str | None
    delivered_at: float | None


class AlertRead(BaseModel):
    id: int
    event: Literal["fired", "recovered", "test"]
    severity: Severity
    project: str
    run_id: str | None
    rule_id: str | None
    title: str
    explanation: str
    recommendation: str
    step_start: int | None
    step_end: int | None
    created_at: float
    deliveries: list[DeliveryRead]


class AlertsPage(BaseModel):
    alerts: list[AlertRead]
    next_before: int | None
    """Pass as `before` for the next (older) page; null: no more."""
