"""Deliveries as the worker holds them, and how they are settled (batched acks).

A worker consumes through aiormq's own consumer callback rather than aio-pika's
``IncomingMessage``: aio-pika builds that object field by field through a
locking ``__setattr__`` and starts a second task per delivery, ~10% of a busy
worker's CPU (bench/throughput.py profile). ``Inbound`` keeps aiormq's frame
and reads properties only when asked. The robust machinery stays aio-pika's:
``InboundQueue`` is a ``RobustQueue`` whose ``consume`` records the consumer
as before, so a reconnect restores it through this same path.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, cast

import aio_pika
import aiormq
import structlog
from aio_pika.abc import AbstractIncomingMessage, ConsumerTag, TimeoutType
from aio_pika.robust_channel import RobustChannel
from aio_pika.robust_connection import RobustConnection
from aio_pika.robust_queue import RobustQueue
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic
from pamqp.common import Arguments

log = structlog.get_logger("coldbrew.broker")

SETTLE_ERRORS: tuple[type[BaseException], ...] = (
    aio_pika.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.AMQPError,
    ConnectionError,
    RuntimeError,
)


class ChannelAcks:
    """Acks of one consuming channel, sent as few ``basic.ack(multiple=True)`` as possible.

    Every delivery on the channel is tracked from arrival until settled.
    Acks requested while the previous batch was being written go together:
    one ``multiple=True`` ack up to the highest tag below which every
    outstanding delivery is being acked, and single acks for the rest (those
    above a delivery still held, e.g. waiting in the scheduler). Batches are
    written one at a time: a later ``multiple=True`` must never reach the
    broker before an earlier single ack of a tag it covers (RabbitMQ closes
    the channel on an unknown delivery tag). Tags rise in delivery order on a
    channel, so the outstanding ones are kept in an insertion-ordered dict
    and the prefix check is amortized O(1).
    """

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.outstanding: dict[int, bool] = {}  # tag -> ack requested
        self._waiters: list[asyncio.Future[None]] = []
        self._requested = 0  # acks asked for since the last batch was planned
        self._flushing = False

    def delivered(self, tag: int) -> None:
        self.outstanding[tag] = False

    def forget(self, tag: int) -> bool:
        """Stop tracking a tag settled another way; False if it was settled already."""
        return self.outstanding.pop(tag, None) is not None

    def ack(self, tag: int) -> asyncio.Future[None]:
        """Request an ack; the future resolves once its batch was written."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.request(tag):
            self._waiters.append(future)
        else:
            future.set_result(None)
        return future

    def request(self, tag: int) -> bool:
        """Request an ack nobody waits for (a failed batch is logged); False if already settled.

        The claim path acks every job this way, so it costs no future per job.
        """
        if self.outstanding.get(tag) is not False:
            return False  # settled or requested already: never ack a tag twice
        self.outstanding[tag] = True
        self._requested += 1
        if not self._flushing:
            self._flushing = True
            _keep(asyncio.create_task(self._flush_all(), name="ack-batch"))
        return True

    def plan(self) -> tuple[int | None, list[int]]:
        """(tag for one multiple=True ack or None, tags to ack singly); untracks them all."""
        prefix_end: int | None = None
        for tag, requested in self.outstanding.items():
            if not requested:
                break
            prefix_end = tag
        if prefix_end is not None:
            for tag in list(self.outstanding):
                del self.outstanding[tag]
                if tag == prefix_end:
                    break
        singles = [tag for tag, requested in self.outstanding.items() if requested]
        for tag in singles:
            del self.outstanding[tag]
        return prefix_end, singles

    async def _flush_all(self) -> None:
        try:
            while self._requested:
                await asyncio.sleep(0)  # let this loop turn's other acks join the batch
                waiters, self._waiters = self._waiters, []
                self._requested = 0
                await self._flush(waiters)
        finally:
            self._flushing = False

    async def _flush(self, waiters: list[asyncio.Future[None]]) -> None:
        prefix_end, singles = self.plan()
        try:
            if prefix_end is not None:
                await self.channel.basic_ack(prefix_end, multiple=True)
            for tag in singles:
                await self.channel.basic_ack(tag)
        except SETTLE_ERRORS as exc:
            log.info(
                "acks_not_sent",
                reason="channel closed; the broker requeued these deliveries",
                multiple_up_to=prefix_end,
                singles=len(singles),
                error=str(exc),
            )
            for future in waiters:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:  # cancelled at shutdown: the waiters must not hang
            for future in waiters:
                if not future.done():
                    future.cancel()
            raise
        for future in waiters:
            if not future.done():
                future.set_result(None)


