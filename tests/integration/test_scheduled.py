"""Scheduled jobs and snooze against the real RabbitMQ and PostgreSQL.

Every entry point (client run_at/delay, HTTP run_at/delay_seconds, raw
x-run-at/x-delay-seconds; the CLI's --at/--delay are in tests/e2e) schedules
a job that starts not before its run_at and soon after; cancelling a
scheduled job keeps it from ever running; the gauges count it apart from the
backlog; an early delivery does not run it early; a snooze spends no attempt.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import asyncpg
import pytest

from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.errors import InvalidRequest
from coldbrew.model import JobRecord
from coldbrew.settings import Settings
from tests.helpers import DATABASE_URL, WorkerFactory, metric, publish_raw, wait_until
from tests.integration.test_api import ACME, api_client

LATE_LIMIT = 1.5
"""Seconds after run_at by which a scheduled job must have started (the brief's ~1.5 s)."""


@pytest.fixture
def app() -> Any:
    return load_app("tests.scheduled_apps:app")


@pytest.fixture
async def sclient(settings: Settings, app: Any) -> AsyncIterator[Client]:
    async with Client.connect(settings, app=app) as connected:
        yield connected


async def finished(client: Client, job_id: str, timeout: float = 10.0) -> JobRecord:
    return await client.wait(job_id, timeout=timeout, poll=0.05)


def assert_on_time(record: JobRecord, run_at: datetime) -> None:
    """Started not before ``run_at`` and within LATE_LIMIT after it."""
    assert record.status == "succeeded", record
    assert record.started_at is not None
    late = (record.started_at - run_at).total_seconds()
    assert 0 <= late <= LATE_LIMIT, f"started {late:.3f} s after run_at"


async def test_client_run_at_and_delay(
    start_worker: WorkerFactory, sclient: Client, app: Any
) -> None:
    """run_at and delay make the job scheduled, then it runs on time, once."""
    await start_worker(app, processes=0)
    run_at = datetime.now(UTC) + timedelta(seconds=1.2)
    by_time = await sclient.submit("noop", run_at=run_at)
    by_delay = await sclient.submit("noop", delay=timedelta(seconds=1))
    assert by_time.status == by_delay.status == "scheduled"
    assert by_time.run_at == run_at
    assert by_delay.run_at > by_delay.created_at + timedelta(seconds=0.9)
    for record in (by_time, by_delay):
        done = await finished(sclient, record.id)
        assert_on_time(done, record.run_at)
        assert done.attempt == 1


async def test_past_run_at_and_zero_delay_run_now(sclient: Client) -> None:
    """A time already past, or a delay of 0, is an ordinary queued job."""
    past = await sclient.submit("noop", run_at=datetime.now(UTC) - timedelta(hours=1))
    now = await sclient.submit("noop", delay=0)
    assert past.status == now.status == "queued"


@pytest.mark.parametrize(
    ("when", "reason"),
    [
        ({"run_at": datetime(2030, 1, 1)}, "bad_run_at"),  # noqa: DTZ001 - naive on purpose
        ({"run_at": "2030-01-01T00:00:00Z"}, "bad_run_at"),
        ({"delay": -1}, "bad_delay"),
        ({"delay": float("nan")}, "bad_delay"),
        ({"delay": True}, "bad_delay"),
        ({"delay": 20 * 365 * 86400}, "bad_delay"),
        ({"run_at": datetime.now(UTC), "delay": 1}, "bad_run_at"),
    ],
)
async def test_client_refuses_bad_schedules(
    sclient: Client, when: dict[str, Any], reason: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        await sclient.submit("noop", **when)
    assert caught.value.reason == reason


async def test_http_run_at_and_delay_seconds(
    start_worker: WorkerFactory, sclient: Client, app: Any
) -> None:
    """POST /jobs takes run_at (ISO 8601) or delay_seconds; bad ones are a 422 saying why."""
    await start_worker(app, processes=0)
    run_at = datetime.now(UTC) + timedelta(seconds=1)
    async with api_client(sclient) as http:
        body = {"type": "noop", "run_at": run_at.isoformat()}
        at = await http.post("/jobs", json=body, headers=ACME)
        later = await http.post("/jobs", json={"type": "noop", "delay_seconds": 1}, headers=ACME)
        assert at.status_code == later.status_code == 202, (at.text, later.text)
        assert at.json()["status"] == later.json()["status"] == "scheduled"
        bad = {
            "bad_run_at": [
                {"type": "noop", "run_at": "tomorrow"},
                {"type": "noop", "run_at": "2030-01-01T00:00:00"},
                {"type": "noop", "run_at": "2026-01-01T00:00:00Z", "delay_seconds": 1},
            ],
            "invalid_body": [
                {"type": "noop", "delay_seconds": -1},
                {"type": "noop", "delay_seconds": "90"},
                {"type": "noop", "run_at": 1234},
            ],
        }
        for kind, bodies in bad.items():
            for body in bodies:
                refused = await http.post("/jobs", json=body, headers=ACME)
                assert refused.status_code == 422, (body, refused.text)
                assert refused.json()["error"]["kind"] == kind, (body, refused.text)
        for response in (at, later):
            job = response.json()
            done = await finished(sclient, job["id"])
            assert_on_time(done, datetime.fromisoformat(job["run_at"]))


async def test_raw_headers_schedule_the_job(
    start_worker: WorkerFactory,
    sclient: Client,
    app: Any,
    amqp: aio_pika.abc.AbstractChannel,
    settings: Settings,
) -> None:
    """A producer's x-run-at / x-delay-seconds: the worker records the row as scheduled and
    acks; the relay publishes it at its time and it runs once."""
    worker = await start_worker(app, processes=0)
    run_at = datetime.now(UTC) + timedelta(seconds=1.2)
    body = json.dumps({"type": "noop"}).encode()
    await publish_raw(
        amqp, settings.namespace, body, "default.default",
        message_id="raw-at", headers={"x-run-at": run_at.isoformat()},
    )  # fmt: skip
    await publish_raw(
        amqp, settings.namespace, body, "default.default",
        message_id="raw-delay", headers={"x-delay-seconds": "1"},
    )  # fmt: skip
    for job_id in ("raw-at", "raw-delay"):
        await wait_until(lambda job_id=job_id: scheduled_row(sclient, job_id), timeout=5)
    assert metric(worker, "coldbrew_scheduled_deliveries_total", outcome="deferred") == 2
    at = await finished(sclient, "raw-at")
    assert abs((at.run_at - run_at).total_seconds()) < 0.001
    assert_on_time(at, run_at)
    later = await finished(sclient, "raw-delay")
    assert_on_time(later, later.run_at)
    assert later.run_at >= later.created_at + timedelta(seconds=0.99)
    assert at.attempt == later.attempt == 1


async def scheduled_row(client: Client, job_id: str) -> bool:
    try:
        return (await client.get(job_id)).status == "scheduled"
    except Exception:  # not inserted yet
        return False


async def test_raw_bad_schedule_headers_are_dead_lettered(
    start_worker: WorkerFactory,
    app: Any,
    amqp: aio_pika.abc.AbstractChannel,
    settings: Settings,
) -> None:
    """A bad x-run-at or x-delay-seconds goes to the rejected messages with its reason."""
    await start_worker(app, processes=0)
    body = json.dumps({"type": "noop"}).encode()
    cases = [
        ({"x-run-at": "next tuesday"}, "bad_run_at"),
        ({"x-run-at": "2030-01-01T00:00:00"}, "bad_run_at"),  # no offset
        ({"x-delay-seconds": "-5"}, "bad_delay"),
        ({"x-delay-seconds": "soon"}, "bad_delay"),
        ({"x-run-at": "2030-01-01T00:00:00Z", "x-delay-seconds": 5}, "bad_run_at"),
    ]
    for index, (headers, _) in enumerate(cases):
        await publish_raw(
            amqp, settings.namespace, body, "default.default",
            message_id=f"bad-{index}", headers=headers,
        )  # fmt: skip

    async def rejected() -> dict[str, str]:
        search = {"search_path": settings.namespace}
        conn = await asyncpg.connect(DATABASE_URL, server_settings=search)
        try:
            rows = await conn.fetch("SELECT message_id, reason FROM rejected_messages")
        finally:
            await conn.close()
        return {row["message_id"]: row["reason"] for row in rows}

    async def all_rejected() -> bool:
        return len(await rejected()) == len(cases)

    await wait_until(all_rejected, timeout=10)
    assert await rejected() == {f"bad-{i}": reason for i, (_, reason) in enumerate(cases)}


async def test_cancel_scheduled_job_never_runs(
    start_worker: WorkerFactory, sclient: Client, app: Any
) -> None:
    """Client and HTTP cancels of a scheduled job: cancelled at once, never published."""
    worker = await start_worker(app, processes=0)
    by_client = await sclient.submit("noop", delay=0.8)
    by_http = await sclient.submit("noop", tenant="acme", delay=0.8)
    cancelled = await sclient.cancel(by_client.id, "not needed")
    assert cancelled.status == "cancelled"
    async with api_client(sclient) as http:
        response = await http.delete(f"/jobs/{by_http.id}", headers=ACME)
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "cancelled"
    await wait_until(lambda: past(by_client.run_at + timedelta(seconds=1)), timeout=5)
    for job in (by_client, by_http):
        record = await sclient.get(job.id)
        assert record.status == "cancelled"
        assert record.attempt == 0 and record.started_at is None
    assert metric(worker, "coldbrew_relay_published_total", cause="scheduled") == 0


async def past(moment: datetime) -> bool:
    return datetime.now(UTC) >= moment


async def test_stats_count_scheduled_apart(
    start_worker: WorkerFactory, sclient: Client, app: Any, settings: Settings
) -> None:
    """A job due in an hour is scheduled, not queued: not depth, not oldest waiting age."""
    worker = await start_worker(app, processes=0, stats_interval_seconds=0.1)
    await sclient.submit("noop", tenant="later", delay=3600)
    [row] = await sclient.store.stats.queue_stats("later")
    assert (row.scheduled, row.queued, row.retrying) == (1, 0, 0)
    assert row.oldest_waiting_seconds == 0

    async def gauged() -> bool:
        labels = {"queue": "default", "tenant": "later"}
        return metric(worker, "coldbrew_jobs_scheduled", **labels) == 1

    await wait_until(gauged, timeout=5)
    assert metric(worker, "coldbrew_queue_depth", queue="default", tenant="later") == 0


async def test_early_delivery_does_not_run_it_early(
    start_worker: WorkerFactory,
    sclient: Client,
    app: Any,
    amqp: aio_pika.abc.AbstractChannel,
    settings: Settings,
) -> None:
    """A raw duplicate of a scheduled job, delivered before run_at, is acked and counted;
    the job still runs once, at its time."""
    worker = await start_worker(app, processes=0)
    job_id = str(uuid.uuid4())
    record = await sclient.submit("noop", job_id=job_id, delay=2.5)
    body = json.dumps({"type": "noop"}).encode()
    await publish_raw(amqp, settings.namespace, body, "default.default", message_id=job_id)

    async def early_counted() -> bool:
        return metric(worker, "coldbrew_scheduled_deliveries_total", outcome="early") == 1

    await wait_until(early_counted, timeout=5)
    assert (await sclient.get(job_id)).status == "scheduled"
    done = await finished(sclient, job_id)
    assert_on_time(done, record.run_at)
    assert done.attempt == 1


async def test_snooze_spends_no_attempt(
    start_worker: WorkerFactory, sclient: Client, app: Any
) -> None:
    """Two snoozes (raised, then returned) and a success, with max_attempts=1."""
    worker = await start_worker(app, processes=0)
    await snoozes_twice(worker, sclient, "snooze_twice")


async def test_snooze_from_the_process_pool(
    start_worker: WorkerFactory, settings: Settings
) -> None:
    """The same from a pool child: the Snooze crosses its pipe, raised or returned."""
    pool_app = load_app("tests.scheduled_apps:pool_app")
    worker = await start_worker(pool_app, processes=1)
    async with Client.connect(settings, app=pool_app) as client:
        await snoozes_twice(worker, client, "snooze_twice_in_pool")


async def snoozes_twice(worker: Any, client: Client, job_type: str) -> None:
    job = await client.submit(job_type)
    done = await finished(client, job.id)
    assert done.status == "succeeded", done
    assert done.result == {"attempt": 3, "snoozes": 2}
    assert (done.attempt, done.max_attempts, done.snoozes) == (3, 1, 2)
    assert done.to_status_json()["snoozes"] == 2
    assert metric(worker, "coldbrew_jobs_snoozed_total", type=job_type) == 2


async def test_snooze_is_bounded_by_max_wall_seconds(
    start_worker: WorkerFactory, sclient: Client, app: Any
) -> None:
    """A job that keeps snoozing ends dead once another snooze would pass max_wall_seconds."""
    await start_worker(app, processes=0)
    job = await sclient.submit("snooze_forever")
    done = await finished(sclient, job.id)
    assert done.status == "dead"
    assert done.dead_reason == "max_wall_seconds"
    assert done.error_kind == "snoozed"
    assert "max_wall_seconds" in (done.error_message or "")
    assert done.snoozes >= 2  # 0.3 s snoozes within a 1 s wall


async def test_a_relay_that_dies_before_the_confirm_loses_nothing(sclient: Client) -> None:
    """The statement that takes a due scheduled row turns it queued and pushes its mark
    ahead: a relay that dies before publishing leaves a row the next pass takes again."""
    job = await sclient.submit("noop", delay=1.5)  # room for a busy machine
    outbox = sclient.store.outbox
    RETRY_AFTER = 1.5  # noqa: N806 - the relay's retry_after, in seconds
    assert await outbox.take_due_publishes(10, RETRY_AFTER) == []  # not due yet
    await wait_until(lambda: past(job.run_at), timeout=5)
    [taken] = await outbox.take_due_publishes(10, RETRY_AFTER)
    assert (taken.id, taken.was) == (job.id, "scheduled")
    assert (await sclient.get(job.id)).status == "queued"
    # ... the relay dies here, before the broker confirmed anything
    assert await outbox.take_due_publishes(10, RETRY_AFTER) == []  # its mark is pushed ahead
    await wait_until(lambda: past(taken.publish_after), timeout=5)
    [again] = await outbox.take_due_publishes(10, RETRY_AFTER)
    assert (again.id, again.was) == (job.id, "queued")
