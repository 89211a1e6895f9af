"""Messages the broker loses come back from PostgreSQL, and a long backlog is never republished.

Real `coldbrew worker` processes with a short `COLDBREW_RECONCILE_SECONDS`.
The harm is done to this test's own namespaced queues only (purge, delete);
no service is stopped or restarted. Each scenario prints its figures.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest

from coldbrew.client import Client
from coldbrew.model import JobFields
from coldbrew.settings import Settings
from coldbrew.store import ClaimRequest, JobStore
from coldbrew.topology import Topology
from coldbrew.transport import Broker
from tests.faults.harness import is_ready
from tests.helpers import AMQP_URL, DATABASE_URL, free_port, make_settings, worker_env

REPO = Path(__file__).resolve().parents[2]
APP = "tests.faults.lost_apps:app"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@dataclass
class Proc:
    process: subprocess.Popen[bytes]
    port: int
    log: Path


class Workers:
    """`coldbrew worker` subprocesses of one namespace, stopped at the end of the test."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[Proc] = []

    def start(self, settings: Settings, **extra: str) -> Proc:
        port = free_port()
        env = worker_env(settings, COLDBREW_METRICS_PORT=str(port), **extra)
        env["PYTHONPATH"] = str(REPO)
        log = self.logs / f"worker-{len(self.procs)}-{port}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(  # noqa: S603 - our own CLI
                [sys.executable, "-m", "coldbrew", "worker", APP],
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        proc = Proc(process, port, log)
        self.procs.append(proc)
        return proc

    async def ready(self, *procs: Proc, timeout: float = 30.0) -> None:
        for proc in procs:
            deadline = time.monotonic() + timeout
            while not await asyncio.to_thread(is_ready, proc.port):
                if proc.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"worker not ready: {proc.log.read_text()[-3000:]}")
                await asyncio.sleep(0.1)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of one sample over every worker still running."""
        return sum(sample(scrape(p.port), name, **labels) for p in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.process.poll() is None:
                proc.process.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.process.kill()
                proc.process.wait(timeout=10)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:  # noqa: S310
        return str(response.read().decode())


def sample(text: str, name: str, **labels: str) -> float:
    """One sample's value in a Prometheus exposition (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name) + (r"\{" + re.escape(wanted) + r"\}" if labels else "") + r" (\S+)"
    match = re.search(r"^" + pattern + r"$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    fleet = Workers(tmp_path)
    yield fleet
    fleet.stop()


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": settings.namespace})
    yield conn
    await conn.close()


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as entered:
        yield entered


@pytest.fixture
async def amqp_connection() -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    connection = await aio_pika.connect(AMQP_URL)
    yield connection
    await connection.close()


@pytest.fixture
async def channel(
    amqp_connection: aio_pika.abc.AbstractConnection,
) -> aio_pika.abc.AbstractChannel:
    return await amqp_connection.channel(publisher_confirms=True)


async def ready_count(channel: aio_pika.abc.AbstractChannel, name: str) -> tuple[int, int]:
    declared = await channel.declare_queue(name, passive=True)
    result = declared.declaration_result
    return result.message_count or 0, result.consumer_count or 0


async def statuses(db: asyncpg.Connection, ids: list[str]) -> dict[str, int]:
    rows = await db.fetch(
        "SELECT status::text AS status, count(*) AS n FROM jobs WHERE id = ANY($1) GROUP BY 1", ids
    )
    return {row["status"]: row["n"] for row in rows}


async def wait_terminal(db: asyncpg.Connection, ids: list[str], timeout: float) -> float:
    """Seconds until every job is terminal; fails with the stragglers after ``timeout``."""
    started = time.monotonic()
    while True:
        counts = await statuses(db, ids)
        if not any(counts.get(s) for s in ("queued", "running", "retrying")):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"after {timeout} s: {counts}")
        await asyncio.sleep(0.2)


def reconciling(settings: Settings, seconds: float, **overrides: Any) -> Settings:
    return make_settings(settings.namespace, reconcile_seconds=seconds, **overrides)


