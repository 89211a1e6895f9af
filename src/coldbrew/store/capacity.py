"""``CapacityStore``: the per-lane figures `coldbrew plan` reads (capacity.py does the maths)."""

from __future__ import annotations

from dataclasses import dataclass

from coldbrew.store.base import StoreBase


@dataclass(frozen=True, slots=True)
class LaneFigures:
    """One lane over a window: submitted, finished, the first-attempt run times, waiting now."""

    queue: str
    submitted: int
    finished: int
    timed: int
    service_mean_seconds: float | None
    service_stddev_seconds: float | None
    service_p95_seconds: float | None
    waiting: int


class CapacityStore(StoreBase):
    """Arrivals and service times per lane (a range scan of ``jobs_finished`` for the
    finished, a scan of the window's submissions for arrivals)."""

    async def lane_figures(self, window_seconds: float) -> list[LaneFigures]:
        rows = await self._fetch("capacity_lanes", window_seconds)
        return [LaneFigures(**dict(row)) for row in rows]
