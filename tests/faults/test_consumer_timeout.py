"""RabbitMQ's consumer_timeout against a job that runs longer than the broker allows.

On RabbitMQ 3.10 the timeout is global, checked once a minute, and closes the
whole channel, requeueing every delivery on it (SEMANTICS §1). coldbrew acks a
job whose timeout may exceed the broker's as soon as its claim is committed, so
the lease (not the delivery) guards it. Here the broker is set to a 5 s timeout
for the channels this test opens, and a 70 s job runs once, with its channel's
other jobs untouched.
"""

from __future__ import annotations

import subprocess

import pytest

from coldbrew.client import Client
from tests.helpers import WorkerFactory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(200)]


def set_consumer_timeout(ms: int) -> None:
    subprocess.run(
        ["rabbitmqctl", "-q", "eval", f"application:set_env(rabbit, consumer_timeout, {ms})."],
        check=True,
        timeout=60,
        capture_output=True,
    )


@pytest.fixture
def short_broker_timeout() -> object:
    set_consumer_timeout(5000)
    yield
    set_consumer_timeout(1_800_000)


async def test_long_job_survives_a_short_consumer_timeout(
    short_broker_timeout: object, start_worker: WorkerFactory, client: Client
) -> None:
    """A 70 s job under a 5 s broker timeout runs exactly once; short jobs beside it finish."""
    worker = await start_worker(broker_consumer_timeout_seconds=5.0)
    long_job = await client.submit("sleep_for", {"seconds": 70.0}, timeout=600)
    short = [await client.submit("echo", {"value": i}, timeout=2) for i in range(20)]
    for job in short:
        assert (await client.wait(job.id, timeout=20)).status == "succeeded"
    done = await client.wait(long_job.id, timeout=120)
    assert done.status == "succeeded"
    assert done.attempt == 1
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
