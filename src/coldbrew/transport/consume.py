"""The worker's consumers: one per tenant queue, spread over a bounded set of channels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiormq
import structlog
from aio_pika.abc import AbstractRobustChannel, AbstractRobustQueue

from coldbrew.errors import BrokerUnavailable
from coldbrew.transport.connection import BrokerConnection
from coldbrew.transport.inbound import InboundChannel, InboundHandler, OnDelivery, QueueCancels

log = structlog.get_logger("coldbrew.broker")

CANCEL_ERRORS: tuple[type[Exception], ...] = (
    # Queue.cancel (basic.cancel RPC) on a channel closed meanwhile: aiormq's
    # ChannelInvalidStateError (the RuntimeError that was caught here); or the
    # close reason of a channel or connection lost during the RPC (AMQPError).
    # While the connection is down, a robust channel waits for it instead.
    aiormq.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.AMQPError,
)


class Consumers:
    """Consumes queues round-robin over up to ``channels`` channels, each with the prefetch.

    Acks are batched per channel with ``multiple=True``, which can only
    reach up to the oldest delivery still held on that channel. Deliveries
    of a paused or capped tenant, or of a tenant the scheduler serves
    rarely, stay held; on a channel shared by every queue they force
    everyone else's acks to go singly, one awaited frame each. Measured in
    bench/fairness.py (caps): other tenants' throughput 0.6-0.7x with one
    channel, 0.9x with a channel per queue. The bound keeps a worker with
    thousands of tenant queues from opening thousands of channels (each
    an Erlang process in RabbitMQ).
    """

    def __init__(
        self, connection: BrokerConnection, *, channels: int = 1, cancels: QueueCancels
    ) -> None:
        self._connection = connection
        self.cancels = cancels
        self.channels = channels
        self._prefetch = 0
        self._open: list[AbstractRobustChannel] = []
        self._consumers: dict[str, tuple[AbstractRobustQueue, str]] = {}

    async def open(self, *, prefetch: int) -> None:
        """Open the first channel (at connect: a later one opens with its first queue)."""
        self._prefetch = prefetch
        self._open = [await self._open_channel()]

    def __len__(self) -> int:
        return len(self._consumers)

    def __contains__(self, queue_name: object) -> bool:
        """Whether ``queue_name`` is consumed here."""
        return queue_name in self._consumers

    async def consume(
        self, queue_name: str, arguments: Mapping[str, Any], on_delivery: OnDelivery
    ) -> None:
        """Start consuming ``queue_name`` (once): each delivery reaches ``on_delivery``.

        The queue is declared (idempotently, same arguments) on the consuming
        channel so that aio-pika restores it and its consumer after a reconnect.
        """
        if queue_name in self._consumers:
            return
        channel = await self.next_channel()
        queue = await channel.declare_queue(queue_name, durable=True, arguments=dict(arguments))
        tag = await queue.consume(InboundHandler(on_delivery).incoming, no_ack=False)
        self._consumers[queue_name] = (queue, tag)

    async def next_channel(self) -> AbstractRobustChannel:
        """The channel the next queue goes on (opened if it is one more of the bound)."""
        if not self._open:
            raise BrokerUnavailable("broker used before connect()")
        index = len(self._consumers) % self.channels
        while index >= len(self._open):
            self._open.append(await self._open_channel())
        return self._open[index]

    async def cancel_all(self) -> None:
        """Stop all deliveries at once (drain); unacked ones stay with us until acked."""
        consumers, self._consumers = self._consumers, {}
        for queue, tag in consumers.values():
            try:
                await queue.cancel(tag)
            except CANCEL_ERRORS as exc:
                log.warning("consumer_cancel_failed", queue=queue.name, error=str(exc))

    async def _open_channel(self) -> AbstractRobustChannel:
        channel = await self._connection.channel(publisher_confirms=True)
        if isinstance(channel, InboundChannel):  # always, through InboundConnection
            channel.cancels = self.cancels
        if self._prefetch:
            await channel.set_qos(prefetch_count=self._prefetch)
        return channel
