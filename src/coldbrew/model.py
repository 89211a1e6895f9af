"""Job records, statuses and the producer message contract, with no I/O.

``parse_envelope`` is the one place a delivery is checked against the message
contract of DESIGN §1: everything it rejects becomes a dead letter with a
stable reason code, so a producer in any language learns exactly what it did
wrong. ``check_submission`` is its other side: every coldbrew submitter (the
``Client``, so the CLI and ``POST /jobs`` too) refuses with it what a worker
would reject, and ``message_body`` / ``message_headers`` build exactly what
``parse_envelope`` reads back (tests/unit/test_contract_roundtrip.py), so an
accepted job is one a worker runs.
"""

from __future__ import annotations

import enum
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from coldbrew import durations, storable, tracing, urlguard
from coldbrew.app import JOB_TYPE_RE
from coldbrew.errors import ContractViolation, InvalidRequest, UnstorableValue

# Always .fullmatch(): with .match, "$" also matches before a trailing newline, and a
# tenant "acme\n" made a queue name pamqp refuses, which stranded its delivery.
NAME_RE = re.compile(r"^[a-z0-9_-]{1,64}$")
JOB_ID_RE = re.compile(r"^[\x21-\x7e]{1,128}$")
MAX_PRIORITY = 9
MAX_ATTEMPTS = 1000
MAX_IDEMPOTENCY_KEY = 256
MIN_TIMEOUT_SECONDS = 0.001
"""The shortest job timeout (1 ms); a shorter one is refused, not rounded."""
MAX_TIMEOUT_SECONDS = 10_000_000
"""Timeouts must be below this (about 116 days)."""
_ID_NAMESPACE = uuid.UUID("8f6c1f2e-6a4b-4f7e-9a55-0c01db5e7a11")


class Status(enum.StrEnum):
    """A job's status; mirrors the ``job_status`` enum in sql/schema.sql."""

    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"
    SCHEDULED = "scheduled"
    """Waiting for its ``run_at`` (``submit(run_at=, delay=)``, ``x-run-at``, a snooze):
    not backlog, and its message does not exist until the relay publishes it."""

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.DEAD, Status.CANCELLED})


def job_id_for_key(tenant: str, idempotency_key: str) -> str:
    """The job id an idempotency key stands for: the same key (per tenant) is the same job."""
    return str(uuid.uuid5(_ID_NAMESPACE, f"{tenant}\x00{idempotency_key}"))


def new_job_id() -> str:
    return str(uuid.uuid4())


def routing_key(queue: str, tenant: str) -> str:
    return f"{queue}.{tenant}"


@dataclass(slots=True)  # built per job: not frozen, a frozen __init__ costs ~2.5x
class JobFields:
    """A job's submission fields: the one value every form of a job is built from.

    The producer's message (``transport.job_message``), a parsed delivery
    (``Envelope``), the claim (``store.ClaimRequest``: these fields with the
    defaults chain applied, ``resolved``) and the relay's due publish
    (``store.DuePublish``) are this value or extend it, so a field is added
    once and never copied field by field. ``queue`` is the lane.
    """

    id: str
    type: str
    queue: str
    tenant: str
    args: dict[str, Any]
    priority: int
    max_attempts: int | None
    """None: not set by the producer (the defaults chain decides)."""
    timeout: float | None
    idempotency_key: str | None
    run_at: datetime | None = None
    """When the job is due (aware); None: now, or ``delay`` seconds from now."""
    delay: float | None = None
    """Seconds from the moment PostgreSQL records the job (its clock); None: no delay."""
    webhook_url: str | None = None
    """Where a signed webhook announces the job's terminal status (``urlguard`` checked it);
    None: the tenant's URL, if it has one (migration 0012's trigger decides)."""
    traceparent: str | None = None
    """The job's W3C trace context (checked: ``tracing.check_traceparent``), carried in its
    row and its messages; None: none (tracing off, or a producer that sent none)."""
    tracestate: str | None = None
    previous_span: str | None = None
    """A retry's previous attempt's run span, as a traceparent: its run span links to it."""

    def row_fields(
        self,
    ) -> tuple[str, str, str, str, dict[str, Any], int, int | None, float | None]:
        """The eight columns every job insert starts with, in this order: id, type, queue,
        tenant, args, priority, max_attempts, timeout (``$1``..``$8`` of ``insert_job``,
        ``insert_unique_job``, ``record_webhook_job``, ``insert_added_member``); one list,
        so a statement's call sites cannot drift apart (tests/unit/test_sql.py counts it
        as ``ROW_FIELDS``)."""
        return (
            self.id,
            self.type,
            self.queue,
            self.tenant,
            self.args,
            self.priority,
            self.max_attempts,
            self.timeout,
        )

    def resolved(self, registered: Registered | None, default_max_attempts: int) -> JobFields:
        """The defaults chain, written once: what the producer set (argument or header)
        wins, then the job's registration (``@app.job(max_attempts=, timeout=)``),
        then ``COLDBREW_MAX_ATTEMPTS``; a timeout has no setting (None: no timeout)."""
        max_attempts, timeout = self.max_attempts, self.timeout
        if registered is not None:
            max_attempts = registered.max_attempts if max_attempts is None else max_attempts
            timeout = registered.timeout if timeout is None else timeout
        return JobFields(
            self.id,
            self.type,
            self.queue,
            self.tenant,
            self.args,
            self.priority,
            default_max_attempts if max_attempts is None else max_attempts,
            timeout,
            self.idempotency_key,
            self.run_at,
            self.delay,
            self.webhook_url,
            self.traceparent,
            self.tracestate,
            self.previous_span,
        )

    @property
    def deferred(self) -> bool:
        """Whether the producer asked for a later start (it may already be due)."""
        return self.run_at is not None or self.delay is not None


