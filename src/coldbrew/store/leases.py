"""``LeaseStore``: claimed jobs while they are held -- heartbeats, progress, hand-backs, expiry.

Every write here is fenced by attempt: a job this worker no longer holds is
left alone and simply missing from what comes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from coldbrew.batching import GroupCommit
from coldbrew.store.base import Database, StoreBase
from coldbrew.store.claims import ClaimConfig


class LeaseStore(StoreBase):
    """The leases of running jobs: extended, reported on, released, or reaped once expired."""

    def __init__(self, db: Database, claim_config: ClaimConfig) -> None:
        super().__init__(db)
        self.claim_config = claim_config  # the lease the reaper judges by, by default
        # a drain hands back every held job at once: one statement per batch, not per job
        self.release_batches: GroupCommit[tuple[str, int, bool], bool] = GroupCommit(
            "release", self._release_batch
        )

    async def extend_leases(
        self, held: Sequence[tuple[str, int]], lease_seconds: float
    ) -> dict[str, str | None]:
        """Extend leases; return the jobs still held, each with its cancel reason (or None)."""
        if not held:
            return {}
        rows = await self._fetch(
            "extend_leases", [h[0] for h in held], [h[1] for h in held], lease_seconds
        )
        return {
            row["id"]: (row["cancel_reason"] or "cancelled") if row["cancel_requested"] else None
            for row in rows
        }

    async def write_progress(
        self, updates: Sequence[tuple[str, int, float | None, str | None]]
    ) -> set[str]:
        if not updates:
            return set()
        rows = await self._fetch(
            "write_progress",
            [u[0] for u in updates],
            [u[1] for u in updates],
            [u[2] for u in updates],
            [u[3] for u in updates],
        )
        return {row["id"] for row in rows}

    async def release(self, held: Sequence[tuple[str, int, bool]]) -> set[str]:
        """Hand jobs back as queued; ``republish`` for those whose delivery was already acked."""
        if not held:
            return set()
        rows = await self._fetch(
            "release_jobs", [h[0] for h in held], [h[1] for h in held], [h[2] for h in held]
        )
        return {row["id"] for row in rows}

    async def reap_expired(
        self,
        limit: int = 500,
        *,
        contact: datetime | None = None,
        max_gap: float = 5.0,
        lease_seconds: float | None = None,
    ) -> list[asyncpg.Record]:
        """Reap expired leases, unless an outage may have expired them (``reap_expired`` SQL).

        ``contact`` is the server time the caller read just before (the reaper's
        ``server_clock``; read here when not given): a statement that waited out an
        outage in a socket reaps nothing when it finally runs. ``lease_seconds``
        defaults to this store's claims' lease.
        """
        if contact is None:
            row = await self._fetchrow("server_clock")
            contact = row["now"] if row is not None else None
        lease = self.claim_config.lease_seconds if lease_seconds is None else lease_seconds
        return await self._fetch("reap_expired", limit, lease, contact, max_gap)

    async def close(self) -> None:
        """Wait for the release batch in flight."""
        await self.release_batches.close()

    async def _release_batch(self, held: Sequence[tuple[str, int, bool]]) -> list[bool]:
        released = await self.release(held)
        return [h[0] in released for h in held]
