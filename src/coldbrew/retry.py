"""Retry policy: what a failed attempt becomes, and how long it waits.

Pure policy (STYLE practice 10): no I/O, no clock, no global ``random``. The
caller passes the attempt number, the exception, ``now`` and a random source,
so every rule is a fast, exact unit test.

Rules, first match wins (DESIGN guarantee 4, "bounded poison"):

1. ``JobCancelled`` is not a failure; the caller handles it (``ValueError``).
2. ``Permanent``, or an instance of ``dont_retry_on`` -> ``failed`` at once.
3. coldbrew's own retry signals -- ``Retry``, ``JobTimeout``,
   ``WorkerCrashed`` (and its ``MemoryLimitExceeded``: a pool child killed
   for going over ``COLDBREW_PROCESS_MAX_MEMORY_MB``, kind ``memory``) --
   are retryable whatever ``retry_on`` says:
   ``retry_on`` describes the job's own exceptions, and a user who lists
   ``(httpx.HTTPError,)`` does not mean "never retry a crashed process".
4. any other exception not an instance of ``retry_on`` -> ``failed``.
5. otherwise retry: ``Retry(delay=d)`` waits ``d``; the rest wait
   ``backoff_delay``. The retry is turned into ``dead`` when the attempt
   budget is spent (``attempt >= max_attempts``; attempts are counted at
   claim) or when waiting would pass ``max_wall_seconds`` since the first
   start.

Backoff is exponential with *full* jitter (AWS architecture blog,
"Exponential Backoff And Jitter"): ``rand() * min(cap, base * 2**(n-1))``.
Full jitter spreads a thundering herd of failures (a dependency that was down
for everyone) over the whole window instead of re-synchronising them.

Errors from the process pool arrive as a ``RemoteJobError`` whose ``kind`` is
the original class's ``module.QualName`` (or one of the stable kinds below)
and whose ``message`` is the original text. It is recognised by those two
attributes, not imported, so this module stays a leaf. If it also carries
``kinds`` (the qualified names of the original class's MRO), ``retry_on`` and
``dont_retry_on`` match subclasses across the process boundary too;
otherwise they match the exact class name only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from coldbrew.errors import (
    JobCancelled,
    JobTimeout,
    MemoryLimitExceeded,
    Permanent,
    Retry,
    WorkerCrashed,
)

__all__ = [
    "MAX_ERROR_MESSAGE",
    "Outcome",
    "RetryPolicy",
    "backoff_delay",
    "decide",
    "error_kind",
    "error_message",
]

MAX_ERROR_MESSAGE = 2000
"""Longest ``error_message`` stored on a job row, in characters."""

# 2.0 ** 1024 overflows a float; past this exponent the cap applies anyway.
_MAX_EXPONENT = 1023

# Stable error kinds for coldbrew's own exceptions (part of the status JSON).
# First match wins: a subclass comes before its base.
_OWN_KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (Permanent, "permanent"),
    (Retry, "retry_requested"),
    (JobTimeout, "timeout"),
    (MemoryLimitExceeded, "memory"),
    (WorkerCrashed, "crashed"),
    (JobCancelled, "cancelled"),
)

Status = Literal["retrying", "failed", "dead"]


def backoff_delay(attempt: int, *, base: float, cap: float, rand: Callable[[], float]) -> float:
    """Seconds to wait after failed attempt ``attempt`` (from 1), with full jitter.

    Safe for any attempt number: the exponent stops growing once the cap
    binds. ``rand`` should return a value in [0, 1]; anything else is
    clamped so the result always lies in [0, cap].
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    _check_non_negative("base", base)
    _check_non_negative("cap", cap)
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, _MAX_EXPONENT))
    return _unit(rand()) * ceiling


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A job type's retry budget and which exceptions are worth retrying."""

    max_attempts: int
    base: float
    cap: float
    max_wall_seconds: float | None
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    dont_retry_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        _check_non_negative("base", self.base)
        _check_non_negative("cap", self.cap)
        wall = self.max_wall_seconds
        if wall is not None and not (math.isfinite(wall) and wall > 0):
            raise ValueError(f"max_wall_seconds must be > 0 or None, got {wall}")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a failed attempt becomes; the runner writes it with one fenced UPDATE."""

    status: Status
    delay: float
    """Seconds from ``now`` to ``run_at``; 0 unless ``status == "retrying"``."""
    error_kind: str
    error_message: str
    reason: str | None = None
    """Why the job is dead (``max_attempts`` or ``max_wall_seconds``), else None."""


def decide(
    policy: RetryPolicy,
    exc: BaseException,
    *,
    attempt: int,
    first_started_at: datetime | None,
    now: datetime,
    rand: Callable[[], float],
) -> Outcome:
    """Turn the exception of attempt ``attempt`` into ``retrying``, ``failed`` or ``dead``.

    ``first_started_at`` is when attempt 1 started; None counts as ``now``.
    ``now`` and ``first_started_at`` must both be aware (or both naive).
    """
    names = _remote_names(exc)
    if _is(exc, names, JobCancelled):
        raise ValueError("JobCancelled is not a failure; the caller records the cancellation")
    kind, message = error_kind(exc), error_message(exc)
    if not _retryable(policy, exc, names):
        return Outcome("failed", 0.0, kind, message)
    if attempt >= policy.max_attempts:
        return Outcome("dead", 0.0, kind, message, "max_attempts")
    delay = _requested_delay(exc, names)
    if delay is None:
        delay = backoff_delay(attempt, base=policy.base, cap=policy.cap, rand=rand)
    if policy.max_wall_seconds is not None:
        started = now if first_started_at is None else first_started_at
        if (now - started).total_seconds() + delay > policy.max_wall_seconds:
            return Outcome("dead", 0.0, kind, message, "max_wall_seconds")
    return Outcome("retrying", delay, kind, message)


def error_kind(exc: BaseException) -> str:
    """The stable kind stored in ``error.kind`` of the status JSON."""
    remote = getattr(exc, "kind", None)
    if _remote_names(exc) is not None and isinstance(remote, str):
        return remote
    for cls, kind in _OWN_KINDS:
        if isinstance(exc, cls):
            return kind
    return _qualname(type(exc))


def error_message(exc: BaseException) -> str:
    """``str(exc)`` (or a remote error's original message), at most 2,000 characters."""
    remote = getattr(exc, "message", None)
    if _remote_names(exc) is not None and isinstance(remote, str):
        text = remote
    else:
        try:
            text = str(exc)
        except Exception:  # noqa: BLE001 - a broken __str__ must not break the error path
            text = f"<unprintable {_qualname(type(exc))}>"
    if len(text) > MAX_ERROR_MESSAGE:
        text = text[: MAX_ERROR_MESSAGE - 1] + "\u2026"
    return text


# --- helpers ----------------------------------------------------------------


def _retryable(policy: RetryPolicy, exc: BaseException, names: frozenset[str] | None) -> bool:
    if _is(exc, names, Permanent) or _matches(exc, names, policy.dont_retry_on):
        return False
    if any(_is(exc, names, cls) for cls in (Retry, JobTimeout, WorkerCrashed)):
        return True
    return _matches(exc, names, policy.retry_on)


def _requested_delay(exc: BaseException, names: frozenset[str] | None) -> float | None:
    """The delay a ``Retry(delay=...)`` asked for, if it is a usable number."""
    if not _is(exc, names, Retry):
        return None
    delay = getattr(exc, "delay", None)
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not math.isfinite(delay):
        return None
    return max(0.0, float(delay))


def _remote_names(exc: BaseException) -> frozenset[str] | None:
    """Class names a process-pool ``RemoteJobError`` stands for, or None if it is not one."""
    kind = getattr(exc, "kind", None)
    if not (isinstance(kind, str) and isinstance(getattr(exc, "message", None), str)):
        return None
    kinds = getattr(exc, "kinds", ())
    extra = (k for k in kinds if isinstance(k, str)) if isinstance(kinds, tuple | list) else ()
    return frozenset((kind, *extra))


def _is(exc: BaseException, names: frozenset[str] | None, cls: type[BaseException]) -> bool:
    """``isinstance``, extended to a remote error by qualified name or stable kind."""
    if isinstance(exc, cls):
        return True
    if names is None:
        return False
    own = dict(_OWN_KINDS).get(cls)
    return _qualname(cls) in names or (own is not None and own in names)


def _matches(
    exc: BaseException, names: frozenset[str] | None, classes: tuple[type[BaseException], ...]
) -> bool:
    return isinstance(exc, classes) or (
        names is not None and any(_qualname(cls) in names for cls in classes)
    )


def _qualname(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _unit(value: float) -> float:
    """Clamp a random draw into [0, 1] (NaN counts as 1, the conservative end)."""
    if 0.0 <= value <= 1.0:
        return value
    return 0.0 if value < 0.0 else 1.0


def _check_non_negative(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
