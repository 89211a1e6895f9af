"""Aging inside one tenant's queue: a low-priority job behind a priority stream still runs.

RabbitMQ serves a priority queue strictly, so without the aging sweep a
priority-0 message behind a backlog of priority-9 work of the same tenant is
delivered only once that backlog is gone. These tests publish such a backlog
with a plain aio-pika producer (no coldbrew code) and time the probe.
"""

from __future__ import annotations

import json
import time

import aio_pika
import asyncpg

from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.helpers import DATABASE_URL, WorkerFactory, metric, publish_raw, status_is, wait_until

AGING = 1.0
STREAM_JOBS = 120
STREAM_JOB_SECONDS = 0.1  # 120 jobs, 2 at a time: a 6 s backlog


def body(job_type: str, **args: object) -> bytes:
    return json.dumps({"type": job_type, "args": args}).encode()


async def succeeded(settings: Settings, where: str = "true") -> int:
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        return int(
            await conn.fetchval(
                f'SELECT count(*) FROM "{settings.namespace}".jobs '
                f"WHERE status = 'succeeded' AND {where}"
            )
        )
    finally:
        await conn.close()


async def test_priority_zero_runs_within_aging_behind_a_priority_nine_backlog(
    start_worker: WorkerFactory,
    amqp: aio_pika.abc.AbstractChannel,
    client: Client,
    settings: Settings,
) -> None:
    """The probe starts within COLDBREW_AGING_SECONDS + 1 s while the backlog still runs,
    and every job, swept and returned or not, runs exactly once."""
    worker = await start_worker(concurrency=2, prefetch=2, aging_seconds=AGING)
    for i in range(STREAM_JOBS):
        await publish_raw(
            amqp,
            settings.namespace,
            body("timed_sleep", seconds=STREAM_JOB_SECONDS),
            "default.default",
            message_id=f"stream-{i}",
            priority=9,
        )
    await wait_until(lambda: _at_least(settings, 4), timeout=10)  # the stream is running
    published = time.time()
    await publish_raw(
        amqp,
        settings.namespace,
        body("timed_sleep", seconds=0.01),
        "default.default",
        message_id="probe",
        priority=0,
    )
    await wait_until(lambda: status_is(client, "probe", "succeeded"), timeout=AGING + 5)
    probe = await client.get("probe")
    started = probe.result["start"]
    assert started - published <= AGING + 1.0
    # ... ahead of the stream, which still had most of its backlog to go
    stream_done_then = await succeeded(
        settings, f"id LIKE 'stream-%' AND finished_at < to_timestamp({started})"
    )
    assert stream_done_then < STREAM_JOBS * 0.75
    assert metric(worker, "coldbrew_aging_sweeps_total", result="kept") >= 1
    returned = metric(worker, "coldbrew_aging_swept_total", fate="returned")
    assert returned > 0
    # returned messages were requeued, not lost, and none ran twice
    await wait_until(lambda: _at_least(settings, STREAM_JOBS + 1), timeout=30)
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        attempts = await conn.fetchval(f'SELECT max(attempt) FROM "{settings.namespace}".jobs')
    finally:
        await conn.close()
    assert attempts == 1
    # the returned messages came back here, and were told apart from broker redeliveries
    assert 0 < metric(worker, "coldbrew_redeliveries_total", cause="aging_sweep") <= returned
    assert metric(worker, "coldbrew_redeliveries_total", cause="broker_flag") == 0
    assert metric(worker, "coldbrew_jobs_started_total", queue="default", type="timed_sleep") == (
        STREAM_JOBS + 1
    )


async def test_no_sweep_while_the_lowest_priority_flows(
    start_worker: WorkerFactory,
    amqp: aio_pika.abc.AbstractChannel,
    settings: Settings,
) -> None:
    """A backlog of priority-0 work hides nothing: the queue is never swept."""
    worker = await start_worker(concurrency=2, prefetch=2, aging_seconds=0.4)
    for i in range(30):
        await publish_raw(
            amqp,
            settings.namespace,
            body("timed_sleep", seconds=0.05),
            "default.default",
            message_id=f"flat-{i}",
        )
    await wait_until(lambda: _at_least(settings, 30), timeout=20)
    sweeps = sum(
        metric(worker, "coldbrew_aging_sweeps_total", result=r)
        for r in ("kept", "none_held_back", "empty")
    )
    assert sweeps == 0


async def _at_least(settings: Settings, count: int) -> bool:
    return await succeeded(settings) >= count
