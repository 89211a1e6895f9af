"""Unit tests for the pure retry policy (coldbrew.retry)."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from coldbrew.errors import (
    JobCancelled,
    JobTimeout,
    MemoryLimitExceeded,
    Permanent,
    Retry,
    WorkerCrashed,
)
from coldbrew.retry import (
    MAX_ERROR_MESSAGE,
    Outcome,
    RetryPolicy,
    backoff_delay,
    decide,
    error_kind,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ONE: Callable[[], float] = lambda: 1.0  # noqa: E731 - a named fixed random source
HALF: Callable[[], float] = lambda: 0.5  # noqa: E731


def policy(**overrides: object) -> RetryPolicy:
    """Build a policy with small, readable defaults."""
    fields: dict[str, object] = {
        "max_attempts": 5,
        "base": 1.0,
        "cap": 60.0,
        "max_wall_seconds": None,
    }
    fields.update(overrides)
    return RetryPolicy(**fields)  # type: ignore[arg-type]


class RemoteJobError(Exception):
    """Stand-in for the process pool's error: duck-typed by ``kind`` and ``message``."""

    def __init__(self, kind: str, message: str, kinds: tuple[str, ...] = ()) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        if kinds:
            self.kinds = kinds


class Flaky(Exception):
    """An ordinary job exception."""


class FlakySub(Flaky):
    """A subclass, to check that retry_on matches subclasses."""


def run(
    exc: BaseException,
    *,
    attempt: int = 1,
    pol: RetryPolicy | None = None,
    started: datetime | None = T0,
    now: datetime = T0,
    rand: Callable[[], float] = ONE,
) -> Outcome:
    """Call ``decide`` with test defaults."""
    return decide(
        pol or policy(), exc, attempt=attempt, first_started_at=started, now=now, rand=rand
    )


# --- backoff_delay ------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (1, 1.0, 1.0),
        (2, 1.0, 2.0),
        (3, 1.0, 4.0),
        (6, 1.0, 32.0),
        (7, 1.0, 60.0),  # 64 capped at 60
        (3, 0.5, 2.0),
        (7, 0.5, 30.0),
        (5, 0.0, 0.0),
        (10**9, 1.0, 60.0),  # huge attempt numbers do not overflow
    ],
)
def test_backoff_delay_is_full_jitter_of_capped_exponential(
    attempt: int, rand: float, expected: float
) -> None:
    """The delay is rand() times min(cap, base * 2**(attempt - 1))."""
    assert backoff_delay(attempt, base=1.0, cap=60.0, rand=lambda: rand) == expected


def test_backoff_delay_stays_within_zero_and_cap() -> None:
    """Over many attempts and random draws the delay never leaves [0, cap]."""
    rng = random.Random(42)
    for attempt in range(1, 3000):
        delay = backoff_delay(attempt, base=0.25, cap=30.0, rand=rng.random)
        assert 0.0 <= delay <= 30.0


@pytest.mark.parametrize("bad", [-0.5, 1.5, float("nan")])
def test_backoff_delay_clamps_a_misbehaving_random_source(bad: float) -> None:
    """A random source outside [0, 1] cannot push the delay outside [0, cap]."""
    assert 0.0 <= backoff_delay(3, base=1.0, cap=3.0, rand=lambda: bad) <= 3.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempt": 0, "base": 1.0, "cap": 1.0},
        {"attempt": 1, "base": -1.0, "cap": 1.0},
        {"attempt": 1, "base": 1.0, "cap": float("inf")},
    ],
)
def test_backoff_delay_rejects_nonsense(kwargs: dict[str, float]) -> None:
    """Attempt below 1, negative base or infinite cap is a programming error."""
    with pytest.raises(ValueError):
        backoff_delay(int(kwargs["attempt"]), base=kwargs["base"], cap=kwargs["cap"], rand=ONE)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base": -1.0},
        {"cap": float("nan")},
        {"max_wall_seconds": 0.0},
    ],
)
def test_policy_validates_its_fields(kwargs: dict[str, object]) -> None:
    """An impossible policy fails when it is built, not when a job fails."""
    with pytest.raises(ValueError):
        policy(**kwargs)


# --- decide: the rules, table-driven ----------------------------------------------


