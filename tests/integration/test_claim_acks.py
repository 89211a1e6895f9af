"""COLDBREW_CLAIM_COMMIT=async on the real services: a delivery is acked only once its claim
is durable, and a claim a PostgreSQL restart lost makes the job run again."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from coldbrew.client import Client
from coldbrew.settings import Settings
from coldbrew.topology import Topology
from tests.helpers import DATABASE_URL, WorkerFactory, metric, wait_until


def unacked(queue: str) -> int:
    """The broker's own count of deliveries not yet acked on ``queue`` (rabbitmqctl)."""
    out = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "name", "messages_unacknowledged"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == queue:
            return int(fields[1])
    raise AssertionError(f"queue {queue} not listed: {out[-500:]}")


async def status_is(client: Client, job_id: str, status: str) -> bool:
    return (await client.get(job_id)).status == status


async def running_sleeper(client: Client, settings: Settings, seconds: float) -> tuple[str, Any]:
    """Submit a ``sleep_for`` job on the default queue and wait until it runs: (queue, job)."""
    queue = Topology(settings.namespace).job_queue("default", "default")
    job = await client.submit("sleep_for", {"seconds": seconds})
    await wait_until(lambda: status_is(client, job.id, "running"))
    return queue, job


async def all_acked(queue: str, timeout: float) -> None:
    """Wait until the broker counts no unacked delivery on ``queue``."""
    await wait_until(lambda: asyncio.to_thread(lambda: unacked(queue) == 0), timeout=timeout)


async def test_a_long_job_is_acked_by_the_next_completion_not_before(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """The first job runs at once, its delivery unacked; another job's completion (a
    synchronous commit sent after the first claim) makes the claim durable: then the ack."""
    worker = await start_worker(claim_commit="async", claim_barrier_seconds=60.0)
    queue, long = await running_sleeper(client, settings, 8)
    assert await asyncio.to_thread(unacked, queue) == 1
    short = await client.submit("echo", {"value": 1})
    assert (await client.wait(short.id, timeout=20)).status == "succeeded"
    await all_acked(queue, timeout=10)
    assert (await client.get(long.id)).status == "running"
    assert metric(worker, "coldbrew_claim_acks_total", how="covered") == 2
    assert metric(worker, "coldbrew_claim_acks_total", how="barrier") == 0


async def test_without_a_completion_a_barrier_acks_after_its_delay(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    worker = await start_worker(claim_commit="async", claim_barrier_seconds=2.0)
    queue, job = await running_sleeper(client, settings, 8)
    assert await asyncio.to_thread(unacked, queue) == 1
    await all_acked(queue, timeout=10)
    assert (await client.get(job.id)).status == "running"
    assert metric(worker, "coldbrew_claim_acks_total", how="barrier") == 1


async def test_sync_claims_are_acked_at_the_claim(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    worker = await start_worker(claim_commit="sync", claim_barrier_seconds=60.0)
    queue, _ = await running_sleeper(client, settings, 6)
    await all_acked(queue, timeout=5)
    assert worker.parts.runner.claim_acks is None


async def test_a_claim_lost_in_a_restart_is_requeued_and_the_job_runs_again(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """Simulated: the barrier reports another server start (PostgreSQL restarted) and the row
    is back where it was before the claim (the claim's WAL never reached the disk). The job,
    already running, is stopped and its delivery requeued; it runs again and succeeds once."""
    worker = await start_worker(
        claim_commit="async", claim_barrier_seconds=1.0, heartbeat_seconds=1.9
    )
    store = worker.parts.store.claims
    real_barrier = store.durability_barrier

    async def after_a_restart() -> tuple[datetime, int]:
        server, seq = await real_barrier()
        return server + timedelta(seconds=1), seq

    store.durability_barrier = after_a_restart  # type: ignore[method-assign]
    job = await client.submit("side_effect", {"seconds": 3})
    await wait_until(lambda: status_is(client, job.id, "running"), interval=0.01)
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": settings.namespace})
    try:
        reverted = await conn.execute(
            "UPDATE jobs SET status = 'queued', attempt = 0, worker_id = NULL,"
            " lease_expires_at = NULL, started_at = NULL WHERE id = $1 AND attempt = 1",
            job.id,
        )
    finally:
        await conn.close()
    assert reverted == "UPDATE 1"
    done = await client.wait(job.id, timeout=30)
    assert done.status == "succeeded"
    assert done.attempt == 1
    assert done.result is True  # its once-guarded effect ran in the second run, once
    assert metric(worker, "coldbrew_claim_acks_total", how="lost") == 1
    assert metric(worker, "coldbrew_claim_acks_total", how="verified") == 1
    assert metric(worker, "coldbrew_jobs_started_total", queue="default", type="side_effect") == 2
    assert metric(worker, "coldbrew_redeliveries_total", cause="broker_flag") == 1