class Registered(Protocol):
    """What a job's registration says about its defaults (``app.JobSpec`` is one)."""

    @property
    def max_attempts(self) -> int | None: ...

    @property
    def timeout(self) -> float | None: ...


@dataclass(slots=True)  # built per delivery: not frozen, a frozen __init__ costs ~2.5x
class Envelope(JobFields):
    """A delivery that satisfies the message contract (its type not yet looked up)."""

    priority_clamped: bool = False
    trace_ignored: str | None = None
    """Why a ``traceparent``/``tracestate`` header was ignored (malformed); the job runs
    as if it had none (the intake counts and logs this)."""


def parse_envelope(
    body: bytes,
    *,
    routing_key: str,
    message_id: str | None,
    headers: Mapping[str, Any] | None,
    priority: int | None,
    max_body_bytes: int,
    allow_private_webhooks: bool = False,
) -> Envelope:
    """Check one delivery against the contract; raise ``ContractViolation`` with a reason code.

    ``allow_private_webhooks`` (``COLDBREW_WEBHOOK_ALLOW_PRIVATE``): an ``x-webhook-url``
    whose host is a loopback, private, link-local, ... address is accepted, not rejected."""
    queue, tenant = split_routing_key(routing_key)
    if len(body) > max_body_bytes:
        raise ContractViolation(
            "too_large", f"body is {len(body)} bytes; the limit is {max_body_bytes}"
        )
    document = _decode_body(body)
    job_type = document.get("type")
    if not isinstance(job_type, str) or not job_type:
        raise ContractViolation("no_type", 'body has no "type" string')
    args = document.get("args", {})
    if not isinstance(args, dict):
        raise ContractViolation("invalid_args", f'"args" must be an object, not {_kind(args)}')
    check_args(args)
    headers = headers or {}
    key = _header_key(headers)
    job_id = _job_id(message_id, tenant, key)
    clamped = priority is not None and not 0 <= priority <= MAX_PRIORITY
    run_at, delay = _header_schedule(headers)
    webhook_url = _header_webhook(headers, allow_private_webhooks)
    envelope = Envelope(
        id=job_id,
        type=job_type,
        args=args,
        queue=queue,
        tenant=tenant,
        priority=min(max(priority or 0, 0), MAX_PRIORITY),
        idempotency_key=key,
        max_attempts=_header_int(headers, "x-max-attempts"),
        timeout=_header_float(headers, "x-timeout-seconds"),
        run_at=run_at,
        delay=delay,
        webhook_url=webhook_url,
        priority_clamped=clamped,
    )
    if "traceparent" in headers or tracing.PREVIOUS_SPAN_HEADER in headers:
        _header_trace(headers, envelope)
    return envelope