@pytest.mark.parametrize(
    ("exc", "pol", "status", "kind", "delay"),
    [
        (Permanent("bad input"), policy(), "failed", "permanent", 0.0),
        (Flaky("x"), policy(dont_retry_on=(Flaky,)), "failed", f"{__name__}.Flaky", 0.0),
        (FlakySub("x"), policy(dont_retry_on=(Flaky,)), "failed", f"{__name__}.FlakySub", 0.0),
        (ValueError("x"), policy(retry_on=(Flaky,)), "failed", "builtins.ValueError", 0.0),
        (FlakySub("x"), policy(retry_on=(Flaky,)), "retrying", f"{__name__}.FlakySub", 4.0),
        (ValueError("x"), policy(), "retrying", "builtins.ValueError", 4.0),
        (Retry(delay=7.5), policy(), "retrying", "retry_requested", 7.5),
        (Retry(), policy(), "retrying", "retry_requested", 4.0),
        (Retry(delay=-3), policy(), "retrying", "retry_requested", 0.0),
        (Retry(delay=float("inf")), policy(), "retrying", "retry_requested", 4.0),
        (JobTimeout("too slow"), policy(), "retrying", "timeout", 4.0),
        (WorkerCrashed("sigkill"), policy(), "retrying", "crashed", 4.0),
        (MemoryLimitExceeded("600 MB > 256 MB"), policy(), "retrying", "memory", 4.0),
        # coldbrew's own signals are retried even when retry_on names only job errors
        (JobTimeout("t"), policy(retry_on=(Flaky,)), "retrying", "timeout", 4.0),
        (MemoryLimitExceeded("m"), policy(retry_on=(Flaky,)), "retrying", "memory", 4.0),
        (Retry(delay=1), policy(retry_on=(Flaky,)), "retrying", "retry_requested", 1.0),
        # ...unless declared non-retryable explicitly
        (JobTimeout("t"), policy(dont_retry_on=(JobTimeout,)), "failed", "timeout", 0.0),
        (Permanent("p"), policy(retry_on=(Permanent,)), "failed", "permanent", 0.0),
    ],
)
def test_decide_rules(
    exc: BaseException, pol: RetryPolicy, status: str, kind: str, delay: float
) -> None:
    """Each exception class maps to the documented status, kind and delay (attempt 3)."""
    outcome = run(exc, attempt=3, pol=pol)
    assert (outcome.status, outcome.error_kind, outcome.delay) == (status, kind, delay)
    assert outcome.reason is None


def test_retry_with_delay_is_not_capped_by_policy() -> None:
    """An explicit Retry(delay=) is honoured even above the backoff cap (e.g. a rate limit)."""
    assert run(Retry(delay=3600), pol=policy(cap=10.0)).delay == 3600.0


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("x"),
        Retry(delay=1),
        JobTimeout("t"),
        WorkerCrashed("c"),
        MemoryLimitExceeded("m"),
    ],
)
def test_last_attempt_is_dead_with_reason(exc: BaseException) -> None:
    """A retryable failure on attempt max_attempts is dead with reason max_attempts."""
    outcome = run(exc, attempt=5)
    assert (outcome.status, outcome.reason, outcome.delay) == ("dead", "max_attempts", 0.0)
    assert run(exc, attempt=4).status == "retrying"


def test_attempt_past_the_budget_is_dead() -> None:
    """An attempt number beyond max_attempts (a crash-looping job) is dead too."""
    assert run(ValueError("x"), attempt=99).reason == "max_attempts"


def test_permanent_on_last_attempt_is_failed_not_dead() -> None:
    """A permanent error is failed whatever the attempt number."""
    outcome = run(Permanent("p"), attempt=5)
    assert (outcome.status, outcome.reason) == ("failed", None)


@pytest.mark.parametrize(
    ("elapsed", "rand", "status"),
    [
        (90.0, 0.5, "retrying"),  # 90 + 2 = 92 <= 100
        (98.0, 0.5, "retrying"),  # 98 + 2 = 100 is still within the budget
        (98.0, 1.0, "dead"),  # 98 + 4 = 102 > 100
        (101.0, 0.0, "dead"),  # already past the budget
    ],
)
def test_max_wall_seconds_counts_elapsed_plus_delay(
    elapsed: float, rand: float, status: str
) -> None:
    """Retrying is dead when elapsed since the first start plus the delay passes the budget."""
    pol = policy(max_wall_seconds=100.0)
    now = T0 + timedelta(seconds=elapsed)
    outcome = run(ValueError("x"), attempt=3, pol=pol, now=now, rand=lambda: rand)
    assert outcome.status == status
    assert outcome.reason == (None if status == "retrying" else "max_wall_seconds")


def test_max_wall_seconds_counts_an_explicit_retry_delay() -> None:
    """A Retry(delay=) that would end past the wall budget is dead."""
    pol = policy(max_wall_seconds=60.0)
    outcome = run(Retry(delay=120), pol=pol)
    assert (outcome.status, outcome.reason) == ("dead", "max_wall_seconds")


