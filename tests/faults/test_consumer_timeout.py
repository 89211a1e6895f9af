"""RabbitMQ's consumer_timeout against a job that runs longer than the broker allows.

On RabbitMQ 3.10 the timeout is global, read when a channel opens, checked on the
channel's tick (``channel_tick_interval``, once a minute by default) and closes the
whole channel, requeueing every delivery on it (SEMANTICS §1). coldbrew acks a
job whose timeout may exceed the broker's as soon as its claim is committed, so
the lease (not the delivery) guards it. Here the broker is set to a 5 s timeout
checked every second for the channels this test opens (both restored at the end),
and a 15 s job (three timeouts, fifteen checks) runs once, with its channel's other
jobs untouched. A channel of the test's own that holds a delivery unacked is closed
by the broker meanwhile: the short timeout was in force, so the job had to outlive it.

It used to wait for the default one-minute tick with a 70 s job (74 s in all); the
tick is a broker setting like the timeout, so a short one proves the same in 20 s.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator

import aio_pika
import pytest

from coldbrew.client import Client
from tests.helpers import AMQP_URL, WorkerFactory

# exclusive: sets the machine's RabbitMQ consumer_timeout and channel tick (global on
# 3.10) for the test's 20 s; channels other tests opened meanwhile would get them too
pytestmark = [pytest.mark.slow, pytest.mark.exclusive, pytest.mark.timeout(200)]

BROKER_TIMEOUT_MS = 5000
TICK_MS = 1000
LONG_JOB_SECONDS = 15.0


def set_rabbit_env(key: str, value: int) -> None:
    subprocess.run(
        ["rabbitmqctl", "-q", "eval", f"application:set_env(rabbit, {key}, {value})."],
        check=True,
        timeout=60,
        capture_output=True,
    )


@pytest.fixture
def short_broker_timeout() -> Iterator[None]:
    set_rabbit_env("consumer_timeout", BROKER_TIMEOUT_MS)
    set_rabbit_env("channel_tick_interval", TICK_MS)
    try:
        yield
    finally:
        set_rabbit_env("channel_tick_interval", 60_000)
        set_rabbit_env("consumer_timeout", 1_800_000)


async def unacked_channel_closed_after(namespace: str) -> float:
    """Seconds until the broker closes a channel that holds one delivery unacked."""
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel()
        closed: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        channel.close_callbacks.add(lambda *_: closed.done() or closed.set_result(time.monotonic()))
        queue = await channel.declare_queue(f"{namespace}.timeout_probe", auto_delete=True)
        await channel.default_exchange.publish(aio_pika.Message(b"held"), routing_key=queue.name)
        got = asyncio.Event()

        async def hold(_message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.set()  # never acked

        await queue.consume(hold)
        await asyncio.wait_for(got.wait(), timeout=10)
        held_at = time.monotonic()
        return await asyncio.wait_for(closed, timeout=LONG_JOB_SECONDS) - held_at
    finally:
        await connection.close()


async def test_long_job_survives_a_short_consumer_timeout(
    short_broker_timeout: None, start_worker: WorkerFactory, client: Client, namespace: str
) -> None:
    """A 15 s job under a 5 s broker timeout runs exactly once; short jobs beside it finish."""
    worker = await start_worker(broker_consumer_timeout_seconds=BROKER_TIMEOUT_MS / 1000)
    long_job = await client.submit("sleep_for", {"seconds": LONG_JOB_SECONDS}, timeout=600)
    probe = asyncio.create_task(unacked_channel_closed_after(namespace))
    short = [await client.submit("echo", {"value": i}, timeout=2) for i in range(20)]
    for job in short:
        assert (await client.wait(job.id, timeout=20)).status == "succeeded"
    done = await client.wait(long_job.id, timeout=120)
    closed_after = await probe
    assert done.status == "succeeded"
    assert done.attempt == 1
    # the broker did enforce the short timeout, well within the long job's run
    assert closed_after < LONG_JOB_SECONDS - BROKER_TIMEOUT_MS / 1000, closed_after
    registry = worker.metrics.registry
    assert (
        registry.get_sample_value("coldbrew_redeliveries_total", {"cause": "broker_flag"}) or 0
    ) == 0
    assert (
        registry.get_sample_value(
            "coldbrew_jobs_started_total", {"queue": "default", "type": "sleep_for"}
        )
        or 0
    ) == 1