async def publish_backlog(
    settings: Settings, db: asyncpg.Connection, priorities: list[int], seconds: float = 0.003
) -> list[str]:
    """Confirmed `nap` jobs, one per priority given, submitted as `Client.submit` does (row
    with a publish mark, publish with a confirm, mark cleared), in bulk."""
    ids = [f"backlog-{i}" for i in range(len(priorities))]
    await db.execute(
        "INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, publish_after)"
        " SELECT id, 'nap', 'default', 'default', jsonb_build_object('seconds', $3::float8),"
        "        priority, 5, now() + interval '1 hour'"
        " FROM unnest($1::text[], $2::int2[]) AS u(id, priority)",
        ids,
        priorities,
        seconds,
    )
    broker = Broker(AMQP_URL, Topology(settings.namespace))
    await broker.connect()
    try:
        await broker.declare_job_queue("default", "default")
        confirmed = await broker.publish_jobs(
            [
                JobFields(i, "nap", "default", "default", {"seconds": seconds}, p, None, None, None)
                for i, p in zip(ids, priorities, strict=True)
            ],
            window=512,
        )
    finally:
        await broker.close()
    assert all(confirmed)
    await db.execute(  # what Client.submit does once the broker confirmed (mark_published)
        "UPDATE jobs SET publish_after = NULL, published_at = now() WHERE id = ANY($1)", ids
    )
    return ids


async def test_a_purged_queue_is_published_again(
    settings: Settings, workers: Workers, db: asyncpg.Connection, channel: Any
) -> None:
    """200 confirmed submissions, the tenant queue purged, then workers: every job succeeds
    within the reconcile bound, each republished once."""
    reconcile = 3.0
    fleet_settings = reconciling(settings, reconcile)
    queue = Topology(settings.namespace).job_queue("default", "default")
    async with Client.connect(fleet_settings) as client:
        assert client.broker is not None
        await client.broker.declare_job_queue("default", "default")
        ids = [(await client.submit("echo", {"value": i})).id for i in range(200)]
    marked = await db.fetchval(
        "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'queued'"
        " AND publish_after IS NULL AND published_at IS NOT NULL",
        ids,
    )
    assert marked == 200, "every submission's publish was confirmed"
    assert (await ready_count(channel, queue))[0] == 200
    await (await channel.declare_queue(queue, passive=True)).purge()
    assert (await ready_count(channel, queue))[0] == 0

    procs = [workers.start(fleet_settings), workers.start(fleet_settings)]
    await workers.ready(*procs)
    took = await wait_terminal(db, ids, timeout=reconcile + 20)
    counts = await statuses(db, ids)
    republished = {
        rule: workers.metric("coldbrew_reconcile_republished_total", rule=rule)
        for rule in ("count", "idle")
    }
    duplicates = workers.metric("coldbrew_duplicate_deliveries_total", queue="default")
    print(
        f"\npurge: 200 lost; all terminal {took:.1f} s after both workers were ready "
        f"(COLDBREW_RECONCILE_SECONDS={reconcile:g}); republished {republished}; "
        f"duplicate deliveries {duplicates:g}; statuses {counts}"
    )
    assert counts == {"succeeded": 200}
    assert took <= reconcile + 5, "the lost jobs ran again within about the reconcile bound"
    assert sum(republished.values()) == 200, "each lost job was republished exactly once"


def started(proc: Proc) -> float:
    """Jobs one worker has started (the ``nap`` jobs of the default lane)."""
    return sample(scrape(proc.port), "coldbrew_jobs_started_total", queue="default", type="nap")


