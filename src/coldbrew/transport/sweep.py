"""The aging sweep's consumer: take a queue's ready messages at once, past its priority order.

RabbitMQ delivers a priority queue's highest priorities first; a low one can
wait behind them for as long as they keep coming. The sweep (policy in
``aging.py``, service in ``worker/aging_sweep.py``) looks at what is ready in
one go: a consumer of its own, on a channel of its own, with a prefetch as
large as what is taken, collects deliveries until it has what was ready,
none came for ``quiet_seconds``, or ``max_seconds`` passed; then it is
cancelled. The messages stay unacked on that channel: the caller keeps some
(they settle like any delivery) and requeues the rest. The channel stays
open for the kept ones; a delivery arriving after the collection ended goes
straight back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiormq
import structlog
from aio_pika.abc import AbstractRobustChannel, AbstractRobustQueue

from coldbrew.errors import BrokerUnavailable
from coldbrew.transport.connection import BrokerConnection
from coldbrew.transport.inbound import Inbound, InboundHandler, requeue_all

log = structlog.get_logger("coldbrew.broker")

SWEEP_ERRORS: tuple[type[Exception], ...] = (
    # The passive declare, basic.qos and basic.consume RPCs on the sweep
    # channel: aiormq's ChannelInvalidStateError once that channel is closed
    # or closing (a RuntimeError: with the bare RuntimeError of opening a
    # channel, see connection.CHANNEL_ERRORS, the RuntimeErrors the aging
    # sweep used to catch); the close reason of the channel or connection
    # lost during the RPC (AMQPError). A 404 for a queue gone is a result.
    aiormq.exceptions.ChannelInvalidStateError,
    aiormq.exceptions.AMQPError,
)


@dataclass(frozen=True, slots=True)
class Sweep:
    """What a sweep took: the queue's ready count, then the messages."""

    ready: int
    messages: list[Inbound]

    @property
    def drained(self) -> bool:
        """Whether it took every message that was ready when it began."""
        return len(self.messages) >= self.ready


class _Collection:
    """The sweep consumer's callback and what it took, until ``close()``."""

    def __init__(self, want: int) -> None:
        self.want = want
        self.taken: list[Inbound] = []
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._enough = asyncio.Event()
        self._collecting = True

    async def take(self, message: Inbound) -> None:
        if not self._collecting:
            await message.requeue()
            return
        self.taken.append(message)
        self._last = self._loop.time()
        if len(self.taken) >= self.want:
            self._enough.set()

    async def wait(self, quiet_seconds: float, max_seconds: float) -> None:
        """Until it has ``want``, none came for ``quiet_seconds``, or ``max_seconds`` passed."""
        loop = self._loop
        deadline = loop.time() + max_seconds
        while not self._enough.is_set() and loop.time() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._enough.wait(), timeout=quiet_seconds)
            if loop.time() - self._last >= quiet_seconds:
                break

    def close(self) -> None:
        """From now on a delivery goes straight back."""
        self._collecting = False


class Sweeper:
    """Sweeps queues one at a time on a channel of its own."""

    def __init__(self, connection: BrokerConnection) -> None:
        self._connection = connection
        self._channel: AbstractRobustChannel | None = None

    async def sweep(
        self,
        queue_name: str,
        *,
        limit: int,
        quiet_seconds: float,
        max_seconds: float,
        on_start: Callable[[int], Awaitable[None]] | None = None,
    ) -> Sweep:
        """Take up to ``limit`` of ``queue_name``'s ready messages (nothing if it is gone).

        Raises ``BrokerUnavailable`` when the broker cannot be reached.
        """
        channel = await self._sweeping_channel()
        try:
            queue = await self._declare(channel, queue_name)
            result = queue.declaration_result if queue is not None else None
            ready = result.message_count or 0 if result is not None else 0
            if queue is None or ready == 0:
                return Sweep(0, [])
            want = min(ready, limit)
            if on_start is not None:  # told how many it may take, before it takes any
                await on_start(want)
            await channel.set_qos(prefetch_count=want)
            collection = _Collection(want)
            handler = InboundHandler(collection.take)
            tag = await queue.consume(handler.incoming, no_ack=False, robust=False)
        except SWEEP_ERRORS as exc:
            raise BrokerUnavailable(f"aging sweep of {queue_name}: {exc!r}") from exc
        try:
            await collection.wait(quiet_seconds, max_seconds)
        except BaseException:
            collection.close()
            await requeue_all(collection.taken)
            raise
        finally:
            collection.close()
            await self._cancel(queue, tag)
        return Sweep(ready, list(collection.taken))

    async def _sweeping_channel(self) -> AbstractRobustChannel:
        channel = self._channel
        if channel is None or channel.is_closed:
            channel = self._channel = await self._connection.channel()
        return channel

    async def _declare(
        self, channel: AbstractRobustChannel, name: str
    ) -> AbstractRobustQueue | None:
        """The queue, declared passively; None if it does not exist (any more)."""
        try:
            return await channel.declare_queue(name, passive=True, robust=False)
        except aiormq.exceptions.ChannelNotFoundEntity:
            self._channel = None  # the broker closed the channel on the 404
            return None

    @staticmethod
    async def _cancel(queue: AbstractRobustQueue, tag: str) -> None:
        """Stop the sweep consumer; if its channel is gone, so are the deliveries it took."""
        try:
            await queue.cancel(tag)
        except SWEEP_ERRORS as exc:
            log.info(
                "sweep_cancel_failed",
                queue=queue.name,
                reason="channel closed; the broker requeued what the sweep took",
                error=str(exc),
            )
