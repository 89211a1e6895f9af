"""``CapStore``: the SQL of fleet-wide caps -- the capped claim's statements, and cap NOTIFYs.

A capped claim is one short transaction on one pooled connection: take the
capped scopes' advisory locks without waiting, count their running jobs,
claim. Each step is one named query here and returns plain facts
(``CapLocks``, ``CapRoom``, a ``ClaimResult``); what they mean -- busy, full,
places left -- is decided in ``coldbrew.caps.claim``, which walks the steps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from asyncpg.transaction import Transaction

from coldbrew.sql import QUERIES
from coldbrew.store.base import Database, StoreBase
from coldbrew.store.claims import ClaimConfig, claim_result, vanished
from coldbrew.store.rates import RateTokens
from coldbrew.store.records import CapLocks, CapRoom, ClaimRequest, ClaimResult
from coldbrew.topology import Topology


def _waiting_args(r: ClaimRequest) -> tuple[Any, ...]:
    return (
        r.id,
        r.type,
        r.queue,
        r.tenant,
        r.args,
        r.priority,
        r.max_attempts,
        r.timeout,
        r.idempotency_key,
    )


class CapClaim:
    """One capped claim's pooled connection: one method per statement it may send."""

    def __init__(self, conn: asyncpg.Connection, config: ClaimConfig) -> None:
        self._conn = conn
        self._config = config
        self.tokens = RateTokens(conn)
        """The rate limits' bucket statements, on this claim's connection."""

    def transaction(self) -> Transaction:
        """The short transaction the scopes' advisory locks live in."""
        return self._conn.transaction()

    async def try_lock_cap_scopes(self, tenant: str, job_type: str) -> CapLocks:
        """The scopes' caps, and which of their locks were taken (without waiting)."""
        row = await self._conn.fetchrow(QUERIES["try_lock_cap_scopes"].text, tenant, job_type)
        return CapLocks.from_row(row)

    async def cap_room(self, tenant: str | None, job_type: str | None) -> CapRoom:
        """The running jobs of ``tenant`` and of ``job_type`` fleet-wide (None: not counted)."""
        row = await self._conn.fetchrow(QUERIES["cap_room"].text, tenant, job_type)
        return CapRoom(row["tenant_running"], row["type_running"])

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """``claim_batch`` for this one job, inside the caller's transaction."""
        rows = await self._conn.fetch(
            QUERIES["claim_batch"].text, *self._config.claim_args([request])
        )
        if not rows:
            return vanished(request.id)
        return claim_result(rows[0], rows[0]["claimed"], rows[0]["status"])

    async def register_waiting(self, request: ClaimRequest) -> None:
        """Record the job as queued if it has no row yet, so status and stats see it."""
        await self._conn.execute(QUERIES["register_waiting"].text, *_waiting_args(request))

    async def claimability(self, job_id: str) -> tuple[ClaimResult, bool]:
        """The job's row as an unclaimed result with its own status, and whether it could be
        claimed now (False: a duplicate, or no row at all -- status ``unknown``)."""
        row = await self._conn.fetchrow(QUERIES["claimability"].text, job_id)
        if row is None:
            return vanished(job_id), False
        return claim_result(row, False, row["status"]), bool(row["claimable"])


class CapStore(StoreBase):
    """The capped claim's connection, and the ``<ns>.caps`` channel."""

    def __init__(self, db: Database, config: ClaimConfig) -> None:
        super().__init__(db)
        self._config = config

    @asynccontextmanager
    async def claim_session(self) -> AsyncIterator[CapClaim]:
        """A pooled connection for one capped claim, with the driver's errors translated."""
        async with self._db.connection() as conn:
            yield CapClaim(conn, self._config)

    def cap_channel(self) -> str:
        """The NOTIFY channel on which ``complete_batch`` names capped scopes that freed a place."""
        return Topology(self._db.namespace).caps_channel

    async def notify_caps_freed(self, scopes: Sequence[str]) -> None:
        """NOTIFY the fleet that places of these capped scopes (``tenant:x``, ``type:y``) freed."""
        channel = self.cap_channel()

        async def op(conn: asyncpg.Connection) -> None:
            for scope in scopes:
                await conn.execute(QUERIES["notify"].text, channel, scope)

        await self._run(op)
