"""The worker's consumers: one per tenant queue, spread over a bounded set of channels."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiormq
import structlog
from aio_pika.abc import AbstractRobustChannel, AbstractRobustQueue

from coldbrew.errors import BrokerUnavailable
from coldbrew.transport.connection import BrokerConnection
from coldbrew.transport.inbound import InboundChannel, InboundHandler, OnDelivery, QueueCancels
from coldbrew.transport.inspect import QueueInspector

log = structlog.get_logger("coldbrew.broker")

CANCEL_ERRORS: tuple[type[Exception], ...] = (
    # Queue.cancel (basic.cancel RPC) on a channel closed meanwhile: aiormq's
    # ChannelInvalidStateError (the RuntimeError that was caught here); or the
    # close reason of a channel or connection lost during the RPC (AMQPError).
    # While the connection is down, a robust channel waits for it instead.
    aiormq.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.AMQPError,
)

CONSUME_ERRORS: tuple[type[Exception], ...] = (*CANCEL_ERRORS, ConnectionError)
"""What ``basic.qos`` or ``basic.consume`` raises while the connection is lost."""


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
        self._consumers: dict[str, _Subscription] = {}
        self._paused = False
        self._closed = False
        self._lock = asyncio.Lock()  # consume, pause, resume and the drain, one at a time
        # a missing queue's passive declare is a 404 that closes its channel: never on a
        # consuming channel (it would requeue every delivery held there), on one of its own
        self._inspector = QueueInspector(connection)
        self._probed = 0  # where the next ``probe_paused`` starts (round robin)

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
        self,
        queue_name: str,
        arguments: Mapping[str, Any],
        on_delivery: OnDelivery,
        *,
        held: bool = False,
    ) -> None:
        """Start consuming ``queue_name`` (once): each delivery reaches ``on_delivery``.

        The queue is declared (idempotently, same arguments) on the consuming
        channel so that aio-pika restores it and its consumer after a reconnect.
        A ``held`` queue's consumer follows ``pause`` and ``resume`` (the job
        queues, sized by the worker's hold); while paused it is only recorded.
        """
        async with self._lock:
            await self._consume(queue_name, arguments, on_delivery, held=held)

    async def _consume(
        self, queue_name: str, arguments: Mapping[str, Any], on_delivery: OnDelivery, *, held: bool
    ) -> None:
        if self._closed:
            return
        if (known := self._consumers.get(queue_name)) is not None:
            # declared again after a probe found it missing while paused: it consumes again
            # now unless the hold is still paused (then ``resume`` starts it)
            if not (known.held and self._paused):
                try:
                    await known.start()
                except CONSUME_ERRORS as exc:
                    raise BrokerUnavailable(f"consuming {queue_name} again: {exc!r}") from exc
            return
        channel = await self.next_channel()
        queue = await channel.declare_queue(queue_name, durable=True, arguments=dict(arguments))
        subscription = _Subscription(queue, InboundHandler(on_delivery), held=held)
        self._consumers[queue_name] = subscription
        if held and self._paused:
            return
        try:
            await subscription.start()
        except BaseException:
            del self._consumers[queue_name]
            raise

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
        async with self._lock:
            consumers, self._consumers = self._consumers, {}
            self._closed = True
            for subscription in consumers.values():
                await subscription.stop()

    @property
    def paused(self) -> bool:
        """Whether the held queues' consumers are cancelled (``pause``)."""
        return self._paused

    @property
    def prefetch(self) -> int:
        """The prefetch the held queues' consumers were last started with."""
        return self._prefetch

    async def pause(self) -> None:
        """Cancel the held queues' consumers: nothing more is delivered to them.

        What they delivered stays ours, unacked, and is acked as usual: a
        cancelled consumer's deliveries are settled on the channel, and the
        ones in flight arrive before the broker's CancelOk (aiormq removes
        the consumer only then), so none is dropped.
        """
        async with self._lock:
            if self._paused or self._closed:
                return
            self._paused = True
            await asyncio.gather(*(s.stop() for s in self._consumers.values() if s.held))

    async def probe_paused(self, limit: int) -> list[str]:
        """Passively declare up to ``limit`` of the paused queues (round robin); a missing one
        is reported in ``cancels`` as a broker's cancel would be, and its name returned.

        A paused queue has no consumer of ours, so its deletion sends us no
        ``basic.cancel``: without this look the worker would notice only
        when it consumed again (a 404 on a consuming channel) or at the
        reconciler's next pass.
        """
        async with self._lock:
            idle = [s for s in self._consumers.values() if s.held and not s.consuming]
            if not idle or self._closed:
                return []
            start = self._probed % len(idle)
            chosen = (idle[start:] + idle[:start])[:limit]
            self._probed = start + len(chosen)
            return await self._report_missing(chosen)

    async def _report_missing(self, subscriptions: list[_Subscription]) -> list[str]:
        missing: list[str] = []
        for subscription in subscriptions:
            name = subscription.queue.name
            if await self._inspector.counts(name) is None:
                missing.append(name)
                self.cancels.add(name, cause="missing_while_paused")
        return missing

    async def resume(self, prefetch: int) -> None:
        """Consume the held queues again (or anew, to change it), each with ``prefetch``.

        ``basic.qos`` applies to consumers started after it (SEMANTICS §7,
        checked on 3.10), so a new prefetch reaches a running consumer only
        by cancelling and consuming it again; its unacked deliveries stay
        ours and do not count against the new consumer's prefetch.
        """
        async with self._lock:
            if self._closed:
                return
            held = [s for s in self._consumers.values() if s.held]
            # those without a consumer of ours could have been deleted unannounced
            unwatched = [s for s in held if not s.consuming]
            if not self._paused:
                await asyncio.gather(*(s.stop() for s in held))
            self._paused = True  # until every held queue consumes again
            try:
                if prefetch != self._prefetch:
                    await asyncio.gather(*(c.set_qos(prefetch_count=prefetch) for c in self._open))
                    self._prefetch = prefetch
                # a queue deleted while paused: declared again by whoever takes ``cancels``
                # (the reconciler), then consumed by its ``consume``; a basic.consume here
                # would be a 404 closing a consuming channel
                missing = set(await self._report_missing(unwatched))
                starting = [s for s in held if s.queue.name not in missing]
                results = await asyncio.gather(
                    *(s.start() for s in starting), return_exceptions=True
                )
            except CONSUME_ERRORS as exc:
                raise BrokerUnavailable(f"consuming the tenant queues again: {exc!r}") from exc
            for result in results:  # the ones not started are started by the next resume
                if isinstance(result, CONSUME_ERRORS):
                    raise BrokerUnavailable(f"consuming the tenant queues again: {result!r}")
                if isinstance(result, BaseException):
                    raise result
            self._paused = False

    async def _open_channel(self) -> AbstractRobustChannel:
        channel = await self._connection.channel(publisher_confirms=True)
        if isinstance(channel, InboundChannel):  # always, through InboundConnection
            channel.cancels = self.cancels
        if self._prefetch:
            await channel.set_qos(prefetch_count=self._prefetch)
        return channel


class _Subscription:
    """One consumed queue: its robust queue, handler, and consumer tag while consuming."""

    __slots__ = ("handler", "held", "queue", "tag")

    def __init__(self, queue: AbstractRobustQueue, handler: InboundHandler, *, held: bool) -> None:
        self.queue = queue
        self.handler = handler
        self.held = held
        self.tag: str | None = None

    @property
    def consuming(self) -> bool:
        return self.tag is not None

    async def start(self) -> None:
        if self.tag is None:
            self.tag = await self.queue.consume(self.handler.incoming, no_ack=False)

    async def stop(self) -> None:
        tag, self.tag = self.tag, None
        if tag is None:
            return
        try:
            await self.queue.cancel(tag)
        except CANCEL_ERRORS as exc:
            log.warning("consumer_cancel_failed", queue=self.queue.name, error=str(exc))
