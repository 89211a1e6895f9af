"""``StatsStore``: the counts behind the gauges, ``coldbrew stats`` and the dashboard."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from coldbrew.sql import QUERIES
from coldbrew.store.base import StoreBase
from coldbrew.store.records import QueueStats
from coldbrew.store.rollup import RELATIVE_ERROR, percentile


@dataclass(frozen=True, slots=True)
class FinishedStats:
    """One lane and tenant's jobs that finished in a window: how each ended, how long
    they ran (first start to finish) and waited (submission to first start)."""

    queue: str
    tenant: str
    succeeded: int
    failed: int
    cancelled: int
    dead: int
    run_p50_seconds: float | None
    run_p95_seconds: float | None
    wait_p50_seconds: float | None
    percentile_relative_error: float = RELATIVE_ERROR
    """The percentiles come from log-scale buckets (store/rollup.py): each is within this
    fraction of the exact value (or 0.05 ms, for durations under 0.1 ms)."""

    @property
    def total(self) -> int:
        return self.succeeded + self.failed + self.cancelled + self.dead


class StatsStore(StoreBase):
    """Per lane and tenant: jobs by status, the oldest waiting age, jobs finished so far."""

    async def queue_stats(self, tenant: str | None = None) -> list[QueueStats]:
        """Counts per lane and tenant; with ``tenant``, that tenant's lanes only."""
        return [QueueStats(**dict(row)) for row in await self._fetch("queue_stats", tenant)]

    async def finished_stats(
        self, since_seconds: float, tenant: str | None = None
    ) -> list[FinishedStats]:
        """What finished in the last ``since_seconds``, per lane and tenant: the whole minutes
        from the per-minute rollup (migration 0024), the rest (the window's first partial
        minute, the minutes not folded yet) from the rows; percentiles from the summed
        histograms. The worker's gauges keep reading ``queue_stats`` only."""
        rows = await self._fetch("finished_rollup_stats", since_seconds, tenant)
        return [finished_from_histograms(row) for row in rows]

    async def exact_finished_stats(
        self, since_seconds: float, tenant: str | None = None
    ) -> list[FinishedStats]:
        """The same from the raw rows alone, percentiles exact (``percentile_cont``): what
        ``finished_stats`` was before the rollup; its cost grows with the rows finished in
        the window. For tests and ``bench/history.py`` to compare against."""
        rows = await self._fetch("finished_stats", since_seconds, tenant)
        return [FinishedStats(**dict(row), percentile_relative_error=0.0) for row in rows]

    async def fleet_stats(self, max_age: float) -> tuple[list[QueueStats], float]:
        """The gauges of the whole fleet and their age in seconds, computed once per
        ``max_age`` for the fleet: the worker that finds the stored snapshot older takes
        the stats lock, runs ``queue_stats`` and stores it; every other one reads it."""

        async def op(conn: asyncpg.Connection) -> tuple[list[QueueStats], float]:
            async with conn.transaction():
                age = await conn.fetchval(QUERIES["fleet_stats_age"].text)
                if (age is None or age >= max_age) and await conn.fetchval(
                    QUERIES["fleet_stats_lock"].text
                ):
                    # again under the lock: a refresh that held it may have just committed
                    age = await conn.fetchval(QUERIES["fleet_stats_age"].text)
                    if age is None or age >= max_age:
                        return await _refresh_fleet_stats(conn), 0.0
                rows = await conn.fetch(QUERIES["read_fleet_stats"].text)
            if not rows:  # never stored, and another worker holds the lock: nothing yet
                return [], 0.0
            return (
                [
                    QueueStats(**{k: v for k, v in row.items() if k != "age"})
                    for row in rows
                    if row["queue"] is not None
                ],
                float(rows[0]["age"]),
            )

        return await self._run(op)


def finished_from_histograms(row: Mapping[str, Any]) -> FinishedStats:
    """A row of ``finished_rollup_stats``: counts, and the percentiles of its histograms."""
    return FinishedStats(
        queue=row["queue"],
        tenant=row["tenant"],
        succeeded=row["succeeded"],
        failed=row["failed"],
        cancelled=row["cancelled"],
        dead=row["dead"],
        run_p50_seconds=percentile(row["run_buckets"], row["run_counts"], 0.5),
        run_p95_seconds=percentile(row["run_buckets"], row["run_counts"], 0.95),
        wait_p50_seconds=percentile(row["wait_buckets"], row["wait_counts"], 0.5),
    )


async def _refresh_fleet_stats(conn: asyncpg.Connection) -> list[QueueStats]:
    """Fold the dead/failed tallies, count now (``queue_stats``) and store the result as
    the fleet's snapshot. Folding here, every interval, keeps the tallies' log short
    after a burst of failures (the prune service folds them too, each pass)."""
    await conn.execute(QUERIES["compact_tallies"].text)
    rows = [QueueStats(**dict(row)) for row in await conn.fetch(QUERIES["queue_stats"].text, None)]
    await conn.execute(QUERIES["clear_fleet_stats"].text)
    await conn.execute(
        QUERIES["store_fleet_stats"].text,
        [r.queue for r in rows],
        [r.tenant for r in rows],
        [r.queued for r in rows],
        [r.running for r in rows],
        [r.retrying for r in rows],
        [r.dead for r in rows],
        [r.failed for r in rows],
        [r.scheduled for r in rows],
        [r.oldest_waiting_seconds for r in rows],
        [r.finished for r in rows],
    )
    return rows