async def test_b_a_queue_deleted_under_running_workers(
    settings: Settings,
    workers: Workers,
    db: asyncpg.Connection,
    amqp_connection: aio_pika.abc.AbstractConnection,
    channel: Any,
    stack: AsyncExitStack,
) -> None:
    """The tenant queue deleted while two workers run jobs and hold a backlog, and a producer
    keeps submitting (so the new queue is never empty): it is declared again at once, and
    every job, the lost ones included, succeeds."""
    reconcile = 3.0
    fleet_settings = reconciling(settings, reconcile, concurrency=4)
    queue = Topology(settings.namespace).job_queue("default", "default")
    procs = [workers.start(fleet_settings), workers.start(fleet_settings)]
    await workers.ready(*procs)
    client = await stack.enter_async_context(Client.connect(fleet_settings))
    ids: list[str] = []

    async def submit(count: int, batches: int, pause: float) -> None:
        for _ in range(batches):
            batch = [client.submit("nap", {"seconds": 0.2}) for _ in range(count)]
            ids.extend(job.id for job in await asyncio.gather(*batch))
            await asyncio.sleep(pause)

    await submit(50, 8, 0)
    ready, consumers = await ready_count(channel, queue)
    running = (await statuses(db, ids)).get("running", 0)
    # a saturated worker's consumer is paused by the hold (consumer_hold.py), so the broker
    # counts zero, one or two consumers at any instant; that both workers consume the queue
    # again after the delete is asserted below (each starts jobs after it)
    assert ready > 50, (ready, consumers)

    started_before = [started(proc) for proc in procs]
    deleted = time.monotonic()
    await channel.queue_delete(queue)
    producer = asyncio.create_task(submit(40, 8, 0.5))
    back = None
    while time.monotonic() - deleted < 15:
        check = await amqp_connection.channel()  # a 404 closes the channel it came on
        try:
            if (await ready_count(check, queue))[1] >= 1:
                back = time.monotonic() - deleted
                break
        except aio_pika.exceptions.ChannelNotFoundEntity:
            pass
        finally:
            if not check.is_closed:
                await check.close()
        await asyncio.sleep(0.05)
    assert back is not None, "the deleted queue came back, consumed"
    # declared again at once, by whichever comes first: the broker's cancel of a consuming
    # worker, a paused one's probe, or the unrouted path provisioning it for the producer's
    # next job (when both workers were paused at the delete); the back loop above saw it
    # declared and consumed, and below each worker starts jobs from it

    await producer
    took = await wait_terminal(db, ids, timeout=reconcile + 40)
    counts = await statuses(db, ids)
    republished = {
        rule: workers.metric("coldbrew_reconcile_republished_total", rule=rule)
        for rule in ("count", "idle")
    }
    duplicates = workers.metric("coldbrew_duplicate_deliveries_total", queue="default")
    print(
        f"\ndelete: {ready} ready lost, {running} running, {len(ids)} jobs in all; queue back "
        f"consumed again {back:.2f} s after the delete; all terminal {took:.1f} s after "
        f"it; republished "
        f"{republished}; duplicate deliveries {duplicates:g}; statuses {counts}"
    )
    assert counts == {"succeeded": len(ids)}
    assert all(
        started(proc) > before for proc, before in zip(procs, started_before, strict=True)
    ), "both workers consumed the queue declared again"
    assert sum(republished.values()) >= ready * 0.9, "what the deleted queue held ran again"
    assert duplicates <= 2 * fleet_settings.effective_prefetch, "wrong picks stay bounded"


async def test_b2_a_deleted_unrouted_queue_is_bound_again(
    settings: Settings, workers: Workers, channel: Any, stack: AsyncExitStack
) -> None:
    """`<ns>.unrouted` deleted under a worker (reconciliation too slow to help): it is bound
    again at once, so a new tenant's first job still reaches a worker."""
    fleet_settings = reconciling(settings, 600.0)
    proc = workers.start(fleet_settings)
    await workers.ready(proc)
    # connected before the delete: a connecting client declares the topology itself
    client = await stack.enter_async_context(Client.connect(fleet_settings))
    deleted = time.monotonic()
    await channel.queue_delete(Topology(settings.namespace).unrouted_queue)
    while workers.metric("coldbrew_queues_redeclared_total", cause="cancelled") < 1:
        assert time.monotonic() - deleted < 10, "the topology was declared again"
        await asyncio.sleep(0.05)
    back = time.monotonic() - deleted
    await asyncio.sleep(1.0)  # aio-pika restores the consumer (its reconnect interval)
    job = await client.submit("echo", {"value": 1}, tenant="brand-new")
    done = await client.wait(job.id, timeout=15)
    print(f"\nunrouted: bound again {back:.2f} s after the delete; new tenant's job {done.status}")
    assert done.status == "succeeded"


async def test_c_a_slow_backlog_is_never_republished(
    settings: Settings, workers: Workers, db: asyncpg.Connection
) -> None:
    """10,000 confirmed jobs drained slowly by two workers of concurrency 1 (the tightest
    prefetch bound), looked at every 0.5 s for 15 s: zero republishes.

    (It was 20,000 jobs watched 30 s: the backlog is still thousands long at the end
    either way, and 30 looks at it prove what 60 did in half the time.)"""
    reconcile = 1.5
    fleet_settings = reconciling(settings, reconcile, concurrency=1)
    count = 10_000
    published = time.monotonic()
    ids = await publish_backlog(settings, db, [0] * count)
    publish_seconds = time.monotonic() - published

    procs = [workers.start(fleet_settings), workers.start(fleet_settings)]
    await workers.ready(*procs)
    watched = 15.0
    await asyncio.sleep(watched)
    republished = sum(
        workers.metric("coldbrew_reconcile_republished_total", rule=rule)
        for rule in ("count", "idle")
    )
    passes = workers.metric("coldbrew_reconcile_passes_total", result="reconciled")
    skipped = workers.metric("coldbrew_reconcile_passes_total", result="skipped")
    duplicates = workers.metric("coldbrew_duplicate_deliveries_total", queue="default")
    counts = await statuses(db, ids)
    marked = await db.fetchval(
        "SELECT count(*) FROM jobs WHERE id = ANY($1) AND publish_after IS NOT NULL", ids
    )
    done = counts.get("succeeded", 0)
    print(
        f"\nbacklog: {count} published in {publish_seconds:.1f} s; {done} drained in "
        f"{watched:g} s ({done / watched:.0f}/s) by 2 workers of concurrency 1; "
        f"{passes:g} reconcile passes (+{skipped:g} skipped: another worker's); republished "
        f"{republished:g}; duplicate deliveries {duplicates:g}; rows made due again {marked}"
    )
    assert passes >= watched / (reconcile / 3) * 0.6, "the reconciler kept looking"
    assert count - done > 1000, "the backlog was still long at the end"
    assert republished == 0
    assert marked == 0
    assert duplicates == 0


