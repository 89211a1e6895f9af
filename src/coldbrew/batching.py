"""Group commit: many concurrent callers, one statement.

Callers ``await batcher.submit(item)``; items that arrive while a flush is in
flight wait and go together in the next one. There is no timer: an idle
system flushes a lone item at once, a busy one flushes big batches. This is
where coldbrew's throughput is won (DESIGN §3), not in the broker.

Under load a batch is still only what arrived during one flush (~1 ms), and
each statement has a fixed cost in PostgreSQL (~200 µs of CPU for the claim
at any size: commit, WAL flush, executor start-up), so ``gather_turns`` lets
the event loop turn a few times before the next batch is taken -- but only
right after a batch of more than one item, i.e. while callers are
concurrent. Deliveries and jobs already on the loop then join: in
bench/throughput.py, 8 turns took the claim and completion batches from ~6 to
~15 items and PostgreSQL's CPU per job from ~117 to ~86 µs. A lone caller
(an idle system) is still flushed at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import structlog

T = TypeVar("T")
R = TypeVar("R")

log = structlog.get_logger("coldbrew.batching")


class GroupCommit(Generic[T, R]):
    """Runs ``flush(items) -> results`` (same length, same order) over accumulated items."""

    def __init__(
        self,
        name: str,
        flush: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        *,
        max_batch: int = 500,
        gather_turns: int = 0,
    ) -> None:
        self.name = name
        self._flush = flush
        self._max_batch = max_batch
        self._gather_turns = gather_turns
        self._last_size = 0
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.items = 0

    async def submit(self, item: T) -> R:
        """Queue ``item`` for the next flush and wait for its own result (or exception)."""
        return await self.enqueue(item)

    def enqueue(self, item: T) -> asyncio.Future[R]:
        """Queue ``item`` for the next flush; the future gets its result (or exception).

        The write goes ahead whether or not anybody still waits for it, so a
        caller that must not lose it can ``asyncio.shield`` the future (no task).
        """
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"group-commit:{self.name}")
        return future

    async def _run(self) -> None:
        try:
            while self._pending:
                if self._last_size > 1:
                    await self._gather()
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                self._last_size = len(batch)
                await self._flush_one(batch)
        finally:
            self._task = None
            if self._pending:  # raced with a cancellation: never strand a waiter
                self._task = asyncio.create_task(self._run(), name=f"group-commit:{self.name}")

    async def _gather(self) -> None:
        """Let the loop turn up to ``gather_turns`` times, or until a batch is full."""
        for _ in range(self._gather_turns):
            if len(self._pending) >= self._max_batch:
                return
            await asyncio.sleep(0)

    async def _flush_one(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        self.batches += 1
        self.items += len(batch)
        try:
            results = await self._flush([item for item, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - every waiter gets the flush's own error
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        if len(results) != len(batch):
            error = RuntimeError(f"{self.name}: flush returned {len(results)} for {len(batch)}")
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def close(self) -> None:
        """Wait for the flush in flight (if any) to finish."""
        task = self._task
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
