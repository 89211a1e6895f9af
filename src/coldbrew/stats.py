"""Fleet-wide queue gauges, read from PostgreSQL on a timer and served at scrape time.

Depth, oldest waiting job's age, running and dead counts per lane and tenant
come from the job table (the truth), not from RabbitMQ, whose ready count
misses unacked and retrying jobs. None of it reads the history: the
unfinished rows are an index-only scan of ``jobs_unfinished`` and the dead
and failed counts come from ``job_tallies``, which triggers keep (migration
0013), so a refresh costs the same at 10M finished rows as at none.
Scheduled jobs (waiting for their ``run_at``) are counted apart, in
``coldbrew_jobs_scheduled``: a job due tomorrow is not backlog, so it is in
neither the depth, the oldest age nor the estimated wait that autoscaling
reads. The drain rate is the change of the fleet's finished-jobs counter per
lane and tenant between two refreshes (an exponentially weighted average
over about a minute), and the estimated wait is depth divided by it.

The counts are computed once per interval for the whole fleet, not by every
worker: the worker whose refresh finds the stored snapshot (``fleet_stats``)
older than half an interval recomputes and stores it under a lock, and the
others read it. A background loop refreshes one snapshot; the scrape only
reads it, so a scrape never waits on the database. Tenant labels are capped
(``COLDBREW_METRICS_MAX_TENANTS``): the busiest tenants get their own
series, the rest are summed as ``other``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence

from coldbrew.metrics import Metrics
from coldbrew.store import JobStore, QueueLook, QueueStats

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
                finished=prev.finished + row.finished,
                scheduled=prev.scheduled + row.scheduled,
            )
    return kept + list(folded.values())


def lane_consumers(looks: Sequence[QueueLook], max_age: float) -> dict[str, int]:
    """Consumers per lane at the reconcile looks younger than ``max_age`` seconds: the most
    on any of its tenant queues (every worker of a lane consumes all of its tenant queues)."""
    lanes: dict[str, int] = {}
    for look in looks:
        if look.age_seconds <= max_age and look.consumers is not None:
            lanes[look.queue] = max(lanes.get(look.queue, 0), look.consumers)
    return lanes


RATE_WINDOW_SECONDS = 60.0


class DrainRates:
    """Jobs finished per second per (lane, tenant), from successive counter readings.

    Pure: the caller passes the clock. The first reading of a key gives no
    rate; later ones fold ``Δfinished / Δt`` into an exponentially weighted
    average with a time constant of ``window`` seconds.
    """

    def __init__(self, window: float = RATE_WINDOW_SECONDS) -> None:
        self.window = window
        self._last: dict[tuple[str, str], tuple[float, int]] = {}
        self.rates: dict[tuple[str, str], float] = {}

    def observe(self, key: tuple[str, str], finished: int, now: float) -> None:
        last = self._last.get(key)
        self._last[key] = (now, finished)
        if last is None or now <= last[0] or finished < last[1]:
            return
        elapsed = now - last[0]
        sample = (finished - last[1]) / elapsed
        previous = self.rates.get(key)
        if previous is None:
            self.rates[key] = sample
        else:
            alpha = 1.0 - math.exp(-elapsed / self.window)
            self.rates[key] = previous + alpha * (sample - previous)

    def estimated_wait(self, key: tuple[str, str], depth: int) -> float:
        """Seconds until ``depth`` jobs drain at the recent rate; +Inf if nothing drains."""
        if depth <= 0:
            return 0.0
        rate = self.rates.get(key, 0.0)
        return depth / rate if rate > 0 else math.inf


class StatsSnapshot:
    """The latest per-(lane, tenant) counts, refreshed by the worker's stats loop."""

    def __init__(
        self,
        store: JobStore,
        *,
        max_tenants: int,
        max_age: float = 2.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.max_tenants = max_tenants
        self.max_age = max_age
        self.rows: list[QueueStats] = []
        self.rates = DrainRates()
        self._clock = clock

    async def refresh(self) -> int:
        """Read the fleet's snapshot (one worker of the fleet recomputes it when it is
        older than ``max_age``); the drain rate is observed at the snapshot's own time."""
        rows, age = await self.store.stats.fleet_stats(self.max_age)
        rows = cap_tenants(rows, self.max_tenants)
        now = self._clock() - age
        for row in rows:
            self.rates.observe((row.queue, row.tenant), row.finished, now)
        self.rows = rows
        return 0

    def _wait(self) -> Iterable[tuple[Sequence[str], float]]:
        for row in self.rows:
            key = (row.queue, row.tenant)
            yield key, self.rates.estimated_wait(key, row.queued + row.retrying)

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
            "coldbrew_estimated_wait_seconds",
            "Depth divided by the recent drain rate (+Inf while waiting jobs do not drain).",
            labels,
            self._wait,
        )
        metrics.add_scrape_callback(
            "coldbrew_jobs_scheduled",
            "Jobs waiting for their run_at (scheduled or snoozed): not backlog, not in the depth.",
            labels,
            lambda: self._series("scheduled"),
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
