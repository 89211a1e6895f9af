"""The ``POST /jobs`` body: parsed strictly, with one specific message per mistake.

Strict JSON parsing: ``"priority": "5"`` is an error rather than a guess, and
an unknown field is rejected so a typo (``"prority"``) never passes silently.
The bounds are the worker's own (model.py); the rest of what a worker would
refuse, ``Client.submit`` refuses with the worker's code (``check_submission``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from coldbrew.api.errors import ApiError
from coldbrew.app import JOB_TYPE_RE
from coldbrew.durations import MAX_SCHEDULE_SECONDS, DurationError, parse_instant
from coldbrew.model import (
    MAX_ATTEMPTS,
    MAX_PRIORITY,
    MAX_TIMEOUT_SECONDS,
    MIN_TIMEOUT_SECONDS,
    NAME_RE,
)
from coldbrew.unique import MAX_PERIOD_SECONDS
from coldbrew.urlguard import MAX_URL_LENGTH

UniquePart = Literal["args", "tenant", "queue"]
UniqueState = Literal[
    "queued", "running", "retrying", "succeeded", "failed", "dead", "cancelled", "scheduled"
]


def _given(field: str) -> dict[str, Any]:
    """JSON Schema for "the body has ``field`` and it is not null"."""
    return {"required": [field], "properties": {field: {"not": {"type": "null"}}}}


_UNIQUE_RULES: dict[str, Any] = {
    # the rules unique.py applies across fields, so that the document says them too:
    # unique_by, unique_states and unique_keys need unique_for; unique_keys narrows the
    # args, so a unique_by that is given must include them
    "allOf": [
        *(
            {"if": _given(field), "then": _given("unique_for")}
            for field in ("unique_by", "unique_states", "unique_keys")
        ),
        # a scheduled job: run_at or delay_seconds, not both
        {"not": {"allOf": [_given("run_at"), _given("delay_seconds")]}},
        # a unique job cannot be scheduled yet (Client.submit refuses the pair)
        {
            "not": {
                "allOf": [
                    _given("unique_for"),
                    {"anyOf": [_given("run_at"), _given("delay_seconds")]},
                ]
            }
        },
        {
            "if": {"allOf": [_given("unique_keys"), _given("unique_by")]},
            "then": {"properties": {"unique_by": {"contains": {"const": "args"}}}},
        },
    ]
}
RUN_AT_TEXT = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)
"""``run_at`` over HTTP: RFC 3339 (ISO 8601 with seconds and an offset), as the schema's
``date-time`` format says; the same text ``durations.parse_instant`` reads."""
UNIQUE_FOR_TEXT = r"^(infinity|[1-9][0-9]{0,2}(s|m|h|d))$"
"""``unique_for`` as text over HTTP: ``infinity`` or one unit (``90s``, ``15m``, ``2h``,
``30d``); anything longer is a number of seconds."""


def _json_integer(value: Any) -> Any:
    """JSON Schema's integer: 7 and 7.0 alike (one number), never "7" or true."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JSON_INTEGER = BeforeValidator(_json_integer)
"""On an integer field: strict (no strings, no booleans), but 7.0 is 7, as in JSON Schema."""


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
WEBHOOK_URL_TEXT = (
    rf"^[Hh][Tt][Tt][Pp][Ss]?://(?:{_LABEL}\.)*[A-Za-z](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?"
    rf"(?::{_PORT})?(?:[/?][\x21-\x7e]*)?$"
)
"""A webhook URL over HTTP: http(s), a host name whose last label starts with a letter
(so never a literal address), an optional port 1-65535, then printable ASCII."""


class SubmitBody(BaseModel):
    """A job submission; the job id comes from the ``Idempotency-Key`` header or is new."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, json_schema_extra=_UNIQUE_RULES
    )

    type: Annotated[str, Field(pattern=JOB_TYPE_RE.pattern)]
    args: dict[str, Any] = Field(default_factory=dict)
    tenant: Annotated[str | None, Field(pattern=NAME_RE.pattern)] = None
    queue: Annotated[str | None, Field(pattern=NAME_RE.pattern)] = None
    priority: Annotated[int, Field(ge=0, le=MAX_PRIORITY), JSON_INTEGER] = 0
    max_attempts: Annotated[int | None, Field(ge=1, le=MAX_ATTEMPTS), JSON_INTEGER] = None
    # the worker's bounds (model.py); what else a worker refuses (a NUL in args, NaN,
    # a body over its limit) Client.submit refuses with the worker's own checks
    timeout_seconds: Annotated[
        float | None, Field(ge=MIN_TIMEOUT_SECONDS, lt=MAX_TIMEOUT_SECONDS)
    ] = None
    # unique jobs (README "Unique jobs"): over HTTP the window is seconds, "infinity" or
    # one unit ("15m"; UNIQUE_FOR_TEXT); the rules across fields are Client.submit's
    # (unique.py, 422 invalid_unique) and the schema's (_UNIQUE_RULES)
    unique_for: (
        Annotated[float, Field(gt=0, le=MAX_PERIOD_SECONDS)]
        | Annotated[str, Field(pattern=UNIQUE_FOR_TEXT)]
        | None
    ) = None
    unique_by: Annotated[list[UniquePart], Field(min_length=1)] | None = None
    unique_states: Annotated[list[UniqueState], Field(min_length=1)] | None = None
    unique_keys: (
        Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None
    ) = None
    # scheduled jobs: one of them; run_at is ISO 8601 with its offset, read by durations.py
    # (routes.py), and both, a naive time or one too far ahead are refused by Client.submit
    run_at: (
        Annotated[str, Field(pattern=RUN_AT_TEXT, json_schema_extra={"format": "date-time"})] | None
    ) = None
    delay_seconds: Annotated[
        float | None, Field(ge=0, le=MAX_SCHEDULE_SECONDS, allow_inf_nan=False)
    ] = None
    # durable webhooks (README "Webhooks"): over HTTP the host is a name, checked with its
    # addresses at delivery (a literal address, which Client.submit would judge at once,
    # is left to Python callers and AMQP producers: the schema says exactly what is taken)
    webhook_url: Annotated[
        str | None, Field(max_length=MAX_URL_LENGTH, pattern=WEBHOOK_URL_TEXT)
    ] = None

    def schedule(self) -> datetime | None:
        """``run_at`` as an aware datetime; a 422 ``bad_run_at`` when it is not ISO 8601
        with an offset."""
        if self.run_at is None:
            return None
        try:
            return parse_instant(self.run_at)
        except DurationError as exc:
            raise ApiError(422, "bad_run_at", f"run_at: {exc}") from None


def parse_submit(body: bytes) -> SubmitBody:
    """Validate a request body; raise a 400 (not JSON) or 422 naming the field at fault."""
    try:
        return SubmitBody.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            raise ApiError(
                400, "invalid_json", f"the body is not JSON: {first['ctx']['error']}"
            ) from None
        if first["type"] == "model_type":
            raise ApiError(422, "invalid_body", "the body must be a JSON object") from None
        field = ".".join(str(part) for part in first["loc"]) or "body"
        if first["loc"][:1] == ("run_at",) and first["type"] == "string_pattern_mismatch":
            raise ApiError(
                422,
                "bad_run_at",
                f"run_at: {first['input']!r} is not an RFC 3339 time with seconds and an "
                "offset (e.g. 2026-12-01T20:00:00Z)",
            ) from None
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = f"unknown field; allowed: {', '.join(SubmitBody.model_fields)}"
        raise ApiError(422, "invalid_body", f"{field}: {message}") from None
