"""``Broker``: what the rest of coldbrew holds of RabbitMQ, one object over the transport.

The broker moves work; it never decides a job's fate (the store does). Each
method is a step into the module that does it: ``connection`` (the robust
connection and its channels), ``declare`` (exchanges and queues),
``publish`` (confirmed publishes), ``consume`` (the tenant queues'
consumers), ``sweep`` (the aging sweep's consumer). Settling a delivery is
the delivery's own business (``Inbound.ack()`` and the like).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aio_pika.abc import AbstractRobustChannel

from coldbrew.errors import BrokerUnavailable
from coldbrew.model import JobFields
from coldbrew.topology import Topology
from coldbrew.transport.connection import BrokerConnection
from coldbrew.transport.consume import Consumers
from coldbrew.transport.declare import declare_fixed, declare_job_queue
from coldbrew.transport.inbound import Inbound, OnDelivery, QueueCancels, requeue_all
from coldbrew.transport.inspect import QueueCounts, QueueInspector
from coldbrew.transport.publish import PUBLISH_ERRORS, Publisher
from coldbrew.transport.sweep import Sweep, Sweeper
from coldbrew.transport.switch import KeyFor, QueueRetirer, Retired


class Broker:
    """One robust connection with a publishing channel (confirms) and consuming channels."""

    def __init__(
        self,
        url: str,
        topology: Topology,
        *,
        name: str = "coldbrew",
        reconnect_interval: float = 1.0,
        publish_timeout: float = 30.0,
        heartbeat: int | None = None,
        consume_channels: int = 1,
        spread_key: str | None = None,
    ) -> None:
        self.url = url
        self.topology = topology
        self._connection = BrokerConnection(
            url,
            name=name,
            reconnect_interval=reconnect_interval,
            heartbeat=heartbeat,
            spread_key=spread_key,
        )
        self._publish_timeout = publish_timeout
        self._channel: AbstractRobustChannel | None = None
        self._publisher: Publisher | None = None
        self.queue_cancels = QueueCancels()
        """Consumed queues the broker cancelled (deleted), for the reconciler to restore."""
        self.consumers = Consumers(
            self._connection, channels=consume_channels, cancels=self.queue_cancels
        )
        """The queues consumed here (``queue in broker.consumers``)."""
        self._sweeper = Sweeper(self._connection)
        self._inspector = QueueInspector(self._connection)
        self._retirer = QueueRetirer(self._connection, timeout=publish_timeout)

    async def connect(self, *, prefetch: int = 0) -> None:
        """Connect once (fail fast), open channels and declare the fixed topology."""
        await self._connection.open()
        self._channel = await self._connection.channel(publisher_confirms=True)
        await self.consumers.open(prefetch=prefetch)
        exchanges = await declare_fixed(self._channel, self.topology)
        self._publisher = Publisher(exchanges, self.topology, timeout=self._publish_timeout)

    async def close(self) -> None:
        await self._connection.close()

    @property
    def connected(self) -> bool:
        return self._connection.connected

    @property
    def node(self) -> str:
        """The broker URL (masked) this process is connected to: one of ``COLDBREW_AMQP_URL``'s."""
        return self._connection.node

    async def redeclare_topology(self) -> None:
        """Declare the exchanges and the unrouted and dead queues again, with their bindings
        (after the broker deleted one: a queue aio-pika restores by itself has no binding)."""
        if self._channel is None:
            raise BrokerUnavailable("broker used before connect()")
        try:
            await declare_fixed(self._channel, self.topology)
        except PUBLISH_ERRORS as exc:
            raise BrokerUnavailable(f"declaring the topology: {exc or type(exc).__name__}") from exc

    async def queue_counts(self, queue_name: str) -> QueueCounts | None:
        """Ready messages and consumers of a queue (a passive declare); None if it is missing."""
        return await self._inspector.counts(queue_name)

    async def declare_job_queue(self, queue: str, tenant: str) -> None:
        """Declare and bind the queue of one lane and tenant (idempotent).

        A refusal is ``BrokerUnavailable``, waited out by the caller's loop: on a
        cluster, declaring a classic queue whose home node is down answers 404
        ``NOT_FOUND - home node ... is down or inaccessible`` (and closes the channel,
        which aio-pika reopens) until that node is back; the reconciler re-declares a
        queue whose consumer the broker cancelled, so this met it (tests/cluster).
        """
        if self._channel is None:
            raise BrokerUnavailable("broker used before connect()")
        try:
            await declare_job_queue(self._channel, self.topology, queue, tenant)
        except PUBLISH_ERRORS as exc:
            raise BrokerUnavailable(
                f"declaring the queue of {queue}.{tenant}: {exc or type(exc).__name__}"
            ) from exc

    async def unbind_queue(self, name: str, bindings: Sequence[tuple[str, str]]) -> None:
        """Remove a queue's bindings, each (exchange, routing key) (switch.py)."""
        await self._retirer.unbind(name, bindings)

    async def retire_queue(self, name: str, *, move_to: str, key_for: KeyFor) -> Retired:
        """Move an unbound queue's messages on to ``move_to`` (an exchange; ``""`` the default
        one) with ``key_for``'s keys, and delete it (switch.py)."""
        return await self._retirer.retire(name, move_to=move_to, key_for=key_for)

    # --- publishing (publish.py) -------------------------------------------------------

    async def publish_job(self, job: JobFields) -> None:
        """Publish one job and wait for the broker's confirm."""
        await self._publishing().publish_job(job)

    async def publish_jobs(self, jobs: Sequence[JobFields], *, window: int = 256) -> list[bool]:
        """Publish many with confirms pipelined (``window`` in flight); True where confirmed."""
        return await self._publishing().publish_jobs(jobs, window=window)

    async def republish(self, message: Inbound, routing_key: str | None = None) -> None:
        """Publish a delivery again to the jobs exchange, unchanged (after provisioning), with
        its own routing key or ``routing_key``."""
        await self._publishing().republish(message, routing_key)

    async def publish_dead(
        self,
        body: bytes,
        *,
        reason: str,
        detail: str,
        headers: Mapping[str, Any],
        message_id: str | None,
        original_routing_key: str,
    ) -> None:
        """Put a copy of a dead job or rejected message on ``<ns>.dead`` with its reason."""
        await self._publishing().publish_dead(
            body,
            reason=reason,
            detail=detail,
            headers=headers,
            message_id=message_id,
            original_routing_key=original_routing_key,
        )

    def _publishing(self) -> Publisher:
        if self._publisher is None:
            raise BrokerUnavailable("broker used before connect()")
        return self._publisher

    # --- consuming (consume.py, sweep.py) -----------------------------------------------

    async def consume(
        self,
        queue_name: str,
        arguments: Mapping[str, Any],
        on_delivery: OnDelivery,
        *,
        held: bool = False,
    ) -> None:
        """Start consuming ``queue_name``: each delivery reaches ``on_delivery`` (``Inbound``);
        a ``held`` queue's consumer follows ``consumers.pause``/``resume`` (the worker's hold)."""
        await self.consumers.consume(queue_name, arguments, on_delivery, held=held)

    @property
    def consuming(self) -> int:
        return len(self.consumers)

    async def cancel_consumers(self) -> None:
        """Stop all deliveries at once (drain); unacked ones stay with us until acked."""
        await self.consumers.cancel_all()

    async def sweep_queue(
        self,
        queue_name: str,
        *,
        limit: int,
        quiet_seconds: float = 0.2,
        max_seconds: float = 2.0,
        on_start: Callable[[int], Awaitable[None]] | None = None,
    ) -> Sweep:
        """Take up to ``limit`` of a queue's ready messages at once, past its priority order;
        ``on_start`` is told how many it may take, before it takes any."""
        return await self._sweeper.sweep(
            queue_name,
            limit=limit,
            quiet_seconds=quiet_seconds,
            max_seconds=max_seconds,
            on_start=on_start,
        )

    @staticmethod
    async def requeue(messages: Sequence[Inbound]) -> None:
        """Hand deliveries back to the broker, each at the head of its priority."""
        await requeue_all(messages)
