"""Retiring a queue of the other layout (``coldbrew queues migrate``): unbind, move, delete.

A queue's type cannot change, so a namespace switches between classic and
quorum queues (or between band layouts) by declaring the new queues and
retiring the old ones. Retiring one queue here is, in order: unbind it (no new
message lands in it), move every message it holds to the new layout (each
published again with confirms, then acked: a message is in one queue or the
other, or briefly both, never neither), and delete it once it is empty.
PostgreSQL stays the truth: a row whose message a crash lost during the move
is found by the reconciler (worker/reconcile.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange

from coldbrew.errors import BrokerUnavailable
from coldbrew.transport.connection import CHANNEL_ERRORS, BrokerConnection
from coldbrew.transport.publish import PUBLISH_ERRORS, copy_of

KeyFor = Callable[[str | None, int | None], str]
"""The routing key a moved message goes on with, from its (routing key, priority)."""

MOVE_PASSES = 5
"""Moves before giving up on a queue that keeps refilling (its bindings are gone, so only a
publish already in flight can still land in it)."""


@dataclass(frozen=True, slots=True)
class Retired:
    """What retiring one queue did."""

    name: str
    moved: int
    deleted: bool
    dropped: int = 0
    """Messages the delete found after the last move (a publish in flight past the unbind;
    their rows, if any, are found by the reconciler)."""


class QueueRetirer:
    """Unbinds, empties and deletes queues on a confirming channel of its own."""

    def __init__(self, connection: BrokerConnection, *, timeout: float) -> None:
        self._connection = connection
        self._timeout = timeout
        self._channel: AbstractChannel | None = None

    async def unbind(self, name: str, bindings: Sequence[tuple[str, str]]) -> None:
        """Unbind ``name`` from each (exchange, key): no new message lands in it. Every old
        queue is unbound before any is emptied, or a message moved out of one would be
        routed into another old queue still bound with the same key."""
        try:
            channel = await self._open()
            queue = await channel.get_queue(name, ensure=False)
            for exchange, key in bindings:
                await queue.unbind(exchange, routing_key=key)
        except (*PUBLISH_ERRORS, *CHANNEL_ERRORS) as exc:
            self._channel = None
            raise BrokerUnavailable(f"unbinding {name}: {exc or type(exc).__name__}") from exc

    async def retire(self, name: str, *, move_to: str, key_for: KeyFor) -> Retired:
        """Move an unbound queue's messages to the exchange ``move_to`` (``""``: the default
        exchange) with ``key_for``'s keys, then delete it."""
        try:
            channel = await self._open()
            queue = await channel.get_queue(name, ensure=False)
            target = (
                channel.default_exchange
                if move_to == ""
                else await channel.get_exchange(move_to, ensure=False)
            )
            moved = 0
            for _ in range(MOVE_PASSES):
                moved += await self._move(queue, target, key_for)
                declared = await channel.declare_queue(name, passive=True)
                if declared.declaration_result.message_count:
                    continue  # refilled by a publish in flight before the unbind
                # quorum queues refuse ``if_empty`` (a connection error), so the count above
                # is the check; what a publish slipped in since is counted, not hidden
                deleted = await queue.delete(if_unused=False, if_empty=False)
                return Retired(name, moved, deleted=True, dropped=deleted.message_count or 0)
            return Retired(name, moved, deleted=False)
        except (*PUBLISH_ERRORS, *CHANNEL_ERRORS) as exc:
            self._channel = None
            raise BrokerUnavailable(f"retiring {name}: {exc or type(exc).__name__}") from exc

    async def _move(
        self, queue: aio_pika.abc.AbstractQueue, target: AbstractExchange, key_for: KeyFor
    ) -> int:
        moved = 0
        while True:
            message = await queue.get(no_ack=False, fail=False, timeout=self._timeout)
            if message is None:
                return moved
            key = key_for(message.routing_key, message.priority)
            await target.publish(
                copy_of(message), routing_key=key, mandatory=False, timeout=self._timeout
            )  # confirmed before the ack: the message is never in neither queue
            await message.ack()
            moved += 1

    async def _open(self) -> AbstractChannel:
        channel = self._channel
        if channel is None or channel.is_closed:
            channel = self._channel = await self._connection.channel(publisher_confirms=True)
        return channel
