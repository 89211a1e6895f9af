"""Group commit: what accumulates while a flush is in flight goes in the next one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from coldbrew.batching import GroupCommit


class Recorder:
    """A flush that records its batches and can be held open by the test."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: Exception | None = None
        self.short = False

    async def flush(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        results = [item * 10 for item in items]
        return results[:-1] if self.short else results


async def test_a_lone_item_is_flushed_at_once_and_gets_its_own_result() -> None:
    rec = Recorder()
    batcher = GroupCommit("t", rec.flush)
    assert await asyncio.wait_for(batcher.submit(4), timeout=1) == 40
    assert rec.batches == [[4]]


async def test_items_arriving_during_a_flush_go_together_in_the_next() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = GroupCommit("t", rec.flush)
    first = asyncio.ensure_future(batcher.submit(1))
    await asyncio.sleep(0.01)  # the first flush is now in flight, held by the gate
    rest = [asyncio.ensure_future(batcher.submit(n)) for n in (2, 3, 4)]
    await asyncio.sleep(0.01)
    rec.gate.set()
    assert await asyncio.gather(first, *rest) == [10, 20, 30, 40]
    assert rec.batches == [[1], [2, 3, 4]]
    assert (batcher.batches, batcher.items) == (2, 4)


async def test_max_batch_splits_a_backlog() -> None:
    rec = Recorder()
    rec.gate.clear()
    batcher = GroupCommit("t", rec.flush, max_batch=2)
    futures = [batcher.enqueue(n) for n in range(5)]
    rec.gate.set()
    assert await asyncio.gather(*futures) == [0, 10, 20, 30, 40]
    assert rec.batches == [[0, 1], [2, 3], [4]]


async def test_a_failed_flush_fails_every_waiter_of_that_batch_only() -> None:
    rec = Recorder()
    rec.fail = RuntimeError("database went away")
    batcher = GroupCommit("t", rec.flush)
    results = await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    rec.fail = None
    assert await batcher.submit(3) == 30


async def test_a_flush_that_loses_results_is_an_error_not_a_misrouted_result() -> None:
    rec = Recorder()
    rec.short = True
    batcher = GroupCommit("t", rec.flush)
    with pytest.raises(RuntimeError, match="returned 0 for 1"):
        await batcher.submit(1)


async def test_a_cancelled_waiter_does_not_cancel_its_write() -> None:
    """``enqueue`` + ``shield``: the runner's way to keep an outcome when its job is cancelled."""
    rec = Recorder()
    rec.gate.clear()
    batcher = GroupCommit("t", rec.flush)
    future = batcher.enqueue(7)
    waiter = asyncio.ensure_future(asyncio.shield(future))
    await asyncio.sleep(0.01)
    waiter.cancel()
    rec.gate.set()
    assert await asyncio.wait_for(future, timeout=1) == 70
    assert waiter.cancelled()
    await batcher.close()


async def _trickle(batcher: GroupCommit[int, int], values: range) -> list[int]:
    """Submit one item per event-loop turn, as deliveries reach a busy worker."""
    futures = []
    for value in values:
        futures.append(batcher.enqueue(value))
        await asyncio.sleep(0)
    return list(await asyncio.gather(*futures))


@pytest.mark.parametrize("turns", [0, 8])
async def test_gather_turns_let_a_busy_batch_wait_for_company(turns: int) -> None:
    """After a batch of several, the next waits ``turns`` loop turns: a trickle joins it."""
    rec = Recorder()
    rec.gate.clear()
    batcher = GroupCommit("t", rec.flush, gather_turns=turns)
    held = [batcher.enqueue(n) for n in (100, 101)]  # busy: the first batch is in flight...
    await asyncio.sleep(0)
    backlog = [batcher.enqueue(n) for n in (102, 103)]  # ...and the next holds two
    rec.gate.set()
    trickled = await _trickle(batcher, range(6))
    await asyncio.gather(*held, *backlog)
    assert trickled == [0, 10, 20, 30, 40, 50]
    sizes = [len(b) for b in rec.batches]
    if turns:
        assert sizes == [2, 8]  # the trickle joined the backlog's batch
    else:
        assert len(sizes) >= 4, sizes  # without: the trickle went out a few at a time


async def test_a_lone_item_never_waits_for_company() -> None:
    """An idle system (last batch of one) is flushed at once, gather_turns or not."""
    rec = Recorder()
    batcher = GroupCommit("t", rec.flush, gather_turns=50)
    for n in range(3):
        assert await batcher.submit(n) == n * 10
    assert rec.batches == [[0], [1], [2]]


async def test_a_lone_item_after_a_busy_batch_is_flushed_without_gathering() -> None:
    """A steady low rate (#19 item 3): one item met a batch of two in flight. With nobody
    else waiting when that flush returns, it is flushed at once, not after the turns."""
    rec = Recorder()
    rec.gate.clear()
    batcher = GroupCommit("t", rec.flush, gather_turns=50)
    held = [batcher.enqueue(n) for n in (100, 101)]  # a batch of two in flight...
    await asyncio.sleep(0)
    lone = batcher.enqueue(102)  # ...and one waiting behind it
    rec.gate.set()
    turns = 0
    while len(rec.batches) < 2:
        await asyncio.sleep(0)
        turns += 1
        assert turns < 10, "the lone item waited for company"
    assert rec.batches == [[100, 101], [102]]
    assert await asyncio.gather(*held, lone) == [1000, 1010, 1020]


# --- one item's bad data fails only that item -------------------------------------------


class BadItem(ValueError):
    """Stands for PostgreSQL refusing one item's data (errors.DataRefused)."""


class Picky:
    """A flush that refuses any batch holding a bad item, as one SQL statement would."""

    def __init__(self, bad: set[int], error: type[Exception] = BadItem) -> None:
        self.bad = bad
        self.error = error
        self.batches: list[list[int]] = []

    async def flush(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        if found := [item for item in items if item in self.bad]:
            raise self.error(f"item {found[0]} is refused")
        return [item * 10 for item in items]


async def settle_all(batcher: GroupCommit[int, int], items: range) -> list[int | Exception]:
    futures = [batcher.enqueue(item) for item in items]  # all in one batch
    return list(await asyncio.gather(*futures, return_exceptions=True))


async def test_one_bad_item_fails_alone_and_the_rest_commit() -> None:
    """The batch is split in halves until the bad item is alone: 2·log2(n) more flushes."""
    picky = Picky(bad={5})
    batcher = GroupCommit("t", picky.flush, isolate=(BadItem,))
    results = await settle_all(batcher, range(16))
    assert isinstance(results[5], BadItem) and "item 5" in str(results[5])
    assert [r for i, r in enumerate(results) if i != 5] == [i * 10 for i in range(16) if i != 5]
    assert picky.batches[0] == list(range(16))
    assert [5] in picky.batches
    committed = [batch for batch in picky.batches if 5 not in batch]
    assert sorted(item for batch in committed for item in batch) == [
        i for i in range(16) if i != 5
    ]  # every good item committed exactly once
    assert len(picky.batches) <= 1 + 2 * 4
    assert (batcher.batches, batcher.items, batcher.isolated) == (1, 16, 4)


async def test_several_bad_items_each_get_their_own_error() -> None:
    picky = Picky(bad={0, 7, 8})
    batcher = GroupCommit("t", picky.flush, isolate=(BadItem,))
    results = await settle_all(batcher, range(9))
    failed = [i for i, r in enumerate(results) if isinstance(r, BadItem)]
    assert failed == [0, 7, 8]
    assert all(f"item {i}" in str(results[i]) for i in failed)
    assert [results[i] for i in (1, 2, 3, 4, 5, 6)] == [10, 20, 30, 40, 50, 60]


async def test_a_lone_bad_item_is_not_retried() -> None:
    picky = Picky(bad={3})
    batcher = GroupCommit("t", picky.flush, isolate=(BadItem,))
    with pytest.raises(BadItem):
        await batcher.submit(3)
    assert picky.batches == [[3]]


async def test_other_errors_still_fail_the_whole_batch_without_retries() -> None:
    """An outage is everybody's: no split, one flush, every waiter gets it."""
    picky = Picky(bad={2}, error=ConnectionError)
    batcher = GroupCommit("t", picky.flush, isolate=(BadItem,))
    results = await settle_all(batcher, range(6))
    assert all(isinstance(r, ConnectionError) for r in results)
    assert picky.batches == [list(range(6))]
    assert batcher.isolated == 0


async def test_without_isolate_a_bad_item_fails_its_batch() -> None:
    """The default (the release batcher): the old behaviour, one error for all."""
    picky = Picky(bad={1})
    batcher = GroupCommit("t", picky.flush)
    results = await settle_all(batcher, range(4))
    assert all(isinstance(r, BadItem) for r in results)
    assert len(picky.batches) == 1


async def test_items_queued_during_an_isolation_go_in_the_next_batch() -> None:
    picky = Picky(bad={1})
    batcher = GroupCommit("t", picky.flush, isolate=(BadItem,))
    first = [batcher.enqueue(item) for item in range(4)]
    await asyncio.sleep(0)  # the flush task starts; these arrive while it isolates
    later = [batcher.enqueue(item) for item in range(10, 13)]
    results = await asyncio.gather(*first, *later, return_exceptions=True)
    assert isinstance(results[1], BadItem)
    assert results[4:] == [100, 110, 120]
    assert picky.batches[-1] == [10, 11, 12]


# --- lingering: an item whose caller can wait holds its flush for company ------------------


async def test_lingering_items_share_one_flush_at_the_first_deadline() -> None:
    """A trickle of items that may wait 50 ms goes out as one batch, not one each."""
    rec = Recorder()
    batcher = GroupCommit("t", rec.flush)
    loop = asyncio.get_running_loop()
    began = loop.time()
    futures = []
    for n in range(4):
        futures.append(batcher.enqueue(n, linger=0.05))
        await asyncio.sleep(0.005)
    assert await asyncio.gather(*futures) == [0, 10, 20, 30]
    assert rec.batches == [[0, 1, 2, 3]]
    assert loop.time() - began >= 0.045  # it waited for the first item's deadline
    assert batcher.lingered == 1


async def test_a_lingering_item_is_flushed_by_its_deadline_when_alone() -> None:
    rec = Recorder()
    batcher = GroupCommit("t", rec.flush)
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await asyncio.wait_for(batcher.submit(7, linger=0.03), timeout=1) == 70
    assert 0.025 <= loop.time() - began < 0.5
    assert rec.batches == [[7]]


async def test_an_eager_item_takes_the_lingering_ones_along_at_once() -> None:
    """An item without linger never waits for lingering ones: it flushes them with it now."""
    rec = Recorder()
    batcher = GroupCommit("t", rec.flush)
    loop = asyncio.get_running_loop()
    lingering = [batcher.enqueue(n, linger=10.0) for n in (1, 2)]
    await asyncio.sleep(0.01)
    assert rec.batches == []  # still lingering
    began = loop.time()
    assert await asyncio.wait_for(batcher.submit(3), timeout=1) == 30
    assert loop.time() - began < 0.5
    assert await asyncio.gather(*lingering) == [10, 20]
    assert rec.batches == [[1, 2, 3]]


async def test_a_shorter_linger_moves_the_flush_earlier() -> None:
    rec = Recorder()
    batcher = GroupCommit("t", rec.flush)
    long = batcher.enqueue(1, linger=10.0)
    await asyncio.sleep(0.01)
    assert await asyncio.wait_for(batcher.submit(2, linger=0.02), timeout=1) == 20
    assert await long == 10
    assert rec.batches == [[1, 2]]


async def test_a_full_batch_does_not_linger() -> None:
    rec = Recorder()
    batcher = GroupCommit("t", rec.flush, max_batch=3)
    futures = [batcher.enqueue(n, linger=10.0) for n in range(3)]
    assert await asyncio.wait_for(asyncio.gather(*futures), timeout=1) == [0, 10, 20]
    assert rec.batches == [[0, 1, 2]]


async def test_close_flushes_what_lingers_and_later_items_do_not_linger() -> None:
    """A drain or shutdown never waits out a linger: close() sends it at once."""
    rec = Recorder()
    batcher = GroupCommit("t", rec.flush)
    future = batcher.enqueue(5, linger=10.0)
    await asyncio.sleep(0.01)
    await asyncio.wait_for(batcher.close(), timeout=1)
    assert future.result() == 50
    assert await asyncio.wait_for(batcher.submit(6, linger=10.0), timeout=1) == 60
    assert rec.batches == [[5], [6]]


async def test_items_arriving_while_a_lingering_batch_flushes_linger_again() -> None:
    """After a lingered flush, the items that came meanwhile wait for their own deadline."""
    rec = Recorder()
    rec.gate.clear()
    batcher = GroupCommit("t", rec.flush)
    first = batcher.enqueue(1, linger=0.01)
    await asyncio.sleep(0.03)  # flushed at its deadline, held in flight by the gate
    assert rec.batches == [[1]]
    later = [batcher.enqueue(n, linger=0.05) for n in (2, 3)]
    rec.gate.set()
    await asyncio.sleep(0.02)
    assert rec.batches == [[1]]  # 2 and 3 still linger
    assert await asyncio.gather(first, *later) == [10, 20, 30]
    assert rec.batches == [[1], [2, 3]]
