"""The duration and instant parsers, the schedule checks, the x-run-at headers, Snooze and
what a snooze writes."""

from __future__ import annotations

import json
import pickle
from datetime import UTC, datetime, timedelta, timezone

import pytest

from coldbrew import Snooze
from coldbrew.durations import (
    MAX_SCHEDULE_SECONDS,
    DurationError,
    parse_duration,
    parse_instant,
    seconds_of,
)
from coldbrew.errors import ContractViolation, InvalidRequest
from coldbrew.model import check_schedule, parse_envelope
from coldbrew.procpool.protocol import outcome_error

NOW = datetime(2026, 12, 1, 20, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("15m", 900.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1w", 604800.0),
        ("250ms", 0.25),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("90", 90.0),
        ("0", 0.0),
        (" 2H ", 7200.0),
    ],
)
def test_parse_duration_reads_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "5x", "-5s", "-5", "nan", "inf", "5 s", "1h-30m", "h1"])
def test_parse_duration_refuses_the_rest(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


def test_seconds_of_takes_numbers_and_timedeltas_only() -> None:
    assert seconds_of(timedelta(minutes=2)) == 120.0
    assert seconds_of(3) == 3.0
    for bad in (True, "3", -1, float("inf"), timedelta(seconds=-1), None):
        with pytest.raises(DurationError):
            seconds_of(bad)


def test_parse_instant_needs_an_offset() -> None:
    assert parse_instant("2026-12-01T20:00:00Z") == NOW
    assert parse_instant("2026-12-01T21:00:00+01:00") == NOW
    assert parse_instant("2026-12-01T21:00:00+01:00").utcoffset() == timedelta(hours=1)
    for bad in ("2026-12-01T20:00:00", "tomorrow", "", "2026-13-01T00:00:00Z"):
        with pytest.raises(DurationError):
            parse_instant(bad)


def test_check_schedule() -> None:
    soon = NOW + timedelta(minutes=5)
    assert check_schedule(soon, None, now=NOW) == (soon, None)
    assert check_schedule(None, timedelta(seconds=90), now=NOW) == (None, 90.0)
    assert check_schedule(None, None, now=NOW) == (None, None)
    assert check_schedule(NOW - timedelta(days=1), None, now=NOW)[0] is not None  # runs now
    far = NOW + timedelta(seconds=MAX_SCHEDULE_SECONDS + 1)  # an explicit instant: no cap
    assert check_schedule(far, None, now=NOW) == (far, None)
    cases = [
        ((datetime(2030, 1, 1), None), "bad_run_at"),  # noqa: DTZ001 - naive on purpose
        (("2030-01-01T00:00:00Z", None), "bad_run_at"),
        ((soon, 5), "bad_run_at"),
        ((None, -0.5), "bad_delay"),
        ((None, MAX_SCHEDULE_SECONDS + 1), "bad_delay"),
        ((None, "90s"), "bad_delay"),
    ]
    for (run_at, delay), reason in cases:
        with pytest.raises(InvalidRequest) as caught:
            check_schedule(run_at, delay, now=NOW)
        assert caught.value.reason == reason, (run_at, delay)


def envelope(headers: dict[str, object]):  # type: ignore[no-untyped-def]
    return parse_envelope(
        json.dumps({"type": "noop"}).encode(),
        routing_key="default.acme",
        message_id="m1",
        headers=headers,
        priority=None,
        max_body_bytes=4096,
    )


def test_headers_schedule_a_delivery() -> None:
    at = envelope({"x-run-at": b"2030-01-01T00:00:00+02:00"})
    assert at.run_at == datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=2)))
    assert at.delay is None and at.deferred
    assert envelope({"x-delay-seconds": 90}).delay == 90.0
    assert envelope({"x-delay-seconds": "15m"}).delay == 900.0
    assert envelope({"x-delay-seconds": b"1.5"}).delay == 1.5
    stamp = datetime(2030, 1, 1)  # noqa: DTZ001 - an AMQP timestamp arrives naive, in UTC
    assert envelope({"x-run-at": stamp}).run_at == stamp.replace(tzinfo=UTC)
    plain = envelope({})
    assert (plain.run_at, plain.delay, plain.deferred) == (None, None, False)
    # resolved() (the claim's fields) keeps them
    assert at.resolved(None, 3).run_at == at.run_at


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"x-run-at": "soon"}, "bad_run_at"),
        ({"x-run-at": "2030-01-01T00:00:00"}, "bad_run_at"),
        ({"x-run-at": 1767225600}, "bad_run_at"),
        ({"x-delay-seconds": -1}, "bad_delay"),
        ({"x-delay-seconds": True}, "bad_delay"),
        ({"x-delay-seconds": "later"}, "bad_delay"),
        ({"x-run-at": "2030-01-01T00:00:00Z", "x-delay-seconds": 1}, "bad_run_at"),
    ],
)
def test_bad_schedule_headers_are_contract_violations(
    headers: dict[str, object], reason: str
) -> None:
    with pytest.raises(ContractViolation) as caught:
        envelope(headers)
    assert caught.value.reason == reason


def test_snooze_checks_its_seconds_and_survives_pickling() -> None:
    assert Snooze(timedelta(minutes=1)).seconds == 60.0
    assert Snooze().seconds == 0.0
    for bad in (-1, float("nan"), float("inf"), "5", True):
        with pytest.raises(ValueError, match="Snooze"):
            Snooze(bad)  # type: ignore[arg-type]
    copy = pickle.loads(pickle.dumps(Snooze(2.5)))
    assert isinstance(copy, Snooze) and copy.seconds == 2.5
    crossed = outcome_error(("snooze", 2.5))
    assert isinstance(crossed, Snooze) and crossed.seconds == 2.5


# --- what a snooze writes (worker/outcomes.py) ----------------------------------------


def snooze_outcome(seconds: float, *, wall: float | None, ran_for: float, snoozes: int = 0):  # type: ignore[no-untyped-def]
    from coldbrew.app import App
    from coldbrew.jobstate import Delivery, JobState
    from coldbrew.store import ClaimResult
    from coldbrew.worker import outcomes

    app = App()

    @app.job(max_attempts=1, max_wall_seconds=wall)
    async def sleepy(ctx: object) -> None: ...

    spec = app.get("sleepy")
    delivery = Delivery(None, envelope({}), spec, {})  # type: ignore[arg-type]
    state = JobState("j1", 3, delivery, 0.0)
    started = NOW - timedelta(seconds=ran_for)
    claim = ClaimResult("j1", True, "running", 3, 1, None, None, started, snoozes=snoozes)
    return outcomes.snoozed(state, claim, Snooze(seconds), now=NOW)


def test_a_snooze_is_scheduled_after_its_seconds() -> None:
    outcome = snooze_outcome(30, wall=None, ran_for=5)
    assert (outcome.status, outcome.delay, outcome.attempt) == ("scheduled", 30.0, 3)


def test_a_snooze_past_max_wall_seconds_is_dead() -> None:
    assert snooze_outcome(30, wall=60, ran_for=20).status == "scheduled"
    dead = snooze_outcome(30, wall=60, ran_for=40, snoozes=2)
    assert (dead.status, dead.dead_reason) == ("dead", "max_wall_seconds")
    assert dead.error_kind == "snoozed"
    assert "after 2 snoozes" in (dead.error_message or "")


def test_a_snooze_past_ten_years_fails() -> None:
    failed = snooze_outcome(MAX_SCHEDULE_SECONDS + 1, wall=None, ran_for=0)
    assert (failed.status, failed.error_kind) == ("failed", "invalid_snooze")
