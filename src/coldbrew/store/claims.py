"""``ClaimStore``: the hot path -- claims and outcomes, each through group commit.

A claim upserts the delivered job and takes one attempt under a lease; an
outcome is written fenced by that attempt. Both go through ``GroupCommit``
(batching.py): many concurrent callers, one statement per batch.

With ``COLDBREW_CLAIM_COMMIT=async`` a claim batch commits without waiting for
the WAL flush, and each claim carries a ``CommitMark``. What later makes it
durable is returned to the caller, not told to a hook: a written outcome
returns the mark of its synchronous commit, and ``durability_barrier`` the
mark it made (claimacks.py holds the acks until then).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from coldbrew.batching import GroupCommit
from coldbrew.errors import DataRefused
from coldbrew.model import Status
from coldbrew.sql import QUERIES
from coldbrew.store.base import GATHER_TURNS, Database, StoreBase
from coldbrew.store.records import ClaimRequest, ClaimResult, CommitMark, Outcome

CLAIM_COMMITS = ("sync", "async")


@dataclass(slots=True)
class ClaimConfig:
    """The lease and owner every claim of this store carries, and how claim batches commit
    (``sync``, or ``async``: see ``CommitMark``). Shared with the capped claims."""

    lease_seconds: float = 30.0
    worker_id: str = "unknown"
    commit: str = "sync"

    def claim_args(self, requests: Sequence[ClaimRequest]) -> tuple[Any, ...]:
        """The parameters of ``claim_batch`` for ``requests``."""
        return (
            [r.id for r in requests],
            [r.type for r in requests],
            [r.queue for r in requests],
            [r.tenant for r in requests],
            [r.args for r in requests],
            [r.priority for r in requests],
            [r.max_attempts for r in requests],
            [r.timeout for r in requests],
            [r.idempotency_key for r in requests],
            self.lease_seconds,
            self.worker_id,
            [r.traceparent for r in requests],  # a raw producer's, kept from the first claim
            [r.tracestate for r in requests],
        )


def claim_result(
    row: Any, claimed: bool, status: str, mark: CommitMark | None = None
) -> ClaimResult:
    return ClaimResult(
        id=row["id"],
        claimed=claimed,
        status=status,
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        timeout=row["timeout_seconds"],
        checkpoint=row["checkpoint"],
        started_at=row["started_at"],
        mark=mark,
        snoozes=row["snoozes"],
        waited=row.get("waited"),
    )


def vanished(job_id: str) -> ClaimResult:
    """A claim that found no row at all: another worker's insert is still in flight."""
    return ClaimResult(job_id, False, "unknown", 0, 0, None, None, None)