def _header_trace(headers: Mapping[str, Any], envelope: Envelope) -> None:
    """The W3C trace headers, checked; a malformed one is ignored (noted on the envelope),
    never a dead letter: tracing is the producer's business, the job is still runnable."""
    raw = headers.get("traceparent")
    if raw is not None:
        envelope.traceparent = tracing.check_traceparent(raw)
        if envelope.traceparent is None:
            envelope.trace_ignored = "invalid_traceparent"
        elif (state := headers.get("tracestate")) is not None:
            envelope.tracestate = tracing.check_tracestate(state)
            if envelope.tracestate is None:
                envelope.trace_ignored = "invalid_tracestate"
    previous = headers.get(tracing.PREVIOUS_SPAN_HEADER)
    if previous is not None:
        envelope.previous_span = tracing.check_traceparent(previous)


def check_args(args: dict[str, Any]) -> None:
    """Refuse args that PostgreSQL cannot store (``unstorable``: NUL, NaN, ... and where)."""
    try:
        storable.check_json(args, "args")
    except UnstorableValue as exc:
        raise ContractViolation("unstorable", str(exc)) from None


# --- the submitter's side ---------------------------------------------------------


def check_submission(
    *,
    job_id: str | None,
    type: str,
    args: dict[str, Any],
    queue: str,
    tenant: str,
    priority: int,
    idempotency_key: str | None,
    max_attempts: int | None,
    timeout: float | None,
    max_body_bytes: int,
    webhook_url: str | None = None,
    allow_private_webhooks: bool = False,
) -> None:
    """Raise ``InvalidRequest`` for a job a worker would dead-letter; say which field and why.

    The same checks as ``parse_envelope`` (they are shared below), a little
    stricter where a worker forgives: a priority outside 0..9 is refused, not
    clamped, and the type must be one an app could register.
    """
    try:
        _check_submission(
            job_id, type, args, queue, tenant, priority, idempotency_key, max_attempts, timeout
        )
        if webhook_url is not None:
            urlguard.check_webhook_url(webhook_url, allow_private=allow_private_webhooks)
        size = len(message_body(type, args))
    except ContractViolation as violation:
        raise InvalidRequest(violation.reason, violation.detail) from None
    except (TypeError, ValueError) as exc:  # json.dumps: a value JSON has no form for
        raise InvalidRequest("invalid_args", f"args are not JSON: {exc}") from None
    if size > max_body_bytes:
        raise InvalidRequest(
            "too_large",
            f"the message body would be {size} bytes; workers refuse more than {max_body_bytes}"
            " (COLDBREW_MAX_BODY_BYTES)",
        )


def _check_submission(
    job_id: object,
    job_type: object,
    args: object,
    queue: object,
    tenant: object,
    priority: object,
    idempotency_key: object,
    max_attempts: object,
    timeout: object,
) -> None:
    invalid = "invalid_request"
    if not isinstance(job_type, str) or not JOB_TYPE_RE.fullmatch(job_type):
        raise ContractViolation(invalid, f"job type {job_type!r} must match {JOB_TYPE_RE.pattern}")
    for what, name in (("tenant", tenant), ("queue", queue)):
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ContractViolation(invalid, f"{what} {name!r} must match {NAME_RE.pattern}")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ContractViolation(invalid, f"priority must be an integer, not {priority!r}")
    if not 0 <= priority <= MAX_PRIORITY:
        raise ContractViolation(invalid, f"priority must be 0..{MAX_PRIORITY}, not {priority}")
    if job_id is not None and (not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id)):
        raise ContractViolation(invalid, "job id must be 1-128 printable ASCII characters")
    if not isinstance(args, dict):
        raise ContractViolation("invalid_args", f"args must be an object, not {_kind(args)}")
    if not all(isinstance(key, str) for key in args):
        raise ContractViolation("invalid_args", "args' keys must be strings (they name parameters)")
    check_args(args)
    if idempotency_key is not None:
        _check_key(idempotency_key, "idempotency key", invalid)
    if max_attempts is not None:
        _check_attempts(max_attempts, "max_attempts", invalid)
    if timeout is not None:
        _check_timeout(timeout, "timeout", invalid)


def message_body(type: str, args: Mapping[str, Any]) -> bytes:
    """The body of a job message: compact JSON, ASCII, never NaN (``parse_envelope`` reads it)."""
    document = {"type": type, "args": args}
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


