"""``DeadLetterStore``: dead jobs and rejected messages, listed, counted and replayed.

A dead job is a row whose status is ``dead``; a rejected message broke the
contract before it became a job, and is kept with its original bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from coldbrew.model import JobRecord
from coldbrew.sql import QUERIES
from coldbrew.storable import RejectedRow, storable_rejected
from coldbrew.store.base import StoreBase


class DeadLetterStore(StoreBase):
    """The dead-letter side: dead jobs (``coldbrew dlq``) and rejected messages."""

    async def dlq_list(self, reason_contains: str | None, limit: int) -> list[JobRecord]:
        rows = await self._fetch("dlq_list", reason_contains, limit)
        return [JobRecord.from_row(row) for row in rows]

    async def recent_dead(self, tenant: str | None, limit: int) -> list[JobRecord]:
        """The newest dead jobs, of one tenant or (``None``) of all, for the dashboard."""
        rows = await self._fetch("recent_dead", tenant, limit)
        return [JobRecord.from_row(row) for row in rows]

    async def dlq_replay(
        self, reason_contains: str | None, job_id: str | None, limit: int, budget: int
    ) -> list[str]:
        rows = await self._fetch("dlq_replay", reason_contains, job_id, limit, budget)
        return [row["id"] for row in rows]

    async def insert_rejected(self, rows: Sequence[RejectedRow]) -> None:
        """Store rejected messages; whatever they hold (a NUL anywhere) is made storable."""
        query = QUERIES["insert_rejected"].text
        safe = [storable_rejected(row) for row in rows]
        await self._run(lambda conn: conn.executemany(query, safe))

    async def list_rejected(self, reason_contains: str | None, limit: int) -> list[asyncpg.Record]:
        return await self._fetch("list_rejected", reason_contains, limit)

    async def rejected_counts(self, tenant: str | None = None) -> dict[str, int]:
        """Rejected messages by reason; with ``tenant``, only those routed to that tenant."""
        rows = await self._fetch("rejected_counts", tenant)
        return {row["reason"]: row["count"] for row in rows}

    async def fail_rejected_jobs(self, rejected: Sequence[tuple[str, str, str]]) -> set[str]:
        """Fail the waiting rows of rejected messages ``(job id, reason, detail)``; the ids failed.

        Guarded in SQL: a row that is running or finished (the message was a
        duplicate of a job that did run) is left alone.
        """
        if not rejected:
            return set()
        rows = await self._fetch(
            "fail_rejected_jobs",
            [r[0] for r in rejected],
            [r[1] for r in rejected],
            [r[2] for r in rejected],
        )
        return {row["id"] for row in rows}
