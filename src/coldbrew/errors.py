"""The one exception tree of coldbrew.

A leaf module: it imports nothing else from the package, so every module can
use it without an import cycle. Only the CLI maps these to exit codes.
"""

from __future__ import annotations

import math
from datetime import timedelta


class ColdbrewError(Exception):
    """Base of every error coldbrew raises on purpose."""


# --- configuration (exit 2) -------------------------------------------------


class ConfigurationError(ColdbrewError):
    """A setting, flag or argument is invalid; the message names it."""


class SchemaOutOfDate(ConfigurationError):
    """The database schema is older (or newer) than this coldbrew expects."""


class UnknownJobType(ConfigurationError):
    """A job type that the app does not register was asked for."""


class InvalidRequest(ConfigurationError):
    """A client refused a request before any I/O: a job a worker would reject
    (``model.check_submission``), a job id no job can have, unstorable text.

    ``reason`` is a stable code: the one a worker would dead-letter the
    message with (``unstorable``, ``too_large``, ``invalid_args``),
    ``invalid_job_id``, or ``invalid_request``. Refusing up front is what
    keeps an accepted job from never running.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type[InvalidRequest], tuple[str, str]]:
        return type(self), (self.reason, self.detail)


# --- services unavailable (exit 3) ------------------------------------------


class ServiceUnavailable(ColdbrewError):
    """RabbitMQ or PostgreSQL cannot be reached."""


class BrokerUnavailable(ServiceUnavailable):
    """RabbitMQ cannot be reached, or the connection broke mid-operation."""


class DatabaseUnavailable(ServiceUnavailable):
    """PostgreSQL cannot be reached, or the connection broke mid-operation."""


class TransientDatabaseError(DatabaseUnavailable):
    """PostgreSQL rolled a statement back on a conflict (deadlock, serialization failure).

    Nothing of it was written and the connection is fine: the caller retries,
    as after an outage. A subclass so that every loop that rides out an
    outage rides this out too instead of crashing the worker.
    """


class StatementFailed(ColdbrewError):
    """PostgreSQL refused a background statement for a reason that is neither an outage,
    a conflict nor its data (a statement or lock timeout, a permission, a broken schema).

    Raised where a loop must log it and try again later rather than die of it (the
    prune service); the message carries the SQLSTATE and PostgreSQL's text.
    """


# --- the message contract ---------------------------------------------------


class ContractViolation(ColdbrewError):
    """A message breaks the producer contract; it goes to the dead letters.

    ``reason`` is a short stable code (``not_json``, ``no_type``, ...) and the
    message is the human-readable detail.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class InvalidArguments(ContractViolation):
    """A job's arguments do not fit its signature."""

    def __init__(self, detail: str) -> None:
        super().__init__("invalid_args", detail)


# --- job store --------------------------------------------------------------


class JobNotFound(ColdbrewError):
    """No job has this id (in this namespace)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id {job_id!r}")
        self.job_id = job_id


class BatchNotFound(ColdbrewError):
    """No batch has this id (in this namespace), or the caller's tenant may not see it."""

    def __init__(self, batch_id: str) -> None:
        super().__init__(f"no batch with id {batch_id!r}")
        self.batch_id = batch_id


class ChainNotFound(ColdbrewError):
    """No chain has this id (in this namespace)."""

    def __init__(self, chain_id: str) -> None:
        super().__init__(f"no chain with id {chain_id!r}")
        self.chain_id = chain_id


class StaleWrite(ColdbrewError):
    """A write was fenced: the row moved on (another attempt, or another status)."""


class UnstorableData(ColdbrewError, ValueError):
    """Data bound for PostgreSQL that it cannot store; nothing of it was written.

    Unlike an outage, trying the same data again fails again: the caller
    records the failure against the job (or message) that carried it.
    """


