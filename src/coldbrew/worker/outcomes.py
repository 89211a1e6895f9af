"""What a finished attempt writes: its outcome, built from the job's result or exception.

Pure: no I/O. A job's return value becomes ``succeeded`` with its JSON, or a
permanent failure when it is not JSON; an exception is classified by the
retry policy (retry.py) into ``retrying`` with a delay, ``failed`` or
``dead``; a cancel becomes ``cancelled`` with its reason.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import structlog

from coldbrew import retry, storable
from coldbrew.durations import MAX_SCHEDULE_SECONDS
from coldbrew.errors import Snooze, UnstorableData, UnstorableValue
from coldbrew.jobstate import JobState
from coldbrew.model import Status
from coldbrew.settings import Settings
from coldbrew.store import ClaimResult, Outcome, RawJSON

log = structlog.get_logger("coldbrew.runner")


def succeeded(state: JobState, result: Any) -> Outcome:
    """The outcome of a job that returned ``result``."""
    try:
        encoded = RawJSON(storable.dump_json(result, "result"))
    except UnstorableValue as exc:  # NUL, NaN, too big...: PostgreSQL cannot store it
        return Outcome(
            state.id,
            state.attempt,
            Status.FAILED,
            error_kind="unstorable_result",
            error_message=f"the job's return value cannot be stored: {exc}",
        )
    except (TypeError, ValueError) as exc:
        return Outcome(
            state.id,
            state.attempt,
            Status.FAILED,
            error_kind="unserializable_result",
            error_message=f"the job's return value is not JSON: {exc}",
        )
    return Outcome(state.id, state.attempt, Status.SUCCEEDED, result=encoded)


def cancelled(state: JobState, reason: str) -> Outcome:
    """The outcome of a job stopped by a cancel request (or raising ``JobCancelled``)."""
    return Outcome(
        state.id, state.attempt, Status.CANCELLED, error_kind="cancelled", error_message=reason
    )


def failed(
    state: JobState,
    claim: ClaimResult,
    exc: Exception,
    *,
    settings: Settings,
    rand: random.Random,
) -> Outcome:
    """The outcome of a job that raised ``exc``: retried, failed or dead, per its policy."""
    spec = state.delivery.spec
    policy = retry.RetryPolicy(
        max_attempts=claim.max_attempts,
        base=settings.retry_base_seconds,
        cap=settings.retry_max_seconds,
        max_wall_seconds=spec.max_wall_seconds,
        retry_on=spec.retry_on,
        dont_retry_on=spec.dont_retry_on,
    )
    decision = retry.decide(
        policy,
        exc,
        attempt=state.attempt - claim.snoozes,  # the budget: snoozes spent no attempt
        first_started_at=claim.started_at,
        now=datetime.now(UTC),
        rand=rand.random,
    )
    log.info(
        "job_failed",
        job_id=state.id,
        type=spec.name,
        attempt=state.attempt,
        error_kind=decision.error_kind,
        error=decision.error_message,
        next_status=str(decision.status),
        retry_in=round(decision.delay, 3),
    )
    return Outcome(
        state.id,
        state.attempt,
        Status(decision.status),
        error_kind=storable.clean_text(decision.error_kind, say=False),
        error_message=storable.clean_text(decision.error_message),
        delay=decision.delay,
        dead_reason=decision.reason,
    )


def snoozed(state: JobState, claim: ClaimResult, snooze: Snooze, *, now: datetime) -> Outcome:
    """The outcome of a job that snoozed: ``scheduled`` again after ``snooze.seconds``
    (complete_batch counts the snooze, which gives back this attempt), or ``dead`` when
    waiting that long would pass the job's ``max_wall_seconds`` since its first start."""
    seconds = snooze.seconds
    if seconds > MAX_SCHEDULE_SECONDS:
        return Outcome(
            state.id,
            state.attempt,
            Status.FAILED,
            error_kind="invalid_snooze",
            error_message=f"Snooze({seconds:g}) is more than {MAX_SCHEDULE_SECONDS:g} s ahead",
        )
    wall = state.delivery.spec.max_wall_seconds
    started = claim.started_at or now
    if wall is not None and (now - started).total_seconds() + seconds > wall:
        return Outcome(
            state.id,
            state.attempt,
            Status.DEAD,
            error_kind="snoozed",
            error_message=(
                f"snoozing {seconds:g} s more would pass max_wall_seconds ({wall:g} s) since the "
                f"first start, after {claim.snoozes} snoozes"
            ),
            dead_reason="max_wall_seconds",
        )
    log.debug("job_snoozed", job_id=state.id, seconds=seconds, snoozes=claim.snoozes + 1)
    return Outcome(state.id, state.attempt, Status.SCHEDULED, delay=seconds)


def refused(outcome: Outcome, exc: UnstorableData) -> Outcome:
    """What is written instead of an outcome PostgreSQL refused: a permanent failure."""
    return Outcome(
        outcome.id,
        outcome.attempt,
        Status.FAILED,
        error_kind="unstorable_outcome",
        error_message=storable.clean_text(
            f"PostgreSQL refused this attempt's outcome ({outcome.status}): {exc}"
        )[: retry.MAX_ERROR_MESSAGE],
    )
