"""``StatsStore``: the counts behind the gauges, ``coldbrew stats`` and the dashboard."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from coldbrew.sql import QUERIES
from coldbrew.store.base import StoreBase
from coldbrew.store.records import QueueStats
from coldbrew.store.rollup import RELATIVE_ERROR, percentile, plan_window


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
        """What finished in the last ``since_seconds``, per lane and tenant: the per-minute
        rollup (migration 0024) up to where the fold stands, the raw rows after it
        (seconds' worth) and of the window's first partial minute (``plan_window``: at
        most half a minute's); counts exact, percentiles from the summed histograms. The
        worker's gauges keep reading ``queue_stats`` only."""
        return await self._run(lambda conn: read_finished(conn, since_seconds, tenant))

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


async def read_finished(
    conn: asyncpg.Connection, since_seconds: float, tenant: str | None
) -> list[FinishedStats]:
    """``finished_stats`` on one connection, in one repeatable-read snapshot (a fold that
    commits meanwhile must not add to the rollup rows what the raw rows count): the
    window's start and the fold's frontier first, then the read with the ranges
    ``plan_window`` makes of them as values (the planner then sees how few rows they
    span), without JIT (a second of compiling for a read of milliseconds, measured)."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return await read_finished_in(conn, since_seconds, tenant)


async def read_finished_in(
    conn: asyncpg.Connection, since_seconds: float, tenant: str | None
) -> list[FinishedStats]:
    """``read_finished`` in the caller's transaction (repeatable read, or one statement's
    worth of consistency is lost)."""
    await conn.execute(QUERIES["rollup_no_jit"].text)
    window = await conn.fetchrow(QUERIES["rollup_window"].text, since_seconds)
    plan = plan_window(window["since"], window["folded_to"])
    rows = await conn.fetch(
        QUERIES["finished_rollup_stats"].text,
        plan.rolled_from,
        plan.rolled_to,
        plan.add[0],
        plan.add[1],
        plan.tail,
        plan.subtract[0],
        plan.subtract[1],
        tenant,
    )
    return [finished_from_histograms(row) for row in rows]


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