def message_headers(
    *,
    idempotency_key: str | None,
    max_attempts: int | None,
    timeout: float | None,
    webhook_url: str | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
    previous_span: str | None = None,
) -> dict[str, Any]:
    """The optional headers of a job message, as ``parse_envelope`` reads them back.

    The timeout goes as text (``repr`` of the float, which round-trips
    exactly): an AMQP table has no double of its own in pamqp, which sends a
    Python float as a 32-bit ``f``, so 1e-300 arrived as 0.0 and 0.1 as
    0.10000000149.
    """
    headers: dict[str, Any] = {}
    if idempotency_key is not None:
        headers["x-idempotency-key"] = idempotency_key
    if max_attempts is not None:
        headers["x-max-attempts"] = max_attempts
    if timeout is not None:
        headers["x-timeout-seconds"] = repr(float(timeout))
    if webhook_url is not None:
        headers["x-webhook-url"] = webhook_url
    if traceparent is not None:  # W3C Trace Context (tracing.py)
        headers["traceparent"] = traceparent
        if tracestate is not None:
            headers["tracestate"] = tracestate
    if previous_span is not None:
        headers[tracing.PREVIOUS_SPAN_HEADER] = previous_span
    return headers


def check_job_id(job_id: str) -> None:
    """Refuse, before any lookup, a job id no job can have (``invalid_job_id``)."""
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        raise InvalidRequest(
            "invalid_job_id", f"{job_id!r} is not a job id (1-128 printable ASCII characters)"
        )


def split_routing_key(key: str) -> tuple[str, str]:
    """``<queue>.<tenant>`` → (queue, tenant), both checked against ``[a-z0-9_-]{1,64}``.

    The banded form ``<queue>.<tenant>.<priority>`` (one digit; quorum mode's priority
    bands, topology.py) names the same pair: the digit only chose the queue it waited in."""
    queue, dot, tenant = key.partition(".")
    if len(tenant) > 2 and tenant[-2] == "." and tenant[-1] in "0123456789":
        tenant = tenant[:-2]
    if not dot:
        raise ContractViolation(
            "invalid_routing_key", f"routing key {key!r} is not <queue>.<tenant>"
        )
    if not NAME_RE.fullmatch(queue):
        raise ContractViolation(
            "invalid_queue", f"queue name {queue!r} must match {NAME_RE.pattern}"
        )
    if not NAME_RE.fullmatch(tenant):
        raise ContractViolation(
            "invalid_tenant", f"tenant name {tenant!r} must match {NAME_RE.pattern}"
        )
    return queue, tenant


def _decode_body(body: bytes) -> dict[str, Any]:
    try:
        # what json.loads(bytes) does (UTF-8/16/32, surrogates kept for check_args to
        # name), with one decoder made once: json.loads with a keyword builds one per call
        document = _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ContractViolation("not_json", f"body is not JSON: {exc}") from None
    except RecursionError:
        raise ContractViolation(
            "unstorable",
            f"body nests deeper than Python can parse; the limit is {storable.MAX_DEPTH} levels",
        ) from None
    if not isinstance(document, dict):
        raise ContractViolation("not_object", f"body must be a JSON object, not {_kind(document)}")
    return document


def _no_constant(name: str) -> Any:
    """``json.loads`` reads NaN and Infinity by default; JSON (and jsonb) has neither."""
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _job_id(message_id: str | None, tenant: str, key: str | None) -> str:
    if message_id:
        if not JOB_ID_RE.fullmatch(message_id):
            raise ContractViolation(
                "invalid_message_id", "message_id must be 1-128 printable ASCII characters"
            )
        return message_id
    if key is not None:
        return job_id_for_key(tenant, key)
    return new_job_id()


def _header_key(headers: Mapping[str, Any]) -> str | None:
    value = headers.get("x-idempotency-key")
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):  # pamqp: text that is not UTF-8, a byte array
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            # decoding with replacement would make different keys one job
            raise ContractViolation(
                "invalid_header", "x-idempotency-key is not UTF-8 text"
            ) from None
    return _check_key(value, "x-idempotency-key", "invalid_header")


