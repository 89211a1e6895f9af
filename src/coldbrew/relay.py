"""Postgres is the clock: publish rows that are due, and reap expired leases.

One mechanism for every "run this later": a submission whose publish was never
confirmed, a retry whose ``run_at`` has come, a job whose worker stopped
renewing its lease. Each becomes a row with ``publish_after`` in the past; the
relay publishes those with confirms and clears the mark only after the
broker confirmed. No delay queues, no sleeping in the worker.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import structlog

from coldbrew.aio import sleep_unless
from coldbrew.broker import Broker, JobMessage
from coldbrew.errors import BrokerUnavailable, DatabaseUnavailable
from coldbrew.metrics import Metrics
from coldbrew.store import DuePublish, JobStore

log = structlog.get_logger("coldbrew.relay")


def message_for(row: DuePublish) -> JobMessage:
    return JobMessage(
        id=row.id,
        type=row.type,
        queue=row.queue,
        tenant=row.tenant,
        args=row.args,
        priority=row.priority,
        idempotency_key=row.idempotency_key,
        max_attempts=row.max_attempts,
        timeout=row.timeout,
    )


class Relay:
    """Publishes due rows; several workers may run it at once (SKIP LOCKED)."""

    def __init__(
        self,
        store: JobStore,
        broker: Broker,
        metrics: Metrics,
        *,
        batch: int = 500,
        retry_after: float = 30.0,
    ) -> None:
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
        confirmed = await self.broker.publish_jobs([message_for(row) for row in rows])
        marks = [(row.id, row.publish_after) for row, ok in zip(rows, confirmed, strict=True) if ok]
        await self.store.outbox.mark_published(marks)
        for row, ok in zip(rows, confirmed, strict=True):
            if ok:
                cause = "submission" if row.attempt == 0 else "retry"
                self.metrics.relay_published.labels(cause).inc()
        log.debug("relay_published", due=len(rows), confirmed=len(marks))
        return len(rows)

    async def reap_expired(self) -> int:
        """Make jobs whose lease expired due again (or dead); return how many."""
        rows = await self.store.leases.reap_expired()
        for row in rows:
            status = row["status"]
            log.info("lease_expired", job_id=row["id"], attempt=row["attempt"], next_status=status)
            if status == "retrying":
                self.metrics.redeliveries.labels("lease_expired").inc()
            elif status == "dead":
                self.metrics.dead_letters.labels("max_attempts").inc()
                body = json.dumps({"type": row["type"], "args": row["args"]}).encode()
                try:
                    await self.broker.publish_dead(
                        body,
                        reason="max_attempts",
                        detail=row["error_message"] or "",
                        headers={},
                        message_id=row["id"],
                        original_routing_key=f"{row['queue']}.{row['tenant']}",
                    )
                except BrokerUnavailable as exc:
                    log.warning("dead_copy_not_published", job_id=row["id"], error=str(exc))
        return len(rows)


async def run_periodically(
    name: str,
    step: Callable[[], Awaitable[int]],
    *,
    interval: float,
    stop: asyncio.Event,
    full_batch: int,
) -> None:
    """Call ``step`` every ``interval`` (again at once after a full batch) until ``stop``.

    Transient outages are logged and retried with backoff; anything else is a
    bug and propagates to the supervising task group.
    """
    backoff = interval
    while not stop.is_set():
        try:
            done = await step()
        except (DatabaseUnavailable, BrokerUnavailable) as exc:
            log.warning("loop_step_failed", loop=name, error=str(exc), retry_in=backoff)
            backoff = min(backoff * 2, 30.0)
            await sleep_unless(stop, backoff)
            continue
        backoff = interval
        if done < full_batch:
            await sleep_unless(stop, interval)
