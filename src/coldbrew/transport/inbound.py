"""Deliveries as the worker holds them, and the three ways to settle one.

A worker consumes through aiormq's own consumer callback rather than aio-pika's
``IncomingMessage``: aio-pika builds that object field by field through a
locking ``__setattr__`` and starts a second task per delivery, ~10% of a busy
worker's CPU (bench/throughput.py profile). ``Inbound`` keeps aiormq's frame
and reads properties only when asked. The robust machinery stays aio-pika's:
``InboundQueue`` is a ``RobustQueue`` whose ``consume`` records the consumer
as before, so a reconnect restores it through this same path.

A delivery is settled once: ``ack()`` (done with it), ``requeue()`` (back to
its queue, for this or another worker) or ``reject()`` (to the queue's
dead-letter exchange). Each returns whether the broker took it; False means
its channel was gone, and RabbitMQ has requeued it already.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, cast

import aiormq
import structlog
from aio_pika.abc import AbstractIncomingMessage, ConsumerTag, TimeoutType
from aio_pika.robust_channel import RobustChannel
from aio_pika.robust_connection import RobustConnection
from aio_pika.robust_queue import RobustQueue
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic
from pamqp.common import Arguments

from coldbrew.transport.acks import SETTLE_ERRORS, ChannelAcks, acks_of, keep

log = structlog.get_logger("coldbrew.broker")


class Inbound:
    """One delivery from a consumer: aiormq's frame, its channel's acks, lazy properties."""

    __slots__ = ("acks", "body", "delivery_tag", "properties", "redelivered", "routing_key")

    def __init__(
        self,
        *,
        body: bytes,
        delivery_tag: int,
        redelivered: bool,
        routing_key: str,
        properties: Basic.Properties,
        acks: ChannelAcks,
    ) -> None:
        self.body = body
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.routing_key = routing_key
        self.properties = properties
        self.acks = acks
        acks.delivered(delivery_tag)  # tracked from arrival: see ChannelAcks

    @classmethod
    def delivered(cls, message: DeliveredMessage, acks: ChannelAcks) -> Inbound:
        frame = cast(Basic.Deliver, message.delivery)  # a consumer receives nothing else
        return cls(
            body=message.body,
            delivery_tag=cast(int, frame.delivery_tag),
            redelivered=bool(frame.redelivered),
            routing_key=frame.routing_key or "",
            properties=message.header.properties,
            acks=acks,
        )

    @classmethod
    def from_incoming(cls, message: AbstractIncomingMessage) -> Inbound:
        """From aio-pika's message: its own consumer recovery calls ``Queue.consume``."""
        assert message.delivery_tag is not None  # consumed with no_ack=False
        return cls(
            body=message.body,
            delivery_tag=message.delivery_tag,
            redelivered=bool(message.redelivered),
            routing_key=message.routing_key or "",
            properties=Basic.Properties(
                content_type=message.content_type,
                content_encoding=message.content_encoding,
                headers=dict(message.headers),
                priority=message.priority,
                correlation_id=message.correlation_id,
                message_id=message.message_id,
                timestamp=message.timestamp,
                message_type=message.type,
                app_id=message.app_id,
            ),
            acks=acks_of(message.channel),
        )

    # --- settling -------------------------------------------------------------------

    async def ack(self) -> bool:
        """Done with it: acked in its channel's next batch; returns once that was written.

        Settling twice is a no-op (True). False when the channel was gone.
        """
        return await self._settle(lambda: self.acks.ack(self.delivery_tag))

    async def requeue(self) -> bool:
        """Back to its queue at the head of its priority (``redelivered`` set)."""
        return await self._settle(lambda: self.acks.nack(self.delivery_tag, requeue=True))

    async def reject(self) -> bool:
        """Refused without requeue: RabbitMQ dead-letters it (``x-dead-letter-exchange``)."""
        return await self._settle(lambda: self.acks.nack(self.delivery_tag, requeue=False))

    def ack_soon(self) -> None:
        """Request an ack without waiting for it (the claim path: the job need not wait).

        A failure is logged; it means the channel closed and RabbitMQ requeued
        the delivery, whose redelivery is then a duplicate of a claimed job.
        """
        self.acks.request(self.delivery_tag)

    def requeue_soon(self) -> None:
        """``requeue()`` from a plain function: a tracked task (``requeue`` never raises)."""
        keep(asyncio.create_task(self.requeue(), name="settle"))

    async def _settle(self, send: Callable[[], Awaitable[None]]) -> bool:
        if self.acks.closed:  # no frame, no future: RabbitMQ requeued it with the channel
            return _skipped("the channel is closed")
        try:
            await send()
        except SETTLE_ERRORS as exc:
            return _skipped(str(exc))
        return True

    # --- properties -----------------------------------------------------------------

    @property
    def channel(self) -> aiormq.abc.AbstractChannel:
        """The aiormq channel it came on (its delivery tag means something only there)."""
        return cast(aiormq.abc.AbstractChannel, self.acks.channel)

    @property
    def message_id(self) -> str | None:
        return self.properties.message_id

    @property
    def headers(self) -> dict[str, Any]:
        return self.properties.headers or {}

    @property
    def priority(self) -> int | None:
        return self.properties.priority

    @property
    def content_type(self) -> str | None:
        return self.properties.content_type

    @property
    def content_encoding(self) -> str | None:
        return self.properties.content_encoding

    @property
    def correlation_id(self) -> str | None:
        return self.properties.correlation_id

    @property
    def timestamp(self) -> datetime | None:
        return self.properties.timestamp

    @property
    def type(self) -> str | None:
        return self.properties.message_type

    @property
    def app_id(self) -> str | None:
        return self.properties.app_id