class UnstorableValue(UnstorableData):
    """A value failed ``storable``'s checks before any statement was sent.

    ``field`` names where it sits (``args.items[3].name``), ``problem`` what
    is wrong with it (``contains NUL (U+0000), which ...``).
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field = field
        self.problem = problem

    def __reduce__(self) -> tuple[type[UnstorableValue], tuple[str, str]]:
        # pickled whole (a process-pool job's ctx.checkpoint raises it in the child)
        return type(self), (self.field, self.problem)


class DataRefused(UnstorableData):
    """PostgreSQL (or asyncpg, encoding a parameter) refused a statement's data.

    SQLSTATE class 22 (data exception: NUL, bad UTF-8, numbers or intervals
    out of range), a CHECK or NOT NULL violation, or class 54 (a program
    limit such as jsonb's size). The statement rolled back and the
    connection is fine. In group commit one item's data fails the whole
    statement, so ``GroupCommit`` retries the items apart and only the bad
    one gets this error (batching.py).
    """

    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate

    def __reduce__(self) -> tuple[type[DataRefused], tuple[str, str | None]]:
        return type(self), (str(self), self.sqlstate)


# --- job control flow (raised by job code) ----------------------------------


class JobError(ColdbrewError):
    """Base of the exceptions a job raises to steer its own outcome."""


class Permanent(JobError):
    """Fail the job now, without retrying: the input or the request is wrong."""


class UnstorableCheckpoint(Permanent, UnstorableValue):
    """``ctx.checkpoint(state)`` got state that PostgreSQL cannot store.

    Permanent: the same state fails the same way on every attempt, so the
    job fails at once (kind ``permanent``) unless it catches this and
    checkpoints something else.
    """


class Retry(JobError):
    """Ask for another attempt, after ``delay`` seconds if given."""

    def __init__(self, message: str = "retry requested", *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class Snooze(JobError):
    """Run this job again after ``seconds`` without spending an attempt (raise or return it).

    Not a failure: the attempt's claim is given back (the row counts a snooze, and
    its budget is ``attempt - snoozes``), the job waits as ``scheduled`` and the
    relay publishes it when due. ``max_wall_seconds`` still bounds a job that keeps
    snoozing. ``seconds`` is a finite number >= 0 or a ``timedelta``.
    """

    def __init__(self, seconds: float | timedelta = 0.0) -> None:
        value = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise ValueError(f"Snooze needs a finite number of seconds >= 0, not {seconds!r}")
        super().__init__(f"snoozed for {value:g} s")
        self.seconds = float(value)

    def __reduce__(self) -> tuple[object, ...]:
        # rebuilt from its seconds across the process pool's pipe (args holds the message)
        return (Snooze, (self.seconds,))


class JobTimeout(ColdbrewError):
    """A job ran past its timeout and was stopped; retryable."""


class WorkerCrashed(ColdbrewError):
    """The process running a job died; retryable."""


class MemoryLimitExceeded(WorkerCrashed):
    """A process-pool child went over ``COLDBREW_PROCESS_MAX_MEMORY_MB`` and was killed; retryable.

    A ``WorkerCrashed``: the attempt's process died (the pool killed it), so
    every rule about crashed attempts applies. Its own error kind,
    ``memory``, tells an operator which limit to look at; ``limit_bytes``
    and ``rss_bytes`` are the limit and the resident size measured.
    """

    def __init__(self, message: str, *, limit_bytes: int = 0, rss_bytes: int = 0) -> None:
        super().__init__(message)
        self.limit_bytes = limit_bytes
        self.rss_bytes = rss_bytes

    def __reduce__(self) -> tuple[object, ...]:
        """Pickle with the keyword fields (``Exception`` pickles ``args`` only)."""
        return (_memory_limit_exceeded, (str(self), self.limit_bytes, self.rss_bytes))


def _memory_limit_exceeded(message: str, limit_bytes: int, rss_bytes: int) -> MemoryLimitExceeded:
    return MemoryLimitExceeded(message, limit_bytes=limit_bytes, rss_bytes=rss_bytes)


class JobCancelled(ColdbrewError):
    """The job was cancelled on request."""
