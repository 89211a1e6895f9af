"""What coldbrew declares on RabbitMQ: the fixed exchanges and queues, and tenant queues.

Names and arguments come from ``topology.py`` (pure, mirrored by
``rabbitmq/definitions.json``); this module only sends them. Every
declaration is idempotent and made with ``robust=True`` (aio-pika's
default), so the channel replays it after a reconnect.
"""

from __future__ import annotations

from dataclasses import dataclass

import aio_pika
from aio_pika.abc import AbstractRobustChannel, AbstractRobustExchange

from coldbrew.topology import Topology


@dataclass(frozen=True, slots=True)
class Exchanges:
    """The exchanges coldbrew publishes to."""

    jobs: AbstractRobustExchange
    dead: AbstractRobustExchange


async def declare_fixed(channel: AbstractRobustChannel, topo: Topology) -> Exchanges:
    """Exchanges and the unrouted and dead queues."""
    unrouted = await channel.declare_exchange(
        topo.unrouted_exchange, aio_pika.ExchangeType.FANOUT, durable=True
    )
    dead = await channel.declare_exchange(
        topo.dead_exchange, aio_pika.ExchangeType.FANOUT, durable=True
    )
    jobs = await channel.declare_exchange(
        topo.jobs_exchange,
        aio_pika.ExchangeType.TOPIC,
        durable=True,
        arguments=topo.jobs_exchange_arguments(),
    )
    unrouted_queue = await channel.declare_queue(
        topo.unrouted_queue, durable=True, arguments=topo.unrouted_queue_arguments()
    )
    await unrouted_queue.bind(unrouted, routing_key="#")
    dead_queue = await channel.declare_queue(
        topo.dead_queue, durable=True, arguments=topo.dead_queue_arguments()
    )
    await dead_queue.bind(dead, routing_key="#")
    return Exchanges(jobs=jobs, dead=dead)


async def declare_job_queue(
    channel: AbstractRobustChannel, topo: Topology, queue: str, tenant: str
) -> None:
    """Declare and bind the queue of one lane and tenant (quorum: each band's, with every
    key it takes, ``Topology.job_queue_bindings``)."""
    arguments = topo.job_queue_arguments()
    declared = {
        name: await channel.declare_queue(name, durable=True, arguments=arguments)
        for name in topo.job_queues(queue, tenant)
    }
    for name, key in topo.job_queue_bindings(queue, tenant):
        await declared[name].bind(topo.jobs_exchange, routing_key=key)