async def test_c3_aging_sweeps_of_a_priority_backlog_are_not_losses(
    settings: Settings, workers: Workers, db: asyncpg.Connection
) -> None:
    """A priority-9 backlog in front of priority-0 jobs, swept every second by two workers'
    aging sweeps (each takes up to 5,000 ready messages for a moment), looked at every
    0.5 s: zero republishes."""
    fleet_settings = reconciling(
        settings, 1.5, concurrency=2, aging_seconds=2.0, aging_sweep_limit=5000
    )
    ids = await publish_backlog(settings, db, [9] * 6000 + [0] * 1000)
    procs = [workers.start(fleet_settings), workers.start(fleet_settings)]
    await workers.ready(*procs)
    watched = 15.0
    await asyncio.sleep(watched)
    republished = sum(
        workers.metric("coldbrew_reconcile_republished_total", rule=rule)
        for rule in ("count", "idle")
    )
    sweeps = sum(
        workers.metric("coldbrew_aging_sweeps_total", result=result)
        for result in ("kept", "none_held_back", "empty")
    )
    swept = workers.metric("coldbrew_aging_swept_total", fate="returned")
    passes = workers.metric("coldbrew_reconcile_passes_total", result="reconciled")
    done = (await statuses(db, ids)).get("succeeded", 0)
    print(
        f"\nsweeps: {sweeps:g} aging sweeps returned {swept:g} messages while {passes:g} "
        f"reconcile passes looked; {done} of {len(ids)} ran in {watched:g} s; republished "
        f"{republished:g}"
    )
    assert sweeps >= 5 and swept >= 10_000, "the sweeps really took messages from the queue"
    assert republished == 0


async def test_c4_deliveries_held_by_saturated_workers_are_not_losses(
    settings: Settings, workers: Workers, db: asyncpg.Connection
) -> None:
    """Long jobs: every slot busy, the queue empty, deliveries held unclaimed for seconds in
    the workers' schedulers across many looks: the holding reports keep them from being
    counted lost (zero republishes)."""
    fleet_settings = reconciling(settings, 1.5, concurrency=2)
    procs = [workers.start(fleet_settings), workers.start(fleet_settings)]
    await workers.ready(*procs)
    async with Client.connect(fleet_settings) as client:
        jobs = [client.submit("nap", {"seconds": 2.5}) for _ in range(20)]
        ids = [job.id for job in await asyncio.gather(*jobs)]
    took = await wait_terminal(db, ids, timeout=60)
    republished = sum(
        workers.metric("coldbrew_reconcile_republished_total", rule=rule)
        for rule in ("count", "idle")
    )
    passes = workers.metric("coldbrew_reconcile_passes_total", result="reconciled")
    print(
        f"\nheld: 20 jobs of 2.5 s on 4 slots, up to 8 held unclaimed, done in {took:.1f} s; "
        f"{passes:g} passes; republished {republished:g}"
    )
    assert (await statuses(db, ids)) == {"succeeded": 20}
    assert republished == 0


async def test_c2_a_drained_tail_is_not_republished(
    settings: Settings, workers: Workers, db: asyncpg.Connection
) -> None:
    """A backlog drained to its end, looked at every 0.5 s, the last held deliveries
    included: zero republishes."""
    fleet_settings = reconciling(settings, 1.5, concurrency=2)
    procs = [workers.start(fleet_settings), workers.start(fleet_settings)]
    await workers.ready(*procs)
    started = time.monotonic()
    async with Client.connect(fleet_settings) as client:
        ids = []
        for _ in range(6):
            batch = [client.submit("nap", {"seconds": 0.03}) for _ in range(100)]
            ids += [job.id for job in await asyncio.gather(*batch)]
    await wait_terminal(db, ids, timeout=60)
    took = time.monotonic() - started
    await asyncio.sleep(2.0)  # three more looks at the empty queue
    republished = sum(
        workers.metric("coldbrew_reconcile_republished_total", rule=rule)
        for rule in ("count", "idle")
    )
    print(f"\ntail: 600 jobs submitted and drained in {took:.1f} s; republished {republished:g}")
    assert (await statuses(db, ids)) == {"succeeded": 600}
    assert republished == 0


