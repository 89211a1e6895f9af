"""``StatsStore``: the counts behind the gauges, ``coldbrew stats`` and the dashboard."""

from __future__ import annotations

from dataclasses import dataclass

from coldbrew.store.base import StoreBase
from coldbrew.store.records import QueueStats


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
        """What finished in the last ``since_seconds``, per lane and tenant (an index range
        on ``finished_at``; the worker's gauges keep reading ``queue_stats`` only)."""
        rows = await self._fetch("finished_stats", since_seconds, tenant)
        return [FinishedStats(**dict(row)) for row in rows]
