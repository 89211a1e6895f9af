"""The reaper: a job whose worker stopped renewing its lease runs again.

A lease that expired makes its row due again (``retrying``, published by the
relay) or, with its attempts spent, ``dead``. The fencing by attempt number
keeps a slow but alive worker from writing over the new attempt.

A lease can also expire only because nobody could reach PostgreSQL: every
worker was alive, running its jobs and retrying its writes. Reaping those
leases the moment the database answers again would run every job in flight
twice, so the reaper reaps nothing until one lease after the database became
reachable again: after the server's own start (``reap_expired`` compares
``pg_postmaster_start_time()``), and after this reaper's own contact came back
(an outage without a restart: a failed step, or a gap between two contacts
longer than a few intervals). The workers meanwhile extend their leases as soon
as they reconnect (heartbeat.py), so only the leases of workers that really
died are still expired when the hold ends.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import structlog

from coldbrew.errors import BrokerUnavailable, DatabaseUnavailable, TransientDatabaseError
from coldbrew.metrics import Metrics
from coldbrew.store import JobStore
from coldbrew.transport import Broker
from coldbrew.worker.service import Periodic

log = structlog.get_logger("coldbrew.reaper")

BATCH = 500


class Reaper:
    """Reaps expired leases; several workers may run it at once (SKIP LOCKED)."""

    name = "reaper"

    def __init__(
        self,
        store: JobStore,
        broker: Broker,
        metrics: Metrics,
        *,
        interval: float,
        lease_seconds: float,
    ) -> None:
        self.store = store
        self.broker = broker
        self.metrics = metrics
        self.interval = interval
        self.lease_seconds = lease_seconds
        # two contacts further apart than this mean this reaper was cut off in between
        self.max_gap = 3 * interval + 2.0
        self._contact: datetime | None = None  # server time of the last statement that answered
        self._lost_contact = False  # a step failed on an outage since that contact
        self._hold_until = 0.0  # monotonic: reap nothing before this (one lease after an outage)
        self._server: tuple[datetime, str] | None = None  # start time and host of the last contact

    @property
    def holding(self) -> bool:
        """Whether the reaper is holding (reaps nothing) after an outage or a failover."""
        return time.monotonic() < self._hold_until

    async def run(self, stop: asyncio.Event) -> None:
        # through an outage, retry every couple of seconds rather than backing off to 30 s:
        # the hold, not a slow retry, is what keeps a returning database from reaping
        loop = Periodic(
            self.name,
            self.reap_expired,
            interval=self.interval,
            full_batch=BATCH,
            backoff_cap=max(self.interval, 2.0),
        )
        await loop.run(stop)

    async def reap_expired(self) -> int:
        """Make jobs whose lease expired due again (or dead); return how many."""
        try:
            now, server_started, node = await self.store.liveness.server_contact()
            server = (server_started, node)
            if self._outage_ended(now) or self._server_changed(server):
                self._hold_until = time.monotonic() + self.lease_seconds
                log.info("reaper_holds_after_outage", seconds=self.lease_seconds)
            self._contact = now
            if time.monotonic() < self._hold_until:
                return 0
            if (now - server_started).total_seconds() < self.lease_seconds:
                return 0  # the server restarted less than a lease ago (checked again in SQL)
            rows = await self.store.leases.reap_expired(
                BATCH, contact=now, max_gap=self.max_gap, lease_seconds=self.lease_seconds
            )
        except DatabaseUnavailable as exc:
            if not isinstance(exc, TransientDatabaseError):
                self._lost_contact = True
            raise
        await self.settle(rows, "lease_expired")
        return len(rows)

    def _server_changed(self, server: tuple[datetime, str]) -> bool:
        """Whether this contact reached another server than the last (a failover to the
        next host of a multi-host URL, or a promoted standby: its own start time). The
        pool reconnects without an error the reaper would see, and the workers on the
        old server were cut off all the same: hold as after an outage."""
        previous, self._server = self._server, server
        return previous is not None and previous != server

    def _outage_ended(self, now: datetime) -> bool:
        """Whether this contact is the first after an outage (a failure, or a long gap)."""
        if self._contact is None:  # the first contact of this worker: nothing was missed
            self._lost_contact = False
            return False
        gap = (now - self._contact).total_seconds()
        ended = self._lost_contact or gap > self.max_gap
        self._lost_contact = False
        return ended

    async def settle(self, rows: Sequence[Any], cause: str) -> None:
        """Log and count jobs taken from their worker; publish copies of those now dead.

        Shared with the liveness service (cause ``worker_lost``): either way
        the row moved to ``retrying`` (the relay publishes it), ``dead`` or
        ``cancelled``.
        """
        for row in rows:
            status = row["status"]
            log.info(cause, job_id=row["id"], attempt=row["attempt"], next_status=status)
            if status == "retrying":
                self.metrics.redeliveries.labels(cause).inc()
            elif status == "dead":
                self.metrics.job_dead("max_attempts")
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
