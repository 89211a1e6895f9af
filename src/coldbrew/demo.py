"""``coldbrew demo``: a self-contained tour on the local broker and database.

It migrates a demo namespace, starts a worker in this process with the example
app, submits a handful of jobs (coroutines with progress, CPU-bound transcodes
in the process pool, a flaky job that retries, a job that fails permanently,
a new tenant, a garbage message) and prints every status change until all of
them are finished. Then it shows the stats and how to go on by hand.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aio_pika

from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.migrate import drop_namespace, migrate
from coldbrew.model import JobRecord
from coldbrew.settings import Settings
from coldbrew.topology import Topology
from coldbrew.worker import Worker

DEMO_APP = "coldbrew.examples.demo:app"
DEMO_NAMESPACE = "coldbrew_demo"


async def run_demo(settings: Settings, *, keep: bool, namespace_given: bool) -> int:
    """Run the tour; return the exit code (0 when every job ended as expected)."""
    namespace = settings.namespace if namespace_given else DEMO_NAMESPACE
    settings = settings.model_copy(
        update={
            "namespace": namespace,
            "metrics_port": 0,
            "processes": min(settings.processes, 2),
            "retry_base_seconds": 0.5,
            "relay_interval_seconds": 0.2,
            "progress_flush_seconds": 0.2,
        }
    )
    print(
        f"coldbrew demo · RabbitMQ {settings.safe_amqp_url()} · "
        f"PostgreSQL {settings.safe_database_url()} · namespace {namespace!r}"
    )
    await migrate(settings.database_url, namespace)
    worker = Worker(load_app(DEMO_APP), settings)
    worker_task = asyncio.create_task(worker.run(), name="demo-worker")
    try:
        await worker.wait_ready(worker_task)
        print(
            f"worker ready: lanes {worker.lanes}, {settings.concurrency} coroutine slots, "
            f"{settings.processes} processes, metrics on :{worker.metrics_port}/metrics\n"
        )
        async with Client.connect(settings, app=worker.app) as client:
            jobs = await _submit_all(client, settings)
            ok = await _watch(client, jobs)
            await _summary(client)
    finally:
        worker.stop()
        await worker_task
        if not keep:
            await _cleanup(settings)
    return 0 if ok else 1


async def _submit_all(client: Client, settings: Settings) -> dict[str, str]:
    """Submit the tour's jobs; return job id → the outcome we expect."""
    expected: dict[str, str] = {}
    for tenant, video in (("acme", "cat-video"), ("acme", "dog-video"), ("globex", "launch")):
        job = await client.submit("thumbnail", {"video_id": video}, tenant=tenant)
        expected[job.id] = "succeeded"
    for video in ("keynote", "trailer"):
        job = await client.submit(
            "transcode",
            {"video_id": video, "resolutions": ["480p", "720p", "1080p"]},
            tenant="globex",
            priority=5,
        )
        expected[job.id] = "succeeded"
    notify = await client.submit(
        "notify",
        {"user": "ada", "message": "your video is ready"},
        tenant="initech",
        idempotency_key="notify-ada-1",
    )
    again = await client.submit(
        "notify",
        {"user": "ada", "message": "your video is ready"},
        tenant="initech",
        idempotency_key="notify-ada-1",
    )
    print(
        f"idempotency: the second submit with key 'notify-ada-1' returned the same job "
        f"({again.id == notify.id})"
    )
    expected[notify.id] = "succeeded"
    big = await client.submit("ingest", {"size_bytes": 5_000_000_000}, tenant="acme")
    expected[big.id] = "failed"
    await _publish_garbage(settings)
    print(f"submitted {len(expected)} jobs and 1 garbage message\n")
    return expected


async def _publish_garbage(settings: Settings) -> None:
    """A message that breaks the contract: it lands in the dead letters, nothing stalls."""
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(Topology(settings.namespace).jobs_exchange)
        await exchange.publish(
            aio_pika.Message(b"{not json", message_id="garbage-1"), routing_key="default.acme"
        )
    finally:
        await connection.close()


def _describe(job: JobRecord) -> str:
    progress = "" if job.progress is None else f"{job.progress:4.0%}"
    detail = job.progress_message or ""
    if job.status in ("retrying", "failed", "dead") and job.error_message:
        detail = f"{job.error_kind}: {job.error_message}"
    if job.status == "succeeded":
        detail = json.dumps(job.result)[:70]
    return (
        f"  {job.type:<10} {job.tenant:<8} attempt {job.attempt}  "
        f"{job.status.value:<9} {progress:>4}  {detail}"
    )


async def _watch(client: Client, expected: dict[str, str], timeout: float = 120) -> bool:
    """Print each status or progress change until every job is finished."""
    seen: dict[str, tuple[Any, ...]] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        records = [await client.get(job_id) for job_id in expected]
        for job in records:
            key = (job.status, job.attempt, job.progress, job.progress_message)
            if seen.get(job.id) != key:
                seen[job.id] = key
                print(_describe(job))
        if all(job.status.terminal for job in records):
            wrong = [j for j in records if j.status != expected[j.id]]
            print(
                f"\nall {len(records)} jobs finished"
                + ("" if not wrong else f"; unexpected: {[(j.type, j.status) for j in wrong]}")
            )
            return not wrong
        await asyncio.sleep(0.2)
    print("\nthe demo timed out waiting for its jobs")
    return False


async def _summary(client: Client) -> None:
    print("\ncoldbrew stats (per lane and tenant):")
    for row in await client.store.stats.queue_stats():
        print(
            f"  {row.queue:<8} {row.tenant:<8} running {row.running}  waiting "
            f"{row.queued + row.retrying}  failed {row.failed}  dead {row.dead}"
        )
    for reason, count in (await client.store.dead.rejected_counts()).items():
        print(
            f"  dead letters: {count} rejected message(s), reason {reason!r} "
            "(kept with their original bytes; copies on the <namespace>.dead queue)"
        )
    print(
        "\nTry it by hand (in two terminals):\n"
        "  .venv/bin/coldbrew migrate\n"
        f"  .venv/bin/coldbrew worker {DEMO_APP}\n"
        '  .venv/bin/coldbrew submit thumbnail --args \'{"video_id": "v1"}\' '
        "--tenant acme --wait"
    )


async def _cleanup(settings: Settings) -> None:
    await drop_namespace(settings.database_url, settings.namespace)
    topo = Topology(settings.namespace)
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await connection.channel()
        for lane in ("default", "slow"):
            for tenant in ("default", "acme", "globex", "initech"):
                await channel.queue_delete(topo.job_queue(lane, tenant))
        for queue in (topo.unrouted_queue, topo.dead_queue):
            await channel.queue_delete(queue)
        for exchange in (topo.jobs_exchange, topo.unrouted_exchange, topo.dead_exchange):
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()
