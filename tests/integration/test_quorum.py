"""Quorum mode (COLDBREW_QUEUE_TYPE=quorum) on the machine's real RabbitMQ node.

RabbitMQ 3.10's quorum queues ignore message priorities, so each (lane,
tenant) has a queue per priority band (topology.py). These tests check the
declarations, that a high band's job starts before a low band's backlog, that
raw producers' messages run (with and without a band in the key), that the
reconciler still finds a lost message, and the switch both ways with jobs
waiting (queueswitch.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import aiormq
import asyncpg
import pytest

from coldbrew.client import Client
from coldbrew.queueswitch import SourceInUse, switch_queues
from coldbrew.settings import Settings
from coldbrew.store import JobStore
from coldbrew.topology import DELIVERY_LIMIT, Topology
from coldbrew.transport import Broker
from coldbrew.worker import Worker
from tests.helpers import (
    AMQP_URL,
    DATABASE_URL,
    make_settings,
    publish_raw,
    status_is,
    wait_until,
)


def body(job_type: str, **args: object) -> bytes:
    return json.dumps({"type": job_type, "args": args}).encode()


@pytest.fixture
def quorum(settings: Settings) -> Settings:
    return make_settings(settings.namespace, queue_type="quorum")


@pytest.fixture
async def qclient(quorum: Settings, test_app: Any) -> AsyncIterator[Client]:
    async with Client.connect(quorum, app=test_app) as connected:
        yield connected


async def _run(settings: Settings, app: Any, **overrides: Any) -> tuple[Worker, asyncio.Task[None]]:
    worker = Worker(app, make_settings(settings.namespace, **overrides))
    task = asyncio.create_task(worker.run())
    await worker.wait_ready(task)
    return worker, task


async def _stop(worker: Worker, task: asyncio.Task[None]) -> None:
    worker.stop()
    await asyncio.wait_for(task, timeout=30)


async def _ready(name: str) -> int | None:
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return None
        return queue.declaration_result.message_count or 0
    finally:
        await connection.close()


async def test_quorum_queues_have_bands_a_delivery_limit_and_a_dead_letter_target(
    quorum: Settings, test_app: Any
) -> None:
    """A quorum worker declares quorum band queues with x-delivery-limit, at-least-once
    dead-lettering to <ns>.dlx (which needs reject-publish), and quorum unrouted/dead."""
    topo = quorum.topology()
    worker, task = await _run(quorum, test_app, queue_type="quorum")
    try:
        names = topo.job_queues("default", "default")
        assert [n.rsplit(".", 1)[1] for n in names] == ["p7-9", "p4-6", "p0-3"]
        connection = await aio_pika.connect(AMQP_URL)
        try:
            for name, arguments in [
                *((n, topo.job_queue_arguments()) for n in names),
                (topo.unrouted_queue, topo.unrouted_queue_arguments()),
                (topo.dead_queue, topo.dead_queue_arguments()),
            ]:
                channel = await connection.channel()
                await channel.declare_queue(name, durable=True, arguments=arguments)  # same: ok
                assert arguments["x-queue-type"] == "quorum"
                assert "x-max-priority" not in arguments
                without_limit = {k: v for k, v in arguments.items() if k != "x-delivery-limit"}
                channel = await connection.channel()
                with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
                    await channel.declare_queue(name, durable=True, arguments=without_limit)
            band = topo.job_queue_arguments()
            assert band["x-delivery-limit"] == DELIVERY_LIMIT
            assert band["x-dead-letter-exchange"] == topo.dead_exchange
            assert band["x-dead-letter-strategy"] == "at-least-once"
            assert band["x-overflow"] == "reject-publish"
        finally:
            await connection.close()
        assert worker.parts.broker.consuming == 3 * len(worker.lanes) + 1  # bands, unrouted
    finally:
        await _stop(worker, task)


async def test_a_high_band_job_starts_before_a_waiting_low_band_backlog(
    quorum: Settings, qclient: Client, test_app: Any
) -> None:
    """One slot, busy: low-priority jobs queue, then one priority-9 job; it starts next."""
    worker, task = await _run(quorum, test_app, queue_type="quorum", concurrency=1, prefetch=1)
    try:
        blocker = await qclient.submit("sleep_for", {"seconds": 1.0}, priority=0)
        await wait_until(lambda: status_is(qclient, blocker.id, "running"))
        low = [
            await qclient.submit("sleep_for", {"seconds": 0.05}, priority=p % 4) for p in range(6)
        ]
        high = await qclient.submit("sleep_for", {"seconds": 0.05}, priority=9)
        everything = [blocker.id, high.id, *(job.id for job in low)]

        async def all_done() -> bool:
            return all([await status_is(qclient, i, "succeeded") for i in everything])

        await wait_until(all_done, timeout=30)
        started = {i: (await qclient.get(i)).started_at for i in everything}
        assert all(started[high.id] < started[job.id] for job in low), started
    finally:
        await _stop(worker, task)


async def test_raw_producer_messages_run_in_quorum_mode(
    quorum: Settings, qclient: Client, test_app: Any, amqp: aio_pika.abc.AbstractChannel
) -> None:
    """A new tenant's plain key (through unrouted), a known tenant's plain key (lowest band)
    and a banded key all run; a banded key in classic mode runs too."""
    worker, task = await _run(quorum, test_app, queue_type="quorum")
    try:
        ns = quorum.namespace
        await publish_raw(amqp, ns, body("echo", value=1), "default.acme", message_id="raw-new")
        await wait_until(lambda: status_is(qclient, "raw-new", "succeeded"))
        await publish_raw(amqp, ns, body("echo", value=2), "default.acme", message_id="raw-plain")
        await publish_raw(
            amqp, ns, body("echo", value=3), "default.acme.8", message_id="raw-band", priority=8
        )
        await wait_until(lambda: status_is(qclient, "raw-plain", "succeeded"))
        await wait_until(lambda: status_is(qclient, "raw-band", "succeeded"))
        assert (await qclient.get("raw-band")).priority == 8
    finally:
        await _stop(worker, task)


async def test_a_banded_key_runs_in_classic_mode(
    settings: Settings, client: Client, test_app: Any, amqp: aio_pika.abc.AbstractChannel
) -> None:
    """Classic queues have no banded bindings: the message detours through unrouted and is
    republished with the plain key (once, not in a loop)."""
    worker, task = await _run(settings, test_app)
    try:
        await publish_raw(
            amqp, settings.namespace, body("echo"), "default.beta.5", message_id="c-band"
        )
        await wait_until(lambda: status_is(client, "c-band", "succeeded"))
    finally:
        await _stop(worker, task)


async def test_reconcile_finds_a_message_lost_from_a_band_queue(
    quorum: Settings, qclient: Client, test_app: Any
) -> None:
    """Jobs wait in a band queue with no consumer of their lane; the queue is purged; the
    reconciler (counting all of the tenant's bands) makes them due and they run."""
    topo = quorum.topology()
    # a worker of another lane reconciles; nobody consumes "default" yet
    worker, task = await _run(
        quorum, test_app, queue_type="quorum", queues=["slow"], reconcile_seconds=1.5
    )
    try:
        await qclient.broker.declare_job_queue("default", "default")  # type: ignore[union-attr]
        jobs = [await qclient.submit("echo", {}, priority=8) for _ in range(3)]
        high = topo.band_queue("default", "default", 2)
        await wait_until(lambda: _has(high, 3))
        connection = await aio_pika.connect(AMQP_URL)
        channel = await connection.channel()
        await (await channel.get_queue(high, ensure=False)).purge()
        await connection.close()
        await wait_until(lambda: _has(high, 3), timeout=20)  # republished by the reconciler
    finally:
        await _stop(worker, task)
    consumer, ctask = await _run(quorum, test_app, queue_type="quorum")
    try:
        for job in jobs:
            await wait_until(lambda job=job: status_is(qclient, job.id, "succeeded"))
    finally:
        await _stop(consumer, ctask)


async def _has(name: str, count: int) -> bool:
    return (await _ready(name) or 0) >= count


async def _switch(settings: Settings, source: Topology, target: Topology) -> dict[str, object]:
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        broker = Broker(settings.amqp_url, target, name="test-switch")
        await broker.connect()
        try:
            return (await switch_queues(store, broker, source)).as_dict()
        finally:
            await broker.close()


async def _succeeded(settings: Settings) -> int:
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        return int(
            await conn.fetchval(
                f"SELECT count(*) FROM \"{settings.namespace}\".jobs WHERE status = 'succeeded'"
            )
        )
    finally:
        await conn.close()


async def test_switch_classic_to_quorum_and_back_with_jobs_waiting(
    settings: Settings, client: Client, test_app: Any, amqp: aio_pika.abc.AbstractChannel
) -> None:
    """Jobs wait in classic queues (no worker); the switch moves them into the right bands
    and deletes the classic queues; a quorum worker runs them. Then back, with jobs waiting
    in the bands, and a classic worker runs those. Nothing lost, nothing left behind."""
    classic = settings.topology()
    quorum = classic.other("quorum")
    # a classic worker provisions two tenants, then stops: its queues stay, without consumers
    worker, task = await _run(settings, test_app)
    await client.submit("echo", {}, tenant="acme")
    await wait_until(lambda: _succeeded_at_least(settings, 1))
    await _stop(worker, task)
    waiting = [
        await client.submit("echo", {"value": i}, tenant=tenant, priority=i % 10)
        for i, tenant in enumerate(["default", "acme"] * 10)
    ]
    await publish_raw(amqp, settings.namespace, body("echo"), "default.acme", message_id="raw-1")
    assert await _ready(classic.job_queue("default", "acme")) == 11

    report = await _switch(settings, classic, quorum)
    assert report["messages_moved"] == 21
    assert report["queues_left"] == []
    assert await _ready(classic.job_queue("default", "acme")) is None
    assert await _ready(classic.unrouted_queue) is None
    assert await _ready(quorum.band_queue("default", "acme", 2)) == 4  # 7, 9, 7, 9
    assert sum([await _ready(n) or 0 for n in quorum.job_queues("default", "acme")]) == 11

    qsettings = make_settings(settings.namespace, queue_type="quorum")
    async with Client.connect(qsettings, app=test_app) as qclient:
        worker, task = await _run(settings, test_app, queue_type="quorum")
        try:
            for job in waiting:
                await wait_until(lambda job=job: status_is(qclient, job.id, "succeeded"))
            await wait_until(lambda: status_is(qclient, "raw-1", "succeeded"))
        finally:
            await _stop(worker, task)
        back = [await qclient.submit("echo", {}, tenant="acme", priority=p) for p in (0, 5, 9)]
    assert sum([await _ready(n) or 0 for n in quorum.job_queues("default", "acme")]) == 3

    report = await _switch(settings, quorum, classic)
    assert report["messages_moved"] == 3, report["moved_by_queue"]
    for name in quorum.job_queues("default", "acme") + [quorum.unrouted_queue]:
        assert await _ready(name) is None
    worker, task = await _run(settings, test_app)
    try:
        for job in back:
            await wait_until(lambda job=job: status_is(client, job.id, "succeeded"))
    finally:
        await _stop(worker, task)


async def test_switch_refuses_while_old_workers_consume(settings: Settings, test_app: Any) -> None:
    """A classic worker still consuming: the switch changes nothing and says why."""
    worker, task = await _run(settings, test_app)
    try:
        with pytest.raises(SourceInUse, match="still have consumers"):
            await _switch(settings, settings.topology(), settings.topology().other("quorum"))
        assert await _ready(settings.topology().job_queue("default", "default")) is not None
    finally:
        await _stop(worker, task)


async def _succeeded_at_least(settings: Settings, count: int) -> bool:
    return await _succeeded(settings) >= count
