"""The reaper: a job whose worker stopped renewing its lease runs again.

A lease that expired makes its row due again (``retrying``, published by the
relay) or, with its attempts spent, ``dead``. The fencing by attempt number
keeps a slow but alive worker from writing over the new attempt.
"""

from __future__ import annotations

import asyncio
import json

import structlog

from coldbrew.errors import BrokerUnavailable
from coldbrew.metrics import Metrics
from coldbrew.store import JobStore
from coldbrew.transport import Broker
from coldbrew.worker.service import Periodic

log = structlog.get_logger("coldbrew.reaper")

BATCH = 500


class Reaper:
    """Reaps expired leases; several workers may run it at once (SKIP LOCKED)."""

    name = "reaper"

    def __init__(self, store: JobStore, broker: Broker, metrics: Metrics, *, interval: float):
        self.store = store
        self.broker = broker
        self.metrics = metrics
        self.interval = interval

    async def run(self, stop: asyncio.Event) -> None:
        loop = Periodic(self.name, self.reap_expired, interval=self.interval, full_batch=BATCH)
        await loop.run(stop)

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
