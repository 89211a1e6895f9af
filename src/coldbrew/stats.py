"""Fleet-wide queue gauges, read from PostgreSQL on a timer and served at scrape time.

Depth, oldest waiting job's age, running and dead counts per lane and tenant
come from the job table (the truth), not from RabbitMQ, whose ready count
misses unacked and retrying jobs. A background loop refreshes one snapshot;
the scrape only reads it, so a scrape never waits on the database. Tenant
labels are capped (``COLDBREW_METRICS_MAX_TENANTS``): the busiest tenants get
their own series, the rest are summed as ``other``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from coldbrew.metrics import Metrics
from coldbrew.store import JobStore, QueueStats

OTHER = "other"


def cap_tenants(rows: Sequence[QueueStats], max_tenants: int) -> list[QueueStats]:
    """Keep the ``max_tenants`` busiest tenants; fold the rest into tenant ``other`` per lane."""
    load: dict[str, int] = {}
    for row in rows:
        load[row.tenant] = load.get(row.tenant, 0) + row.queued + row.running + row.retrying
    keep = set(sorted(load, key=lambda t: (-load[t], t))[:max_tenants])
    kept = [row for row in rows if row.tenant in keep]
    folded: dict[str, QueueStats] = {}
    for row in rows:
        if row.tenant in keep:
            continue
        prev = folded.get(row.queue)
        if prev is None:
            folded[row.queue] = dataclasses.replace(row, tenant=OTHER)
        else:
            folded[row.queue] = QueueStats(
                queue=row.queue,
                tenant=OTHER,
                queued=prev.queued + row.queued,
                running=prev.running + row.running,
                retrying=prev.retrying + row.retrying,
                dead=prev.dead + row.dead,
                failed=prev.failed + row.failed,
                oldest_waiting_seconds=max(prev.oldest_waiting_seconds, row.oldest_waiting_seconds),
            )
    return kept + list(folded.values())


class StatsSnapshot:
    """The latest per-(lane, tenant) counts, refreshed by the worker's stats loop."""

    def __init__(self, store: JobStore, *, max_tenants: int) -> None:
        self.store = store
        self.max_tenants = max_tenants
        self.rows: list[QueueStats] = []

    async def refresh(self) -> int:
        self.rows = cap_tenants(await self.store.queue_stats(), self.max_tenants)
        return 0

    def _series(self, attr: str) -> Iterable[tuple[Sequence[str], float]]:
        for row in self.rows:
            yield (row.queue, row.tenant), float(getattr(row, attr))

    def _depth(self) -> Iterable[tuple[Sequence[str], float]]:
        for row in self.rows:
            yield (row.queue, row.tenant), float(row.queued + row.retrying)

    def register(self, metrics: Metrics) -> None:
        labels = ("queue", "tenant")
        metrics.add_scrape_callback(
            "coldbrew_queue_depth",
            "Jobs waiting (queued or retrying), from the job table.",
            labels,
            self._depth,
        )
        metrics.add_scrape_callback(
            "coldbrew_oldest_job_age_seconds",
            "Age of the oldest waiting job.",
            labels,
            lambda: self._series("oldest_waiting_seconds"),
        )
        metrics.add_scrape_callback(
            "coldbrew_jobs_running",
            "Jobs running across the fleet.",
            labels,
            lambda: self._series("running"),
        )
        metrics.add_scrape_callback(
            "coldbrew_dead_jobs",
            "Jobs currently dead (in the dead letters).",
            labels,
            lambda: self._series("dead"),
        )
