"""``Outbox``: rows waiting for their publish, the relay's side of the transactional outbox.

A submission writes its row with a publish mark before anything reaches
RabbitMQ; the relay takes the rows whose mark is due (submissions not yet
published, retries whose delay ran out), publishes them with confirms and
clears the marks of those the broker confirmed.
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

    async def mark_published(self, marks: Sequence[tuple[str, datetime]]) -> None:
        if marks:
            await self._execute("mark_published", [m[0] for m in marks], [m[1] for m in marks])
