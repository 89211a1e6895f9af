"""``Outbox``: rows waiting for their publish, the relay's side of the transactional outbox.

A submission writes its row with a publish mark before anything reaches
RabbitMQ; the relay takes the rows whose mark is due (submissions not yet
published, retries whose delay ran out, scheduled jobs whose run_at came),
publishes them with confirms and clears the marks of those the broker
confirmed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from coldbrew.store.base import StoreBase
from coldbrew.store.records import DuePublish


class Outbox(StoreBase):
    """Due publishes: taken by the relay, marked once confirmed."""

    async def take_due_publishes(self, limit: int, retry_after: float) -> list[DuePublish]:
        await self._execute("clear_stale_publish_marks", limit)
        rows = await self._fetch("take_due_publishes", limit, retry_after)
        return [DuePublish.from_row(row) for row in rows]

    async def next_due_in(self, horizon: float) -> float | None:
        """Seconds until the earliest publish mark still ahead, if one is within ``horizon``:
        the relay wakes for a scheduled job's time instead of at its next tick."""
        seconds = await self._fetchval("next_publish_due", horizon)
        return None if seconds is None else float(seconds)

    async def mark_published(self, marks: Sequence[tuple[str, datetime]]) -> None:
        if marks:
            await self._execute("mark_published", [m[0] for m in marks], [m[1] for m in marks])
