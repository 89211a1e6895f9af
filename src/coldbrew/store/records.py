"""The values the stores take and hand back: requests, results and rows as dataclasses.

Nothing here talks to PostgreSQL; these are what the rest of coldbrew sees of
its rows. The per-job ones (``ClaimRequest``, ``ClaimResult``, ``Outcome``)
are not frozen: a frozen ``__init__`` costs ~2.5x, and one is built per job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from coldbrew.model import JobFields, Status

__all__ = [
    "CapLocks",
    "CapRoom",
    "ClaimRequest",
    "ClaimResult",
    "CommitMark",
    "DuePublish",
    "JobTypeSettings",
    "Outcome",
    "QueueStats",
    "RawJSON",
    "TenantSettings",
]


ClaimRequest = JobFields
"""A job to upsert and claim: its fields with the defaults chain applied
(``JobFields.resolved``), so ``max_attempts`` is set."""


@dataclass(frozen=True, slots=True)
class CommitMark:
    """Where an asynchronously committed claim stands in this store's commit order.

    ``server`` is the start time of the PostgreSQL server it committed on (a
    restart changes it); ``seq`` counts this store's claim batches. A
    synchronous commit that wrote WAL on the same server and was sent after
    claim batch ``seq`` returned flushed that claim to disk. A completion
    returns such a mark too: the claims it made durable.
    """

    server: datetime
    seq: int


@dataclass(slots=True)  # built per job: not frozen, a frozen __init__ costs ~2.5x
class ClaimResult:
    """What a claim found: ``claimed`` with our attempt number, or the row's status.

    (A capped claim that found no room answers ``caps.Capped`` instead.)
    """

    id: str
    claimed: bool
    status: str
    attempt: int
    max_attempts: int
    timeout: float | None
    checkpoint: Any
    started_at: datetime | None
    mark: CommitMark | None = None
    snoozes: int = 0
    """Times the job snoozed: its attempts spent are ``attempt - snoozes``."""
    """Set when the claim committed asynchronously: it is not durable until a later
    synchronous commit covers it (a completion's mark, or ``durability_barrier``).
    None: durable already."""
    places_left: Mapping[str, int] | None = None
    """A capped claim that took a place: the places each capped scope (``tenant``,
    ``type``) has left once it did (0: full now). None for any other claim."""
    rate_waits: Mapping[str, float] | None = None
    """A rate-limited claim that took its tokens: per bucket key, the seconds until that
    bucket's next token is due (0: one is there now). None for any other claim."""
    rate_spare: Mapping[str, int] | None = None
    """A rate-limited claim that took its tokens: per bucket key, the tokens the bucket
    still had right after (0: the next is due in ``rate_waits``). None otherwise."""
    rate_measured_at: float | None = None
    """``time.monotonic()`` just before the transaction whose clock ``rate_waits`` count
    from (None: the caller counts from the claim's start)."""
    waited: float | None = None
    """A claimed job's seconds from when it became due (its ``run_at``) to this claim;
    None when not claimed."""


@dataclass(slots=True)  # built per job: not frozen, a frozen __init__ costs ~2.5x
class Outcome:
    """A fenced final (or retrying) write for one attempt."""

    id: str
    attempt: int
    status: Status
    result: Any = None
    error_kind: str | None = None
    error_message: str | None = None
    delay: float = 0.0
    dead_reason: str | None = None
    progress: float | None = None
    progress_message: str | None = None
    children: list[JobFields] | None = None
    """Jobs a succeeded attempt spawned (``ctx.submit``): inserted in the transaction
    that writes this outcome, and only if it is written and ``succeeded``."""


@dataclass(slots=True, kw_only=True)  # kw_only: JobFields ends with fields that have defaults
class DuePublish(JobFields):
    """A row the relay must (re)publish: the job's fields, and where its row stands."""

    attempt: int
    publish_after: datetime
    was: str = "queued"
    """The row's status before the relay took it (``scheduled``: it was waiting for run_at)."""

    @classmethod
    def from_row(cls, row: Any) -> DuePublish:
        return cls(
            id=row["id"],
            type=row["type"],
            queue=row["queue"],
            tenant=row["tenant"],
            args=row["args"],
            priority=row["priority"],
            max_attempts=row["max_attempts"],
            timeout=row["timeout_seconds"],
            idempotency_key=row["idempotency_key"],
            attempt=row["attempt"],
            publish_after=row["publish_after"],
            was=row["was"],
            traceparent=row["traceparent"],
            tracestate=row["tracestate"],
            previous_span=row["trace_previous_span"],
        )


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    tenant: str
    queued: int
    running: int
    retrying: int
    dead: int
    failed: int
    oldest_waiting_seconds: float
    finished: int = 0
    scheduled: int = 0
    """Jobs waiting for their ``run_at`` (status ``scheduled``): not backlog."""


class RawJSON(str):
    """Text that is already JSON: written to a jsonb column as is, not encoded again."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class TenantSettings:
    name: str
    weight: float
    max_running: int | None
    paused: bool
    created_at: datetime
    rate_per_second: float | None = None
    """Fleet-wide rate limit (starts per second), None: not limited."""
    rate_burst: int | None = None
    """Starts allowed at once beyond the steady rate; None: ``ratelimit.default_burst``."""
    webhook_url: str | None = None
    """Where the webhooks of the tenant's jobs that name no URL go; None: nowhere."""

    @classmethod
    def from_row(cls, row: Any) -> TenantSettings:
        return cls(
            row["name"],
            row["weight"],
            row["max_running"],
            row["paused"],
            row["created_at"],
            row.get("rate_per_second"),
            row.get("rate_burst"),
            row.get("webhook_url"),
        )


@dataclass(frozen=True, slots=True)
class LaneSettings:
    """A lane's fleet-wide state: paused lanes' deliveries are held unclaimed."""

    name: str
    paused: bool
    changed_at: datetime | None
    """When it was last paused or resumed; None: never (a lane known from its types or queues)."""

    @classmethod
    def from_row(cls, row: Any) -> LaneSettings:
        return cls(row["name"], row["paused"], row["changed_at"])


@dataclass(frozen=True, slots=True)
class JobTypeSettings:
    name: str
    max_running: int | None
    created_at: datetime
    rate_per_second: float | None = None
    """Fleet-wide rate limit (starts per second), None: not limited."""
    rate_burst: int | None = None
    """Starts allowed at once beyond the steady rate; None: ``ratelimit.default_burst``."""

    @classmethod
    def from_row(cls, row: Any) -> JobTypeSettings:
        return cls(
            row["name"],
            row["max_running"],
            row["created_at"],
            row.get("rate_per_second"),
            row.get("rate_burst"),
        )


@dataclass(frozen=True, slots=True)
class CapLocks:
    """What ``try_lock_cap_scopes`` found: each scope's cap (None: uncapped) and whether
    its advisory lock was taken (False: another transaction holds it; None: not tried,
    because the tenant's was not taken)."""

    tenant_cap: int | None
    type_cap: int | None
    tenant_locked: bool | None
    type_locked: bool | None

    @classmethod
    def from_row(cls, row: Any) -> CapLocks:
        return cls(row["tenant_cap"], row["type_cap"], row["tenant_locked"], row["type_locked"])


@dataclass(frozen=True, slots=True)
class CapRoom:
    """What ``cap_room`` counted under the locks: the running jobs of the tenant and of the
    type, fleet-wide (0 for a scope that was not counted)."""

    tenant_running: int
    type_running: int
