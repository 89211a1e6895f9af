"""The one exception tree of coldbrew.

A leaf module: it imports nothing else from the package, so every module can
use it without an import cycle. Only the CLI maps these to exit codes.
"""

from __future__ import annotations


class ColdbrewError(Exception):
    """Base of every error coldbrew raises on purpose."""


# --- configuration (exit 2) -------------------------------------------------


class ConfigurationError(ColdbrewError):
    """A setting, flag or argument is invalid; the message names it."""


class SchemaOutOfDate(ConfigurationError):
    """The database schema is older (or newer) than this coldbrew expects."""


class UnknownJobType(ConfigurationError):
    """A job type that the app does not register was asked for."""


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


class StaleWrite(ColdbrewError):
    """A write was fenced: the row moved on (another attempt, or another status)."""


# --- job control flow (raised by job code) ----------------------------------


class JobError(ColdbrewError):
    """Base of the exceptions a job raises to steer its own outcome."""


class Permanent(JobError):
    """Fail the job now, without retrying: the input or the request is wrong."""


class Retry(JobError):
    """Ask for another attempt, after ``delay`` seconds if given."""

    def __init__(self, message: str = "retry requested", *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


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
