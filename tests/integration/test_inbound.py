"""Deliveries reach the worker as ``Inbound`` (aiormq's frame, no ``IncomingMessage``).

The same object must come out of every path a consumer can be started on:
``Broker.consume``, aio-pika's own consumer recovery (which calls the base
``Queue.consume``), and the restore after the broker closed the connection.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import aio_pika
import pytest
from aio_pika.queue import Queue

from coldbrew.model import routing_key
from coldbrew.topology import Topology
from coldbrew.transport import Broker, Inbound, InboundHandler
from tests.helpers import AMQP_URL, drop_broker_entities

STAMP = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


async def publish(topology: Topology, tenant: str, count: int = 1) -> None:
    """Publish ``count`` messages with every property the worker reads."""
    connection = await aio_pika.connect(AMQP_URL)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange(topology.jobs_exchange)
        for index in range(count):
            message = aio_pika.Message(
                b'{"type":"noop"}',
                message_id=f"m{index}",
                headers={"x-idempotency-key": f"k{index}", "x-max-attempts": 3},
                priority=7,
                content_type="application/json",
                content_encoding="utf-8",
                correlation_id="c1",
                timestamp=STAMP,
                type="job",
                app_id="tests",
            )
            await exchange.publish(message, routing_key("default", tenant))


def assert_properties(message: Inbound, index: int = 0) -> None:
    assert message.body == b'{"type":"noop"}'
    assert message.routing_key == routing_key("default", "t1")
    assert message.message_id == f"m{index}"
    assert message.headers == {"x-idempotency-key": f"k{index}", "x-max-attempts": 3}
    assert message.priority == 7
    assert (message.content_type, message.content_encoding) == ("application/json", "utf-8")
    assert (message.correlation_id, message.type, message.app_id) == ("c1", "job", "tests")
    assert message.timestamp is not None
    assert message.timestamp.replace(tzinfo=UTC) == STAMP
    assert isinstance(message.delivery_tag, int) and message.delivery_tag > 0


@pytest.fixture
async def broker(namespace: str) -> AsyncIterator[Broker]:
    topology = Topology(namespace)
    broker = Broker(AMQP_URL, topology, name=f"inbound-{namespace}")
    await broker.connect(prefetch=10)
    await broker.declare_job_queue("default", "t1")
    yield broker
    await broker.close()
    await drop_broker_entities(namespace, [("default", "t1")])


async def ready_and_unacked(name: str) -> tuple[int, int]:
    out = await asyncio.to_thread(
        subprocess.run,
        ["rabbitmqctl", "-q", "list_queues", "name", "messages_ready", "messages_unacknowledged"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    for line in out.stdout.splitlines():
        fields = line.split("\t")
        if fields[0] == name:
            return int(fields[1]), int(fields[2])
    raise AssertionError(f"queue {name} not listed")


async def test_properties_ack_and_nack_through_broker_consume(broker: Broker) -> None:
    got: asyncio.Queue[Inbound] = asyncio.Queue()

    async def on_delivery(message: Inbound) -> None:
        await got.put(message)

    queue = broker.topology.job_queue("default", "t1")
    await broker.consume(queue, broker.topology.job_queue_arguments(), on_delivery)
    await publish(broker.topology, "t1")
    first = await asyncio.wait_for(got.get(), timeout=10)
    assert_properties(first)
    assert first.redelivered is False
    assert await first.requeue()  # nack: it comes back, flagged
    again = await asyncio.wait_for(got.get(), timeout=10)
    assert again.redelivered is True and again.message_id == "m0"
    assert await again.ack()
    assert await again.ack()  # settling twice is a no-op, not a channel error
    for _ in range(50):
        if await ready_and_unacked(queue) == (0, 0):
            break
        await asyncio.sleep(0.1)
    assert await ready_and_unacked(queue) == (0, 0)


async def test_aio_pikas_own_queue_consume_still_gives_inbound(broker: Broker) -> None:
    """aio-pika's consumer recovery calls ``Queue.consume``: the handler converts."""
    got: asyncio.Queue[Inbound] = asyncio.Queue()

    async def on_delivery(message: Inbound) -> None:
        await got.put(message)

    channel = await broker.consumers.next_channel()
    name = broker.topology.job_queue("default", "t1")
    queue = await channel.declare_queue(name, passive=True, robust=False)
    await Queue.consume(queue, InboundHandler(on_delivery).incoming)
    await publish(broker.topology, "t1")
    message = await asyncio.wait_for(got.get(), timeout=10)
    assert isinstance(message, Inbound)
    assert_properties(message)
    assert await message.ack()


def close_connection_named(name: str) -> None:
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "pid", "client_properties"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    pids = [line.split("\t")[0] for line in listed.stdout.splitlines() if f'"{name}"' in line]
    assert len(pids) == 1, listed.stdout
    subprocess.run(
        ["rabbitmqctl", "-q", "close_connection", pids[0], "test: consumer restore"],
        check=True,
        capture_output=True,
        timeout=60,
    )


async def test_consumer_restored_after_the_broker_closes_the_connection(
    broker: Broker, namespace: str
) -> None:
    got: asyncio.Queue[Inbound] = asyncio.Queue()

    async def on_delivery(message: Inbound) -> None:
        await got.put(message)

    queue = broker.topology.job_queue("default", "t1")
    await broker.consume(queue, broker.topology.job_queue_arguments(), on_delivery)
    await publish(broker.topology, "t1")
    held = await asyncio.wait_for(got.get(), timeout=10)  # held unacked across the close
    await asyncio.to_thread(close_connection_named, f"inbound-{namespace}")
    redelivered = await asyncio.wait_for(got.get(), timeout=30)
    assert redelivered.redelivered is True and redelivered.message_id == "m0"
    assert await held.ack() is False  # its channel is gone; the broker requeued it
    await publish(broker.topology, "t1", count=2)
    fresh = [await asyncio.wait_for(got.get(), timeout=10) for _ in range(2)]
    for index, message in enumerate(fresh):
        assert_properties(message, index)
    for message in [redelivered, *fresh]:
        assert await message.ack()
    for _ in range(50):
        if await ready_and_unacked(queue) == (0, 0):
            break
        await asyncio.sleep(0.1)
    assert await ready_and_unacked(queue) == (0, 0)
