"""Settling the deliveries of one consuming channel: batched acks, nacks, and their tasks.

An ack on its own costs an awaited frame; a busy worker acks thousands a
second. ``ChannelAcks`` gathers the acks requested during one turn of the
event loop into as few ``basic.ack(multiple=True)`` as the held deliveries
allow (bench/README.md "batched acks").
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import aiormq
import structlog

log = structlog.get_logger("coldbrew.broker")

SETTLE_ERRORS: tuple[type[Exception], ...] = (
    # basic_ack / basic_nack on a channel that is closed or closing (the
    # connection dropped, or the broker closed the channel): aiormq's
    # ChannelInvalidStateError, a RuntimeError subclass and the only
    # RuntimeError these calls raise (aiormq/channel.py basic_ack, basic_nack).
    aiormq.exceptions.ChannelInvalidStateError,
    # A frame queued just before the close: its drain future is rejected with
    # the reason of the close, ChannelClosed (e.g. 406 PRECONDITION_FAILED on
    # consumer_timeout) or AMQPConnectionError / ConnectionClosed (socket
    # errors arrive converted, aiormq/connection.py FrameReceiver); and
    # MethodNotImplemented for a server without basic.nack. All AMQPError.
    aiormq.exceptions.AMQPError,
)
"""What settling a delivery raises when its channel is gone: the broker requeued it."""


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

    @property
    def closed(self) -> bool:
        """Whether the channel is gone (every delivery on it went back to the broker)."""
        return bool(self.channel.is_closed)

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
            keep(asyncio.create_task(self._flush_all(), name="ack-batch"))
        return True

    async def nack(self, tag: int, *, requeue: bool) -> None:
        """Nack one delivery (requeued, or to the dead-letter exchange) unless already settled.

        Raises one of ``SETTLE_ERRORS`` when the channel is gone.
        """
        if self.forget(tag):
            await self.channel.basic_nack(tag, multiple=False, requeue=requeue)

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


_SETTLE_TASKS: set[asyncio.Task[Any]] = set()


def keep(task: asyncio.Task[Any]) -> None:
    """Hold a fire-and-forget settle task until it ends; an unexpected error is logged."""
    _SETTLE_TASKS.add(task)
    task.add_done_callback(_settle_task_done)


def _settle_task_done(task: asyncio.Task[Any]) -> None:
    _SETTLE_TASKS.discard(task)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("settle_task_failed", task=task.get_name(), error=repr(exc), exc_info=exc)
