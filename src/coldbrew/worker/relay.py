"""The relay: PostgreSQL is the clock; rows that are due are published.

One mechanism for every "run this later": a submission whose publish was never
confirmed, a retry whose ``run_at`` has come, a job whose worker stopped
renewing its lease. Each becomes a row with ``publish_after`` in the past; the
relay publishes those with confirms and clears the mark only after the
broker confirmed. No delay queues, no sleeping in the worker.
"""

from __future__ import annotations

import asyncio

import structlog

from coldbrew.metrics import Metrics
from coldbrew.store import JobStore
from coldbrew.transport import Broker
from coldbrew.worker.service import Periodic

log = structlog.get_logger("coldbrew.relay")


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

    async def publish_due(self) -> int:
        """Publish one batch of due rows; return how many were due."""
        rows = await self.store.outbox.take_due_publishes(self.batch, self.retry_after)
        if not rows:
            return 0
        confirmed = await self.broker.publish_jobs(rows)
        marks = [(row.id, row.publish_after) for row, ok in zip(rows, confirmed, strict=True) if ok]
        await self.store.outbox.mark_published(marks)
        for row, ok in zip(rows, confirmed, strict=True):
            if ok:
                cause = "submission" if row.attempt == 0 else "retry"
                self.metrics.relay_published.labels(cause).inc()
        log.debug("relay_published", due=len(rows), confirmed=len(marks))
        return len(rows)

    async def run(self, stop: asyncio.Event) -> None:
        loop = Periodic(self.name, self.publish_due, interval=self.interval, full_batch=self.batch)
        await loop.run(stop)
