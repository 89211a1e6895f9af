"""Looking at a queue without touching its messages: a passive ``queue.declare``.

The reconciler (worker/reconcile.py) compares what a tenant queue holds with
the rows PostgreSQL says are in it. A passive declare of a missing queue is a
404 that closes its channel, so the look runs on a channel of its own,
reopened after each 404.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiormq
from aio_pika.abc import AbstractRobustChannel

from coldbrew.errors import BrokerUnavailable
from coldbrew.transport.connection import CHANNEL_ERRORS, BrokerConnection
from coldbrew.transport.publish import PUBLISH_ERRORS

INSPECT_TIMEOUT = 5.0
"""Seconds a passive declare may take, reconnecting included (an outage is not waited out)."""


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """A passive ``queue.declare``'s answer: ready messages (unacked ones are not counted)
    and consumers."""

    ready: int
    consumers: int


class QueueInspector:
    """Counts a queue's ready messages and consumers on a channel of its own."""

    def __init__(self, connection: BrokerConnection) -> None:
        self._connection = connection
        self._channel: AbstractRobustChannel | None = None

    async def counts(self, queue_name: str) -> QueueCounts | None:
        """Ready messages and consumers of ``queue_name``; None if the queue is missing."""
        try:
            async with asyncio.timeout(INSPECT_TIMEOUT):
                channel = await self._inspecting_channel()
                queue = await channel.declare_queue(queue_name, passive=True, robust=False)
        except aiormq.exceptions.ChannelNotFoundEntity:  # the 404 closed the channel
            self._channel = None
            return None
        except (*PUBLISH_ERRORS, *CHANNEL_ERRORS) as exc:
            self._channel = None
            raise BrokerUnavailable(f"counting {queue_name}: {exc or type(exc).__name__}") from exc
        declared = queue.declaration_result
        return QueueCounts(declared.message_count or 0, declared.consumer_count or 0)

    async def _inspecting_channel(self) -> AbstractRobustChannel:
        channel = self._channel
        if channel is None or channel.is_closed:
            channel = self._channel = await self._connection.channel(publisher_confirms=False)
        return channel
