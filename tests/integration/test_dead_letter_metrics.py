"""Dead letters, counted apart: rejected messages and dead jobs; the old counter counts both.

Also the worker's ``coldbrew_build_info`` on its own /metrics page.
"""

from __future__ import annotations

import platform

import aio_pika
import httpx
from prometheus_client.parser import text_string_to_metric_families

from coldbrew.client import Client
from coldbrew.metrics import coldbrew_version
from coldbrew.settings import Settings
from tests.helpers import WorkerFactory, metric, publish_raw, wait_until


async def test_rejected_message_and_dead_job_each_count_apart(
    start_worker: WorkerFactory,
    client: Client,
    amqp: aio_pika.abc.AbstractChannel,
    settings: Settings,
) -> None:
    """A message that breaks the contract counts as rejected, a job out of attempts as dead;
    each also counts in the deprecated coldbrew_dead_letters_total, as before."""
    worker = await start_worker()
    await publish_raw(amqp, settings.namespace, b"[1, 2, 3]", "default.default")

    async def rejected() -> bool:
        return metric(worker, "coldbrew_rejected_messages_total", reason="not_object") == 1

    await wait_until(rejected, timeout=20)
    assert metric(worker, "coldbrew_dead_letters_total", reason="not_object") == 1
    assert metric(worker, "coldbrew_jobs_dead_total", reason="not_object") == 0

    job = await client.submit("always_fails", {})
    assert (await client.wait(job.id, timeout=20)).status == "dead"

    async def dead() -> bool:
        return metric(worker, "coldbrew_jobs_dead_total", reason="max_attempts") == 1

    await wait_until(dead, timeout=20)
    assert metric(worker, "coldbrew_dead_letters_total", reason="max_attempts") == 1
    assert metric(worker, "coldbrew_rejected_messages_total", reason="max_attempts") == 0
    assert metric(worker, "coldbrew_rejected_messages_total", reason="not_object") == 1


async def test_worker_metrics_page_carries_build_info(start_worker: WorkerFactory) -> None:
    """coldbrew_build_info{version,python} 1 on the worker's /metrics."""
    worker = await start_worker()
    assert worker.metrics_port is not None
    async with httpx.AsyncClient(timeout=5) as http:
        page = (await http.get(f"http://127.0.0.1:{worker.metrics_port}/metrics")).text
    info = [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == "coldbrew_build_info"
    ]
    assert info == [({"version": coldbrew_version(), "python": platform.python_version()}, 1.0)]
    assert coldbrew_version() != "unknown"