async def test_d_a_rejected_message_fails_its_waiting_row(
    settings: Settings, workers: Workers, db: asyncpg.Connection, channel: Any
) -> None:
    """A message the worker rejects (a header it refuses) whose job has a waiting row: the
    row ends failed with the reason; a finished job's rejected duplicate changes nothing."""
    fleet_settings = reconciling(settings, 600.0)
    proc = workers.start(fleet_settings)
    await workers.ready(proc)
    exchange = await channel.get_exchange(Topology(settings.namespace).jobs_exchange)

    async def publish_refused(job_id: str) -> None:
        await exchange.publish(
            aio_pika.Message(
                json.dumps({"type": "echo", "args": {}}).encode(),
                message_id=job_id,
                headers={"x-timeout-seconds": -1},
            ),
            routing_key="default.default",
        )

    async with JobStore.open(DATABASE_URL, settings.namespace, pool_size=2) as store:
        request = ClaimRequest("refused-1", "echo", "default", "default", {}, 0, 3, None, None)
        _, mark = await store.jobs.insert_job(request, relay_grace=3600)
        assert mark is not None
        await store.outbox.mark_published([(request.id, mark)])  # as if its publish was confirmed
    async with Client.connect(fleet_settings) as client:
        done = await client.wait((await client.submit("echo", {"value": 1})).id, timeout=20)
    assert done.status == "succeeded"

    await publish_refused("refused-1")
    await publish_refused(done.id)
    deadline = time.monotonic() + 15
    while await db.fetchval("SELECT count(*) FROM rejected_messages") < 2:
        assert time.monotonic() < deadline, "both messages were rejected"
        await asyncio.sleep(0.1)
    refused = await db.fetchrow("SELECT * FROM jobs WHERE id = 'refused-1'")
    finished = await db.fetchrow("SELECT * FROM jobs WHERE id = $1", done.id)
    print(
        f"\nrejected: row {refused['status']} ({refused['error_kind']}: "
        f"{refused['error_message']}); the finished job's duplicate left it {finished['status']}"
    )
    assert refused["status"] == "failed"
    assert refused["error_kind"] == "invalid_header"
    assert "x-timeout-seconds" in refused["error_message"]
    assert refused["finished_at"] is not None and refused["publish_after"] is None
    assert finished["status"] == "succeeded" and finished["error_kind"] is None
    assert workers.metric("coldbrew_rejected_jobs_failed_total", reason="invalid_header") == 1


async def test_e_a_lane_nobody_serves_is_visible(
    settings: Settings, workers: Workers, db: asyncpg.Connection
) -> None:
    """Jobs for a lane no running worker serves: `coldbrew_lane_consumers` says 0 for it and
    `coldbrew stats` warns; they are not republished (they are in their queue)."""
    fleet_settings = reconciling(settings, 1.5)
    proc = workers.start(fleet_settings, COLDBREW_QUEUES="default")
    await workers.ready(proc)
    async with Client.connect(fleet_settings) as client:
        ids = [(await client.submit("echo", queue="orphan")).id for _ in range(5)]
    deadline = time.monotonic() + 15
    text = ""
    while time.monotonic() < deadline:
        text = scrape(proc.port)
        if 'coldbrew_lane_consumers{lane="orphan"} 0.0' in text:
            break
        await asyncio.sleep(0.2)
    assert 'coldbrew_lane_consumers{lane="orphan"} 0.0' in text, text[-2000:]
    assert 'coldbrew_lane_consumers{lane="default"} 1.0' in text
    env = worker_env(fleet_settings)
    env["PYTHONPATH"] = str(REPO)
    stats = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "coldbrew", "stats", "--sample", "0"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    print(f"\nunserved lane: coldbrew stats says\n{stats.stdout}")
    assert stats.returncode == 0, stats.stderr
    assert "lane 'orphan' has 5 waiting jobs and no consumer" in stats.stdout
    await asyncio.sleep(1.5)  # passes that see the orphan queue full and unconsumed
    assert workers.metric("coldbrew_reconcile_republished_total", rule="count") == 0
    assert workers.metric("coldbrew_reconcile_republished_total", rule="idle") == 0
    assert (await statuses(db, ids)) == {"queued": 5}