def _skipped(error: str) -> bool:
    log.info("settle_skipped", reason="channel closed; broker requeued it", error=error)
    return False


OnDelivery = Callable[[Inbound], Awaitable[None]]
"""A consumer's callback: each delivery of its queue, as an ``Inbound``."""


async def requeue_all(messages: Sequence[Inbound]) -> None:
    """Hand deliveries back to the broker, each at the head of its priority."""
    for message in messages:
        await message.requeue()


class InboundHandler:
    """What ``InboundQueue.consume`` is given: recorded by aio-pika, restored after a reconnect.

    ``incoming`` is the aio-pika callback (used only if aio-pika's own
    consumer recovery calls the base ``Queue.consume``); ``InboundQueue``
    recognises it and hands ``on_delivery`` aiormq's messages directly.
    """

    __slots__ = ("on_delivery",)

    def __init__(self, on_delivery: OnDelivery) -> None:
        self.on_delivery = on_delivery

    async def incoming(self, message: AbstractIncomingMessage) -> None:
        await self.on_delivery(Inbound.from_incoming(message))


class InboundQueue(RobustQueue):
    """A robust queue whose ``InboundHandler`` consumers skip ``IncomingMessage``."""

    async def consume(
        self,
        callback: Callable[[AbstractIncomingMessage], Awaitable[Any]],
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: Arguments = None,
        consumer_tag: ConsumerTag | None = None,
        timeout: TimeoutType = None,
        robust: bool = True,
    ) -> ConsumerTag:
        handler = getattr(callback, "__self__", None)
        if not isinstance(handler, InboundHandler) or no_ack:
            return await super().consume(
                callback, no_ack, exclusive, arguments, consumer_tag, timeout, robust
            )
        channel = await self.channel.get_underlay_channel()
        acks = acks_of(channel)
        on_delivery = handler.on_delivery

        async def deliver(message: DeliveredMessage) -> None:
            await on_delivery(Inbound.delivered(message, acks))

        result = await channel.basic_consume(
            queue=self.name,
            consumer_callback=deliver,
            exclusive=exclusive,
            no_ack=False,
            arguments=arguments,
            consumer_tag=consumer_tag,
            timeout=timeout,
        )
        if result.consumer_tag is None:
            raise RuntimeError("the broker gave no consumer tag")
        if robust:  # what RobustQueue.restore replays through this method
            self._consumers[result.consumer_tag] = dict(
                callback=callback, no_ack=False, exclusive=exclusive, arguments=arguments
            )
        return result.consumer_tag


class QueueCancels:
    """Queues whose consumer the broker cancelled (``basic.cancel``: the queue was deleted).

    aio-pika restores the consumer by itself, on a queue declared again
    without its binding; whoever owns the topology (the reconciler) takes
    the names from here and declares and binds them again. A mailbox that
    both sides are handed at construction, rather than a hook set on the
    channel.
    """

    def __init__(self) -> None:
        self._names: list[str] = []
        self.arrived = asyncio.Event()
        """Set while names wait to be taken."""

    def add(self, queue_name: str, *, cause: str = "broker_cancel") -> None:
        """``cause``: the broker's basic.cancel, or a paused consumer's probe found the queue
        missing (consume.py: a paused queue has no consumer for the broker to cancel)."""
        log.warning("consumer_cancelled_by_broker", queue=queue_name, cause=cause)
        self._names.append(queue_name)
        self.arrived.set()

    def take(self) -> list[str]:
        names, self._names = self._names, []
        self.arrived.clear()
        return names


class InboundChannel(RobustChannel):
    QUEUE_CLASS = InboundQueue

    cancels: QueueCancels | None = None
    """Where a consumer the broker cancelled is reported (set by ``Consumers``)."""

    def _on_consumer_cancel(self, frame: aiormq.spec.Basic.Cancel) -> None:
        super()._on_consumer_cancel(frame)
        if self.cancels is None:
            return
        for queues in self._queues.values():
            for queue in queues:
                if frame.consumer_tag in queue._consumers:
                    self.cancels.add(queue.name)
                    return


class InboundConnection(RobustConnection):
    """``aio_pika.connect_robust(connection_class=…)``: every queue it declares is inbound."""

    CHANNEL_CLASS = InboundChannel
