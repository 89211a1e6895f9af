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
(an idle system) is still flushed at once, and so is a lone item waiting
after a batch of several (#19 item 3): at a steady low rate (500 jobs/s) a
job's claim or outcome often meets one other in flight, and the turns the
lone next item then waited were spent running everything else on the loop
-- a start-latency cost, and no company came (company shows as more than one
item waiting when the flush returns, as under load).

One item's bad data (a NUL PostgreSQL refuses, a number out of range) fails
the whole statement, which would fail every other caller in the batch with
an error that is not theirs. Errors of the types in ``isolate`` therefore
split the batch in halves and flush each again, down to single items: the
good ones commit and only the bad one gets the error. A statement that
failed wrote nothing, so flushing its items again is safe. One bad item
among n costs about 2·log2(n) more statements; it is the exception path,
not the throughput one.

**Lingering** (``enqueue(item, linger=s)``): an item whose caller can wait
may hold its flush up to ``s`` seconds for company. The flush goes when
the earliest deadline among the waiting items passes, when an item that
does not linger arrives, when a batch is full, or at ``close()``; so a
lingering item never delays an eager one, and the default (no linger) is
the timer-free behaviour above. This is for CPU-bound pool jobs (issue #19
item 4): their claims and outcomes come one at a time, every few ms, when
no caller is concurrent, and each alone pays a commit and a WAL flush whose
CPU, on a machine whose cores the pool's children fill, is taken from the
children. The callers decide when waiting is free (worker/runner.py).
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
        isolate: tuple[type[Exception], ...] = (),
    ) -> None:
        self.name = name
        self._flush = flush
        self._max_batch = max_batch
        self._gather_turns = gather_turns
        self._isolate = isolate
        self._last_size = 0
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._deadlines: list[float] = []  # per pending item: when it stops waiting (loop time)
        self._flush_at = float("inf")  # the earliest of ``_deadlines``
        self._waker: asyncio.Future[None] | None = None  # set while the flush lingers
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.items = 0
        self.isolated = 0  # batches split because an item's data failed them
        self.lingered = 0  # flushes that waited for a lingering item's company

    async def submit(self, item: T, *, linger: float = 0.0) -> R:
        """Queue ``item`` for the next flush and wait for its own result (or exception)."""
        return await self.enqueue(item, linger=linger)

    def enqueue(self, item: T, *, linger: float = 0.0) -> asyncio.Future[R]:
        """Queue ``item`` for the next flush; the future gets its result (or exception).

        ``linger`` > 0: the item may wait up to that many seconds for other
        items to share its flush (see the module docstring); 0 flushes as soon
        as no flush is in flight. The write goes ahead whether or not anybody
        still waits for it, so a caller that must not lose it can
        ``asyncio.shield`` the future (no task).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        deadline = loop.time() + linger if linger > 0 and not self._closing else 0.0
        self._pending.append((item, future))
        self._deadlines.append(deadline)
        if deadline < self._flush_at:
            self._flush_at = deadline
            self._wake()  # a lingering flush must now go sooner (or at once)
        elif len(self._pending) >= self._max_batch:
            self._wake()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"group-commit:{self.name}")
        return future

    async def _run(self) -> None:
        try:
            while self._pending:
                if self._last_size > 1 and len(self._pending) > 1:
                    await self._gather()
                await self._linger()
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                del self._deadlines[: self._max_batch]
                self._flush_at = min(self._deadlines, default=float("inf"))
                self._last_size = len(batch)
                await self._flush_one(batch)
        finally:
            self._task = None
            if self._pending:  # raced with a cancellation: never strand a waiter
                self._task = asyncio.create_task(self._run(), name=f"group-commit:{self.name}")

    async def _linger(self) -> None:
        """Hold the next flush while every waiting item lingers and none's deadline passed."""
        loop = asyncio.get_running_loop()
        lingered = False
        while (
            not self._closing
            and len(self._pending) < self._max_batch
            and self._flush_at > loop.time()
        ):
            lingered = True
            waker: asyncio.Future[None] = loop.create_future()
            self._waker = waker
            timer = loop.call_at(self._flush_at, _set_done, waker)
            try:
                await waker
            finally:
                timer.cancel()
                self._waker = None
        if lingered:
            self.lingered += 1

    def _wake(self) -> None:
        """Cut a lingering wait short: the deadline moved, the batch is full, or closing."""
        if self._waker is not None:
            _set_done(self._waker)

    async def _gather(self) -> None:
        """Let the loop turn up to ``gather_turns`` times, or until a batch is full."""
        for _ in range(self._gather_turns):
            if len(self._pending) >= self._max_batch:
                return
            await asyncio.sleep(0)

    async def _flush_one(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        self.batches += 1
        self.items += len(batch)
        await self._settle(batch)

    async def _settle(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        """Flush ``batch`` and resolve its futures; split it on an ``isolate`` error."""
        try:
            results = await self._flush([item for item, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - every waiter gets the flush's own error
            if len(batch) > 1 and isinstance(exc, self._isolate):
                self.isolated += 1
                log.warning(
                    "group_commit_isolating",
                    batcher=self.name,
                    size=len(batch),
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
                half = len(batch) // 2
                await self._settle(batch[:half])
                await self._settle(batch[half:])
                return
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
        """Flush what lingers now, and wait for the flush in flight (if any) to finish."""
        self._closing = True
        self._wake()
        task = self._task
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