def _check_key(value: object, name: str, reason: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_IDEMPOTENCY_KEY:
        raise ContractViolation(
            reason, f"{name} must be a string of 1-{MAX_IDEMPOTENCY_KEY} characters"
        )
    if (problem := storable.text_problem(value)) is not None:
        raise ContractViolation(reason, f"{name} {problem}")
    return value


def _header_int(headers: Mapping[str, Any], name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    if isinstance(value, bytes | str):
        try:
            value = int(value)
        except ValueError:
            raise ContractViolation("invalid_header", f"{name} must be an integer") from None
    return _check_attempts(value, name, "invalid_header")


def _header_webhook(headers: Mapping[str, Any], allow_private: bool) -> str | None:
    value = headers.get("x-webhook-url")
    if value is None:
        return None
    return urlguard.check_webhook_url(
        value, allow_private=allow_private, what="x-webhook-url", reason="invalid_webhook_url"
    ).url


def _check_attempts(value: object, name: str, reason: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
        raise ContractViolation(reason, f"{name} must be an integer in 1..{MAX_ATTEMPTS}")
    return value


def _header_float(headers: Mapping[str, Any], name: str) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        raise ContractViolation("invalid_header", f"{name} must be a number of seconds")
    try:
        number = float(value.decode() if isinstance(value, bytes) else value)
    except (TypeError, ValueError):
        raise ContractViolation("invalid_header", f"{name} must be a number of seconds") from None
    return _check_timeout(number, name, "invalid_header")


def _check_timeout(value: object, name: str, reason: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ContractViolation(reason, f"{name} must be a number of seconds")
    # also false for NaN
    if not MIN_TIMEOUT_SECONDS <= value < MAX_TIMEOUT_SECONDS:
        raise ContractViolation(
            reason,
            f"{name} must be at least {MIN_TIMEOUT_SECONDS:g} and below "
            f"{MAX_TIMEOUT_SECONDS:g} seconds, not {value!r}",
        )
    return float(value)


# --- scheduled jobs: run_at / delay -------------------------------------------------


def check_schedule(
    run_at: object, delay: object, *, now: datetime
) -> tuple[datetime | None, float | None]:
    """A submitter's ``run_at`` (aware datetime) or ``delay`` (seconds or timedelta), checked;
    ``InvalidRequest("bad_run_at" | "bad_delay")`` names what is wrong."""
    try:
        return _check_schedule(run_at, delay, now)
    except ContractViolation as violation:
        raise InvalidRequest(violation.reason, violation.detail) from None


def _check_schedule(
    run_at: object, delay: object, now: datetime
) -> tuple[datetime | None, float | None]:
    if run_at is not None and delay is not None:
        raise ContractViolation("bad_run_at", "give run_at or delay, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise ContractViolation("bad_run_at", f"run_at must be a datetime, not {run_at!r}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise ContractViolation(
                "bad_run_at",
                f"run_at {run_at.isoformat()} is naive: give a timezone-aware datetime "
                "(e.g. datetime.now(UTC) + timedelta(minutes=5))",
            )
        # no upper bound: an explicit instant is what the submitter means (a delay, where a
        # unit mistake is likely, is capped at MAX_SCHEDULE_SECONDS)
        return run_at, None
    if delay is not None:
        try:
            seconds = durations.seconds_of(delay, "delay")
        except durations.DurationError as exc:
            raise ContractViolation("bad_delay", str(exc)) from None
        if seconds > durations.MAX_SCHEDULE_SECONDS:
            raise ContractViolation(
                "bad_delay",
                f"delay {seconds:g} s is more than "
                f"{durations.MAX_SCHEDULE_SECONDS / 86400:.0f} days",
            )
        return None, seconds
    return None, None


def _header_schedule(headers: Mapping[str, Any]) -> tuple[datetime | None, float | None]:
    """``x-run-at`` (ISO 8601 text, or an AMQP timestamp) or ``x-delay-seconds`` (a number,
    or text like ``90`` or ``90s``); the clock is read only when one of them is there."""
    raw_at, raw_delay = headers.get("x-run-at"), headers.get("x-delay-seconds")
    if raw_at is None and raw_delay is None:
        return None, None
    run_at = delay = None
    if raw_at is not None:
        run_at = _header_instant(raw_at)
    if raw_delay is not None:
        delay = _header_delay(raw_delay)
    if run_at is not None and delay is not None:
        raise ContractViolation("bad_run_at", "give x-run-at or x-delay-seconds, not both")
    return _check_schedule(run_at, delay, datetime.now(UTC))


def _header_instant(value: object) -> datetime:
    if isinstance(value, datetime):  # an AMQP timestamp: POSIX seconds, so UTC
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    if not isinstance(value, str):
        raise ContractViolation("bad_run_at", f"x-run-at must be ISO 8601 text, not {value!r}")
    try:
        return durations.parse_instant(value)
    except durations.DurationError as exc:
        raise ContractViolation("bad_run_at", f"x-run-at: {exc}") from None


def _header_delay(value: object) -> float:
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    try:
        if isinstance(value, str):
            return durations.parse_duration(value)
        return durations.seconds_of(value, "x-delay-seconds")
    except durations.DurationError as exc:
        raise ContractViolation("bad_delay", f"x-delay-seconds: {exc}") from None


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "null" if value is None else "number"
    )


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One row of the job table, as users see it."""

    id: str
    type: str
    queue: str
    tenant: str
    status: Status
    priority: int
    attempt: int
    max_attempts: int
    progress: float | None
    progress_message: str | None
    result: Any
    error_kind: str | None
    error_message: str | None
    dead_reason: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    run_at: datetime
    cancel_requested: bool
    args: dict[str, Any]
    duplicate: bool = False
    """Set on what a submission returned when it was a unique duplicate: this is the
    existing job that holds its key (unique.py), not a new one. Never stored."""
    snoozes: int = 0
    """Times the job snoozed (``raise Snooze``); they do not spend attempts."""
    batch_id: str | None = None
    """The batch the job is a member of (``client.batch``), or None."""
    parent_id: str | None = None
    """The job that spawned this one with ``ctx.submit`` (flow), None for a submission."""
    chain_id: str | None = None
    """The chain this job is a step of (``coldbrew.flow.chain``), and which step."""
    chain_step: int | None = None
    children: Mapping[str, int] | None = None
    """This job's children counted by status; None when not read (or none exist)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> JobRecord:
        return cls(
            id=row["id"],
            type=row["type"],
            queue=row["queue"],
            tenant=row["tenant"],
            status=Status(row["status"]),
            priority=row["priority"],
            attempt=row["attempt"],
            max_attempts=row["max_attempts"],
            progress=row["progress"],
            progress_message=row["progress_message"],
            result=row["result"],
            error_kind=row["error_kind"],
            error_message=row["error_message"],
            dead_reason=row["dead_reason"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            run_at=row["run_at"],
            cancel_requested=row["cancel_requested"],
            args=row["args"],
            snoozes=row.get("snoozes", 0),
            batch_id=row.get("batch_id"),
            parent_id=row.get("parent_id"),
            chain_id=row.get("chain_id"),
            chain_step=row.get("chain_step"),
            children=row.get("children"),
        )

    def to_status_json(self) -> dict[str, Any]:
        """The status JSON of DESIGN §1 (CLI ``status``, HTTP ``GET /jobs/{id}``)."""
        error = None
        if self.error_kind is not None:
            error = {"kind": self.error_kind, "message": self.error_message or ""}
            if self.dead_reason:
                error["dead_reason"] = self.dead_reason
        return {
            "id": self.id,
            "type": self.type,
            "queue": self.queue,
            "tenant": self.tenant,
            "status": self.status.value,
            "priority": self.priority,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "progress": None if self.progress is None else round(self.progress, 4),
            "progress_message": self.progress_message,
            "result": self.result,
            "error": error,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "run_at": _iso(self.run_at),
            "cancel_requested": self.cancel_requested,
            "snoozes": self.snoozes,
            "batch_id": self.batch_id,
            "parent_id": self.parent_id,
            "chain_id": self.chain_id,
            "chain_step": self.chain_step,
            "children": children_summary(self.children),
        }


def children_summary(counts: Mapping[str, int] | None) -> dict[str, Any]:
    """The status JSON's ``children``: how many a job spawned, and how many are in each
    status (``{"total": 0, "by_status": {}}`` for a job without children)."""
    by_status = {status: int(n) for status, n in sorted((counts or {}).items())}
    return {"total": sum(by_status.values()), "by_status": by_status}


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
