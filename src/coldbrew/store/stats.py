"""``StatsStore``: the counts behind the gauges, ``coldbrew status`` and the dashboard."""

from __future__ import annotations

from coldbrew.store.base import StoreBase
from coldbrew.store.records import QueueStats


class StatsStore(StoreBase):
    """Per lane and tenant: jobs by status, the oldest waiting age, jobs finished so far."""

    async def queue_stats(self, tenant: str | None = None) -> list[QueueStats]:
        """Counts per lane and tenant; with ``tenant``, that tenant's lanes only."""
        return [QueueStats(**dict(row)) for row in await self._fetch("queue_stats", tenant)]