class ClaimStore(StoreBase):
    """Claims and outcomes through group commit, and what makes async claims durable."""

    def __init__(self, db: Database, config: ClaimConfig) -> None:
        super().__init__(db)
        self._config = config
        # one job's refused data fails only that job's claim or outcome (batching.py)
        self.claim_batches: GroupCommit[ClaimRequest, ClaimResult] = GroupCommit(
            "claim", self._claim_batch, gather_turns=GATHER_TURNS, isolate=(DataRefused,)
        )
        self.completion_batches: GroupCommit[Outcome, CommitMark | None] = GroupCommit(
            "complete", self._complete_batch, gather_turns=GATHER_TURNS, isolate=(DataRefused,)
        )
        self._claim_seq = 0  # claim batches that returned so far (CommitMark.seq)

    async def claim(self, request: ClaimRequest, *, linger: float = 0.0) -> ClaimResult:
        """Claim ``request``'s job; ``linger`` > 0 lets it wait that long to share a batch."""
        return await self.claim_batches.submit(request, linger=linger)

    async def complete(self, outcome: Outcome) -> CommitMark | None:
        """Write an attempt's outcome; None when it was fenced (the row moved on).

        Written, it returns the mark of the synchronous commit that wrote it:
        every asynchronous claim committed on ``mark.server`` with a ``seq`` up
        to ``mark.seq`` is durable now. The outcomes of one batch share one mark.
        """
        return await self.completion_batches.submit(outcome)

    def complete_soon(
        self, outcome: Outcome, *, linger: float = 0.0
    ) -> asyncio.Future[CommitMark | None]:
        """``complete`` as a future: the write proceeds even if its waiter is cancelled.
        ``linger`` > 0 lets it wait that long for other outcomes to share its commit."""
        return self.completion_batches.enqueue(outcome, linger=linger)

    async def durability_barrier(self) -> tuple[datetime, int]:
        """Commit a tiny transaction synchronously; return ``(server, seq)`` it made durable.

        Every asynchronous claim committed on ``server`` with ``mark.seq <= seq``
        is on disk once this returns. A claim made on another server start is
        not covered: it may be lost.
        """
        covers = self._claim_seq
        rows = await self._batch_fetch("durability_barrier")
        server: datetime = rows[0]["server_started"]
        return server, covers

    async def verify_claims(self, ids: Sequence[str]) -> dict[str, asyncpg.Record]:
        """The rows of these jobs (those that exist), by id: did their claims survive a restart?"""
        rows = await self._fetch("verify_claims", list(ids))
        return {row["id"]: row for row in rows}

    async def close(self) -> None:
        """Wait for the batches in flight."""
        await self.claim_batches.close()
        await self.completion_batches.close()

    async def _claim_batch(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        rows = await self._batch_fetch("claim_batch", *self._config.claim_args(requests))
        mark = None
        if self._config.commit == "async":
            self._claim_seq += 1
            mark = CommitMark(self._db.batch_server("claim_batch"), self._claim_seq)
        found = {
            row["id"]: claim_result(
                row, row["claimed"], row["status"], mark if row["claimed"] else None
            )
            for row in rows
        }
        return [found.get(r.id) or vanished(r.id) for r in requests]

    async def _complete_batch(self, outcomes: Sequence[Outcome]) -> list[CommitMark | None]:
        covers = self._claim_seq  # claim batches that committed before this statement is sent
        if any(o.children for o in outcomes):  # rare: the fast path stays one statement
            rows = await self._db.batch_transaction(
                "complete_batch", lambda conn: self._complete_spawning(conn, outcomes)
            )
        else:
            rows = await self._batch_fetch("complete_batch", *complete_args(outcomes))
        written = {row["id"] for row in rows}
        if not written:  # a transaction that changed nothing writes no commit record: no flush
            return [None] * len(outcomes)
        mark = CommitMark(self._db.batch_server("complete_batch"), covers)
        return [mark if o.id in written else None for o in outcomes]

    async def _complete_spawning(
        self, conn: asyncpg.Connection, outcomes: Sequence[Outcome]
    ) -> list[asyncpg.Record]:
        """The outcomes, then the children of those written ``succeeded``, in one
        transaction: a parent that is fenced or does not succeed spawns nothing, and one
        whose outcome commits spawns each child (ids derived from its own: exactly once)."""
        rows: list[asyncpg.Record] = await conn.fetch(
            QUERIES["complete_batch"].text, *complete_args(outcomes)
        )
        written = {row["id"] for row in rows}
        children = [
            (o.id, child)
            for o in outcomes
            if o.children and o.id in written and o.status is Status.SUCCEEDED
            for child in o.children
        ]
        if children:
            await conn.fetch(QUERIES["insert_children"].text, *children_args(children))
        return rows


def complete_args(outcomes: Sequence[Outcome]) -> tuple[Any, ...]:
    """The parameters of ``complete_batch`` for ``outcomes``."""
    return (
        [o.id for o in outcomes],
        [o.attempt for o in outcomes],
        [o.status for o in outcomes],
        [o.result for o in outcomes],
        [o.error_kind for o in outcomes],
        [o.error_message for o in outcomes],
        [o.delay for o in outcomes],
        [o.dead_reason for o in outcomes],
        [o.progress for o in outcomes],
        [o.progress_message for o in outcomes],
    )


def children_args(children: Sequence[tuple[str, ClaimRequest]]) -> tuple[Any, ...]:
    """The parameters of ``insert_children`` for ``(parent id, child)`` pairs."""
    return (
        [c.id for _, c in children],
        [c.type for _, c in children],
        [c.queue for _, c in children],
        [c.tenant for _, c in children],
        [c.args for _, c in children],
        [c.priority for _, c in children],
        [c.max_attempts for _, c in children],
        [c.timeout for _, c in children],
        [parent for parent, _ in children],
        [c.traceparent for _, c in children],  # the parent's run span (Client.child_request)
        [c.tracestate for _, c in children],
    )
