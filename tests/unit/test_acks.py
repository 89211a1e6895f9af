"""Batched acks: which ``basic.ack`` frames a batch of requested acks becomes."""

from __future__ import annotations

import asyncio

import aiormq

from coldbrew.transport import ChannelAcks


class RecordingChannel:
    """Stands in for aiormq's channel: records the ack frames it would send."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, bool]] = []

    async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.frames.append((delivery_tag, multiple))


def acks_for(delivered: range) -> tuple[ChannelAcks, RecordingChannel]:
    channel = RecordingChannel()
    acks = ChannelAcks(channel)
    for tag in delivered:
        acks.delivered(tag)
    return acks, channel


async def test_a_contiguous_batch_is_one_multiple_ack() -> None:
    acks, channel = acks_for(range(1, 11))
    await asyncio.gather(*(acks.ack(tag) for tag in range(1, 8)))
    assert channel.frames == [(7, True)]
    assert list(acks.outstanding) == [8, 9, 10]


async def test_a_held_delivery_splits_the_batch() -> None:
    """Tag 3 is still held (waiting in the scheduler): it must not be acked by multiple."""
    acks, channel = acks_for(range(1, 7))
    await asyncio.gather(*(acks.ack(tag) for tag in (1, 2, 4, 6)))
    assert channel.frames == [(2, True), (4, False), (6, False)]
    assert list(acks.outstanding) == [3, 5]
    await acks.ack(3)
    assert channel.frames[-1] == (3, True)  # 3 is now the whole prefix


async def test_a_nacked_delivery_leaves_the_prefix() -> None:
    acks, channel = acks_for(range(1, 5))
    assert acks.forget(1)
    await asyncio.gather(*(acks.ack(tag) for tag in (2, 3)))
    assert channel.frames == [(3, True)]
    assert not acks.forget(1)  # settled already


async def test_acking_twice_or_an_unknown_tag_sends_nothing() -> None:
    acks, channel = acks_for(range(1, 3))
    await acks.ack(1)
    await acks.ack(1)
    await acks.ack(99)
    assert channel.frames == [(1, True)]


async def test_a_failed_write_reaches_every_waiter() -> None:
    class Closed(RecordingChannel):
        async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
            # what aiormq raises for a connection lost under the write (a ConnectionError)
            raise aiormq.exceptions.AMQPConnectionError("channel closed")

    acks = ChannelAcks(Closed())
    acks.delivered(1)
    acks.delivered(2)
    results = await asyncio.gather(acks.ack(1), acks.ack(2), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)


async def test_batches_are_written_one_after_another() -> None:
    """A later multiple=True must not overtake an earlier single ack of a tag it covers."""

    class SlowChannel(RecordingChannel):
        async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
            await asyncio.sleep(0.01)  # another batch could start meanwhile
            self.frames.append((delivery_tag, multiple))

    channel = SlowChannel()
    acks = ChannelAcks(channel)
    for tag in range(1, 5):
        acks.delivered(tag)
    first = [acks.ack(1), acks.ack(3)]
    await asyncio.sleep(0.005)  # the first batch is being written
    second = [acks.ack(2), acks.ack(4)]
    await asyncio.gather(*first, *second)
    assert channel.frames == [(1, True), (3, False), (4, True)]
