"""The relay: PostgreSQL is the clock; rows that are due are published.

One mechanism for every "run this later": a submission whose publish was never
confirmed, a retry whose ``run_at`` has come, a job whose worker stopped
renewing its lease, a scheduled job (``submit(run_at=)``, a snooze) whose time
came. Each becomes a row with ``publish_after`` in the past; the relay
publishes those with confirms and clears the mark only after the broker
confirmed. No delay queues, no sleeping in the worker.

A scheduled row turns ``queued`` in the statement that takes it, and its mark
is pushed ``retry_after`` ahead at the same time: a relay that dies before the
broker confirmed leaves a queued row that the next pass publishes again (never
lost; a second message is a duplicate, harmless by guarantee 5). Between
ticks the relay sleeps until the earliest mark ahead when that comes before
the next tick (one probe of the ``publish_after`` index), so a job scheduled
for a moment starts within milliseconds of it rather than within an interval.

Rows made due by a transaction the worker did not run -- a submission in
the caller's transaction, child jobs, a chain's next step -- come with a
NOTIFY on ``<ns>.relay``, delivered at commit; the tenant watch's LISTEN
connection hears it (``TenantQueues.also_listen``: no connection of its own)
and ``wake`` ends the relay's sleep, so they are published within a pass,
not an interval. A NOTIFY lost while that connection was down costs at most
one interval.
"""

from __future__ import annotations

import asyncio

import structlog

from coldbrew.metrics import Metrics
from coldbrew.store import JobStore
from coldbrew.transport import Broker
from coldbrew.worker.service import Periodic

log = structlog.get_logger("coldbrew.relay")

WAKE_SLACK = 0.002
"""Seconds the relay oversleeps a mark it wakes for, so that the mark is past when it looks."""


class Relay:
    """Publishes due rows; several workers may run it at once (SKIP LOCKED)."""

    name = "relay"

    def __init__(
        self,
        store: JobStore,
        broker: Broker,
        metrics: Metrics,
        *,
        interval: float,
        batch: int = 500,
        retry_after: float = 30.0,
    ) -> None:
        self.interval = interval
        self.store = store
        self.broker = broker
        self.metrics = metrics
        self.batch = batch
        self.retry_after = retry_after
        self._wake_at: float | None = None  # loop time of the earliest mark ahead
        self.woken = asyncio.Event()
        """Set (``wake``) when a NOTIFY says a committed transaction made rows due."""

    def wake(self, _payload: str = "") -> None:
        """End the sleep between passes: rows are due now (a ``<ns>.relay`` NOTIFY)."""
        self.woken.set()

    async def publish_due(self) -> int:
        """Publish one batch of due rows; return how many were due."""
        rows = await self.store.outbox.take_due_publishes(self.batch, self.retry_after)
        if len(rows) < self.batch:  # caught up: when is the next mark due?
            wake_in = await self.store.outbox.next_due_in(self.interval)
            if wake_in is not None:
                self._wake_at = asyncio.get_running_loop().time() + wake_in
        if not rows:
            return 0
        confirmed = await self.broker.publish_jobs(rows)
        marks = [(row.id, row.publish_after) for row, ok in zip(rows, confirmed, strict=True) if ok]
        await self.store.outbox.mark_published(marks)
        for row, ok in zip(rows, confirmed, strict=True):
            if ok:
                if row.was == "scheduled":
                    cause = "scheduled"
                else:
                    cause = "submission" if row.attempt == 0 else "retry"
                self.metrics.relay_published.labels(cause).inc()
        log.debug("relay_published", due=len(rows), confirmed=len(marks))
        return len(rows)

    def next_wait(self) -> float:
        """Seconds to sleep after a pass that was not full: the interval, or less when a
        mark falls due before it."""
        wake_at, self._wake_at = self._wake_at, None
        if wake_at is None:
            return self.interval
        wake_in = wake_at - asyncio.get_running_loop().time()
        return min(self.interval, max(wake_in, 0.0) + WAKE_SLACK)

    async def run(self, stop: asyncio.Event) -> None:
        loop = Periodic(
            self.name,
            self.publish_due,
            interval=self.interval,
            full_batch=self.batch,
            wait=self.next_wait,
            wake=self.woken,
        )
        await loop.run(stop)
