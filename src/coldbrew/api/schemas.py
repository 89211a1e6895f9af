"""The ``POST /jobs`` body: parsed strictly, with one specific message per mistake.

Strict JSON parsing: ``"priority": "5"`` is an error rather than a guess, and
an unknown field is rejected so a typo (``"prority"``) never passes silently.
The bounds are the worker's own (model.py); the rest of what a worker would
refuse, ``Client.submit`` refuses with the worker's code (``check_submission``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


class SubmitBody(BaseModel):
    """A job submission; the job id comes from the ``Idempotency-Key`` header or is new."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    type: Annotated[str, Field(pattern=JOB_TYPE_RE.pattern)]
    args: dict[str, Any] = Field(default_factory=dict)
    tenant: Annotated[str | None, Field(pattern=NAME_RE.pattern)] = None
    queue: Annotated[str | None, Field(pattern=NAME_RE.pattern)] = None
    priority: Annotated[int, Field(ge=0, le=MAX_PRIORITY)] = 0
    max_attempts: Annotated[int | None, Field(ge=1, le=MAX_ATTEMPTS)] = None
    # the worker's bounds (model.py); what else a worker refuses (a NUL in args, NaN,
    # a body over its limit) Client.submit refuses with the worker's own checks
    timeout_seconds: Annotated[
        float | None, Field(ge=MIN_TIMEOUT_SECONDS, lt=MAX_TIMEOUT_SECONDS)
    ] = None
    # scheduled jobs: one of them; run_at is ISO 8601 with its offset, read by durations.py
    # (routes.py), and both, a naive time or one too far ahead are refused by Client.submit
    run_at: str | None = None
    delay_seconds: Annotated[
        float | None, Field(ge=0, le=MAX_SCHEDULE_SECONDS, allow_inf_nan=False)
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
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = f"unknown field; allowed: {', '.join(SubmitBody.model_fields)}"
        raise ApiError(422, "invalid_body", f"{field}: {message}") from None