_CHANNEL_ACKS: weakref.WeakKeyDictionary[Any, ChannelAcks] = weakref.WeakKeyDictionary()


def acks_of(channel: aiormq.abc.AbstractChannel) -> ChannelAcks:
    """The one ``ChannelAcks`` of an aiormq channel: its consumers share one tag space."""
    acks = _CHANNEL_ACKS.get(channel)
    if acks is None:
        acks = _CHANNEL_ACKS[channel] = ChannelAcks(channel)
    return acks


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


OnDelivery = Callable[[Inbound], Awaitable[None]]


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


class InboundChannel(RobustChannel):
    QUEUE_CLASS = InboundQueue

    on_queue_cancelled: Callable[[str], None] | None = None
    """Told the queue's name when the broker cancels one of our consumers (basic.cancel:
    the queue was deleted); aio-pika restores the consumer, the owner the rest."""

    def _on_consumer_cancel(self, frame: aiormq.spec.Basic.Cancel) -> None:
        super()._on_consumer_cancel(frame)
        hook = self.on_queue_cancelled
        if hook is None:
            return
        for queues in self._queues.values():
            for queue in queues:
                if frame.consumer_tag in queue._consumers:
                    hook(queue.name)
                    return


class InboundConnection(RobustConnection):
    """``aio_pika.connect_robust(connection_class=…)``: every queue it declares is inbound."""

    CHANNEL_CLASS = InboundChannel


_ACK_TASKS: set[asyncio.Task[Any]] = set()


def _keep(task: asyncio.Task[Any]) -> None:
    """Hold a fire-and-forget settle task until it ends; an unexpected error is logged."""
    _ACK_TASKS.add(task)
    task.add_done_callback(_settle_task_done)


def _settle_task_done(task: asyncio.Task[Any]) -> None:
    _ACK_TASKS.discard(task)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("settle_task_failed", task=task.get_name(), error=repr(exc), exc_info=exc)


def ack_soon(message: Inbound) -> None:
    """Request an ack without waiting for it (the claim path: the job need not wait).

    A failure is logged; it means the channel closed and RabbitMQ requeued
    the delivery, whose redelivery is then a duplicate of a claimed job.
    """
    message.acks.request(message.delivery_tag)


def settle_soon(message: Inbound, *, requeue: bool | None = None) -> None:
    """``settle`` from a plain function: a tracked task (``settle`` logs, never raises)."""
    _keep(asyncio.create_task(settle(message, requeue=requeue), name="settle"))


async def settle(message: Inbound, *, requeue: bool | None = None) -> bool:
    """Ack (``requeue`` None) or nack; a dead channel means the broker already requeued it.

    Acks are batched per channel (``ChannelAcks``) and this returns once the
    batch was written; settling a delivery twice is a no-op. False when the
    channel was gone.
    """
    acks, tag = message.acks, message.delivery_tag
    try:
        if acks.channel.is_closed:
            raise aio_pika.exceptions.ChannelInvalidStateError("the channel is closed")
        if requeue is None:
            await acks.ack(tag)
        elif acks.forget(tag):
            await acks.channel.basic_nack(tag, multiple=False, requeue=requeue)
    except SETTLE_ERRORS as exc:
        log.info("settle_skipped", reason="channel closed; broker requeued it", error=str(exc))
        return False
    return True
