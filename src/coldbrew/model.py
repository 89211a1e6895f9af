"""Job records, statuses and the producer message contract, with no I/O.

``parse_envelope`` is the one place a delivery is checked against the message
contract of DESIGN §1: everything it rejects becomes a dead letter with a
stable reason code, so a producer in any language learns exactly what it did
wrong.
"""

from __future__ import annotations

import enum
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from coldbrew.errors import ContractViolation

NAME_RE = re.compile(r"^[a-z0-9_-]{1,64}$")
JOB_ID_RE = re.compile(r"^[\x21-\x7e]{1,128}$")
MAX_PRIORITY = 9
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
class Envelope:
    """A delivery that satisfies the message contract (its type not yet looked up)."""

    job_id: str
    type: str
    args: dict[str, Any]
    queue: str
    tenant: str
    priority: int
    idempotency_key: str | None
    max_attempts: int | None
    timeout: float | None
    priority_clamped: bool = False


def parse_envelope(
    body: bytes,
    *,
    routing_key: str,
    message_id: str | None,
    headers: Mapping[str, Any] | None,
    priority: int | None,
    max_body_bytes: int,
) -> Envelope:
    """Check one delivery against the contract; raise ``ContractViolation`` with a reason code."""
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
    headers = headers or {}
    key = _header_str(headers, "x-idempotency-key", 256)
    job_id = _job_id(message_id, tenant, key)
    clamped = priority is not None and not 0 <= priority <= MAX_PRIORITY
    return Envelope(
        job_id=job_id,
        type=job_type,
        args=args,
        queue=queue,
        tenant=tenant,
        priority=min(max(priority or 0, 0), MAX_PRIORITY),
        idempotency_key=key,
        max_attempts=_header_int(headers, "x-max-attempts", 1, 1000),
        timeout=_header_float(headers, "x-timeout-seconds"),
        priority_clamped=clamped,
    )


def split_routing_key(key: str) -> tuple[str, str]:
    """``<queue>.<tenant>`` → (queue, tenant), both checked against ``[a-z0-9_-]{1,64}``."""
    queue, dot, tenant = key.partition(".")
    if not dot:
        raise ContractViolation(
            "invalid_routing_key", f"routing key {key!r} is not <queue>.<tenant>"
        )
    if not NAME_RE.match(queue):
        raise ContractViolation(
            "invalid_queue", f"queue name {queue!r} must match {NAME_RE.pattern}"
        )
    if not NAME_RE.match(tenant):
        raise ContractViolation(
            "invalid_tenant", f"tenant name {tenant!r} must match {NAME_RE.pattern}"
        )
    return queue, tenant


def _decode_body(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ContractViolation("not_json", f"body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ContractViolation("not_object", f"body must be a JSON object, not {_kind(document)}")
    return document


def _job_id(message_id: str | None, tenant: str, key: str | None) -> str:
    if message_id:
        if not JOB_ID_RE.match(message_id):
            raise ContractViolation(
                "invalid_message_id", "message_id must be 1-128 printable ASCII characters"
            )
        return message_id
    if key is not None:
        return job_id_for_key(tenant, key)
    return new_job_id()


def _header_str(headers: Mapping[str, Any], name: str, limit: int) -> str | None:
    value = headers.get(name)
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        raise ContractViolation(
            "invalid_header", f"{name} must be a string of 1-{limit} characters"
        )
    return value


def _header_int(headers: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    if isinstance(value, bytes | str):
        try:
            value = int(value)
        except ValueError:
            raise ContractViolation("invalid_header", f"{name} must be an integer") from None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ContractViolation("invalid_header", f"{name} must be an integer in {low}..{high}")
    return value


def _header_float(headers: Mapping[str, Any], name: str) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = float(value.decode() if isinstance(value, bytes) else value)
    except (TypeError, ValueError):
        raise ContractViolation("invalid_header", f"{name} must be a number of seconds") from None
    if not 0 < number < 10**7:
        raise ContractViolation("invalid_header", f"{name} must be positive seconds")
    return number


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
        }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
