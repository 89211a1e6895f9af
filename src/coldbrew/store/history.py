"""``HistoryStore``: deleting finished history in small batches, and counting what would go.

The prune service (worker/prune.py) and ``coldbrew prune`` call these. Each
batch is one short transaction under the namespace's prune lock (one pruner
per fleet at a time; a worker that finds it held leaves the pass to the holder)
that deletes at most ``limit`` rows by an index range, skipping rows another
transaction holds, so a claim, a completion or a heartbeat never waits on it.
Which job rows may go at all is the SQL function ``job_prunable`` (migration
0013), the one place that rule lives.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import asyncpg

from coldbrew.errors import StatementFailed
from coldbrew.sql import QUERIES
from coldbrew.store.base import StoreBase

T = TypeVar("T")

JOB_TABLES = ("jobs", "job_once", "job_unique", "job_aliases")
"""The tables whose rows go with a pruned job (counted per the job's status)."""


@dataclass(frozen=True, slots=True)
class PrunedBatch:
    """What one batch of one status deleted, per table (``JOB_TABLES``)."""

    jobs: int
    job_once: int
    job_unique: int
    job_aliases: int

    def by_table(self) -> dict[str, int]:
        return {table: getattr(self, table) for table in JOB_TABLES}


def _rows(status: str) -> int:
    """The row count of a command tag such as ``DELETE 17``."""
    return int(status.rsplit(" ", 1)[-1])


class HistoryStore(StoreBase):
    """Batched deletes of finished rows past their retention, and their dry run."""

    async def _under_lock(
        self, name: str, op: Callable[[asyncpg.Connection], Awaitable[T]]
    ) -> T | None:
        """``op`` in a transaction holding the prune lock; None if another pruner holds it."""

        async def locked(conn: asyncpg.Connection) -> T | None:
            async with conn.transaction():
                if not await conn.fetchval(QUERIES["prune_lock"].text):
                    return None
                return await op(conn)

        try:
            return await self._run(locked)
        except asyncpg.PostgresError as exc:  # not an outage, a conflict or the data
            raise StatementFailed(f"{name}: {exc.sqlstate} {type(exc).__name__}: {exc}") from exc

    async def prune_jobs(self, status: str, seconds: float, limit: int) -> PrunedBatch | None:
        """Delete up to ``limit`` ``status`` jobs finished over ``seconds`` ago, with their
        once-guards, unique keys and aliases; None when another pruner holds the lock."""

        async def op(conn: asyncpg.Connection) -> PrunedBatch:
            row = await conn.fetchrow(QUERIES["prune_jobs"].text, status, seconds, limit)
            return PrunedBatch(**dict(row))

        return await self._under_lock("prune_jobs", op)

    async def prune_rejected(self, seconds: float, limit: int) -> int | None:
        """Delete up to ``limit`` rejected messages older than ``seconds``."""

        async def op(conn: asyncpg.Connection) -> int:
            return _rows(await conn.execute(QUERIES["prune_rejected"].text, seconds, limit))

        return await self._under_lock("prune_rejected", op)

    async def prune_rate_buckets(self, idle_seconds: float, limit: int) -> int | None:
        """Delete up to ``limit`` rate buckets full for over ``idle_seconds``."""

        async def op(conn: asyncpg.Connection) -> int:
            return _rows(
                await conn.execute(QUERIES["prune_rate_buckets"].text, idle_seconds, limit)
            )

        return await self._under_lock("prune_rate_buckets", op)

    async def prune_sessions(self, limit: int) -> int | None:
        """Delete up to ``limit`` dashboard sessions expired over a day ago."""

        async def op(conn: asyncpg.Connection) -> int:
            return _rows(await conn.execute(QUERIES["prune_sessions"].text, limit))

        return await self._under_lock("prune_sessions", op)

    async def prune_audit(self, seconds: float, limit: int) -> int | None:
        """Delete up to ``limit`` audit-log entries older than ``seconds``."""

        async def op(conn: asyncpg.Connection) -> int:
            return _rows(await conn.execute(QUERIES["prune_audit"].text, seconds, limit))

        return await self._under_lock("prune_audit", op)

    async def prune_rollup(self, seconds: float, limit: int) -> int | None:
        """Delete up to ``limit`` rows of the finished-jobs rollup (migration 0024) of
        minutes that ended over ``seconds`` ago."""

        async def op(conn: asyncpg.Connection) -> int:
            return _rows(await conn.execute(QUERIES["prune_finished_minutes"].text, seconds, limit))

        return await self._under_lock("prune_finished_minutes", op)

    async def compact_tallies(self) -> None:
        """Fold the dead/failed tallies' +1/-1 rows into one row per lane, tenant, status."""
        await self._execute("compact_tallies")

    async def count_prunable(
        self,
        retention: Mapping[str, float],
        rejected_seconds: float | None,
        idle_seconds: float,
        audit_seconds: float | None = None,
        rollup_seconds: float | None = None,
    ) -> dict[tuple[str, str], int]:
        """The dry run: ``{(table, status): rows}`` a prune with this retention would delete
        now (status ``any`` for the tables that are not a job's)."""
        statuses = sorted(retention)
        counts: dict[tuple[str, str], int] = {}
        if statuses:
            rows = await self._fetch(
                "count_prunable_jobs", statuses, [retention[s] for s in statuses]
            )
            counts.update({(row["table_name"], row["status"]): row["count"] for row in rows})
        if rejected_seconds is not None:
            counts["rejected_messages", "any"] = await self._fetchval(
                "count_prunable_rejected", rejected_seconds
            )
        counts["rate_buckets", "any"] = await self._fetchval(
            "count_idle_rate_buckets", idle_seconds
        )
        counts["dashboard_sessions", "any"] = await self._fetchval("count_prunable_sessions")
        if audit_seconds is not None:
            counts["audit_log", "any"] = await self._fetchval("count_prunable_audit", audit_seconds)
        if rollup_seconds is not None:
            counts["finished_minutes", "any"] = await self._fetchval(
                "count_prunable_finished_minutes", rollup_seconds
            )
        return counts