def test_missing_first_start_counts_as_now() -> None:
    """Without first_started_at only the delay is compared with the wall budget."""
    pol = policy(max_wall_seconds=3.0)
    assert run(ValueError("x"), attempt=2, pol=pol, started=None).status == "retrying"
    assert run(ValueError("x"), attempt=3, pol=pol, started=None).status == "dead"


def test_max_attempts_wins_over_max_wall_seconds() -> None:
    """When both budgets are spent the reason is max_attempts (checked first)."""
    pol = policy(max_attempts=2, max_wall_seconds=1.0)
    assert run(ValueError("x"), attempt=2, pol=pol, now=T0 + timedelta(hours=1)).reason == (
        "max_attempts"
    )


def test_job_cancelled_is_refused() -> None:
    """Cancellation is the caller's business, so decide refuses it."""
    with pytest.raises(ValueError):
        run(JobCancelled("stop"))


def test_rand_is_the_only_source_of_jitter() -> None:
    """The same inputs and random source always give the same outcome."""
    assert run(ValueError("x"), attempt=4, rand=HALF) == run(ValueError("x"), attempt=4, rand=HALF)
    assert run(ValueError("x"), attempt=4, rand=HALF).delay == 4.0


# --- messages and kinds ------------------------------------------------------------


def test_error_message_is_truncated() -> None:
    """A huge exception text is cut to MAX_ERROR_MESSAGE characters."""
    outcome = run(ValueError("x" * 10_000))
    assert len(outcome.error_message) == MAX_ERROR_MESSAGE
    assert outcome.error_message.startswith("xxx")


def test_short_error_message_is_kept_verbatim() -> None:
    """A normal exception text is stored as str(exc)."""
    assert run(KeyError("k")).error_message == "'k'"


def test_unprintable_exception_does_not_break_decide() -> None:
    """An exception whose __str__ raises still gets a message."""

    class Ugly(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert run(Ugly()).error_message.startswith("<unprintable ")


def test_error_kind_of_nested_class_uses_qualname() -> None:
    """Ordinary exceptions are named module.QualName."""

    class Inner(Exception):
        pass

    assert error_kind(Inner()) == f"{__name__}.{Inner.__qualname__}"


# --- remote errors from the process pool -------------------------------------------


def test_remote_error_uses_its_kind_and_message() -> None:
    """A RemoteJobError is recorded with its own kind and original message, and retried."""
    outcome = run(RemoteJobError("builtins.ValueError", "boom"))
    assert (outcome.status, outcome.error_kind, outcome.error_message) == (
        "retrying",
        "builtins.ValueError",
        "boom",
    )


@pytest.mark.parametrize(
    ("remote", "pol", "status"),
    [
        (RemoteJobError("permanent", "p"), policy(), "failed"),
        (RemoteJobError("coldbrew.errors.Permanent", "p"), policy(), "failed"),
        (RemoteJobError(f"{__name__}.Flaky", "x"), policy(dont_retry_on=(Flaky,)), "failed"),
        (RemoteJobError(f"{__name__}.Flaky", "x"), policy(retry_on=(Flaky,)), "retrying"),
        (RemoteJobError(f"{__name__}.FlakySub", "x"), policy(retry_on=(Flaky,)), "failed"),
        (
            RemoteJobError(
                f"{__name__}.FlakySub", "x", kinds=(f"{__name__}.FlakySub", f"{__name__}.Flaky")
            ),
            policy(retry_on=(Flaky,)),
            "retrying",
        ),
        (RemoteJobError("timeout", "t"), policy(retry_on=(Flaky,)), "retrying"),
        (RemoteJobError("crashed", "c"), policy(retry_on=(Flaky,)), "retrying"),
    ],
)
def test_remote_error_classification(remote: RemoteJobError, pol: RetryPolicy, status: str) -> None:
    """Remote errors match the rules by kind name (and by MRO names when given)."""
    assert run(remote, pol=pol, attempt=2).status == status


def test_remote_retry_request_keeps_its_delay() -> None:
    """A remote retry_requested with a delay attribute waits that long."""
    remote = RemoteJobError("retry_requested", "later")
    remote.delay = 12.0  # type: ignore[attr-defined]
    assert run(remote).delay == 12.0


def test_remote_cancellation_is_refused() -> None:
    """A remote JobCancelled is refused like a local one."""
    with pytest.raises(ValueError):
        run(RemoteJobError("coldbrew.errors.JobCancelled", "stop"))
