"""Tenant queues are spread over a bounded set of consume channels.

Acks are batched per channel up to the oldest delivery still held there, so a
tenant whose deliveries wait (paused, capped) must not share a channel with
everyone else; and a worker with thousands of queues must not open thousands
of channels.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import pytest

from coldbrew.model import routing_key
from coldbrew.topology import Topology
from coldbrew.transport import Broker, Inbound
from tests.helpers import AMQP_URL, drop_broker_entities

TENANTS = ["t1", "t2", "t3"]


async def deliveries_by_tenant(namespace: str, consume_channels: int) -> dict[str, Any]:
    """Consume three tenant queues; return the channel each tenant's delivery came on."""
    topology = Topology(namespace)
    broker = Broker(AMQP_URL, topology, consume_channels=consume_channels)
    await broker.connect(prefetch=4)
    seen: dict[str, Any] = {}
    got_all = asyncio.Event()

    async def on_message(message: Inbound) -> None:
        seen[message.routing_key.partition(".")[2]] = message.channel
        assert await message.ack()
        if len(seen) == len(TENANTS):
            got_all.set()

    try:
        for tenant in TENANTS:
            await broker.declare_job_queue("default", tenant)
            await broker.consume(
                topology.job_queue("default", tenant), topology.job_queue_arguments(), on_message
            )
        connection = await aio_pika.connect(AMQP_URL)
        async with connection:
            channel = await connection.channel()
            exchange = await channel.get_exchange(topology.jobs_exchange)
            for tenant in TENANTS:
                await exchange.publish(
                    aio_pika.Message(b'{"type":"noop"}'), routing_key("default", tenant)
                )
        await asyncio.wait_for(got_all.wait(), timeout=10)
        return seen
    finally:
        await broker.close()
        await drop_broker_entities(namespace, [("default", t) for t in TENANTS])


@pytest.mark.parametrize(
    ("consume_channels", "shared"), [(1, {"t1", "t2", "t3"}), (2, {"t1", "t3"}), (8, set())]
)
async def test_queues_go_round_robin_onto_at_most_n_channels(
    namespace: str, consume_channels: int, shared: set[str]
) -> None:
    seen = await deliveries_by_tenant(namespace, consume_channels)
    channels = {id(channel) for channel in seen.values()}
    assert len(channels) == min(consume_channels, len(TENANTS))
    together = {t for t in TENANTS if sum(seen[t] is seen[o] for o in TENANTS) > 1}
    assert together == shared
