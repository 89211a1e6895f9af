"""``ReconcileStore``: the statements of reconciliation (worker/reconcile.py).

PostgreSQL is the truth: a pass compares what the broker says a tenant queue
holds with the waiting rows whose publish it confirmed, and makes due again
only rows that cannot be in the queue. Workers report what they hold
unclaimed and what their aging sweeps may take, so that neither is mistaken
for a loss.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import asyncpg

from coldbrew.sql import QUERIES
from coldbrew.store.base import StoreBase

T = TypeVar("T")


class ReconcileStore(StoreBase):
    """The fleet's reconcile lock, its looks, and the workers' holding and sweep reports."""

    async def run_pass(self, work: Callable[[ReconcilePass], Awaitable[T]]) -> T | None:
        """Run ``work`` in one transaction holding the namespace's reconcile lock.

        None, without running it, when another worker's pass holds the lock:
        one pass at a time across the fleet, so two workers never make the
        same lost rows due twice. The transaction stays open while ``work``
        asks the broker for its counts (a few milliseconds per queue).
        """

        async def op(conn: asyncpg.Connection) -> T | None:
            async with conn.transaction():
                row = await conn.fetchrow(QUERIES["reconcile_lock"].text)
                if not row["locked"]:
                    return None
                return await work(ReconcilePass(conn, row["started"], row["last_look"]))

        return await self._run(op)

    async def report_holds(
        self, worker_id: str, holds: Mapping[tuple[str, str], int], *, prefetch: int, keep: int
    ) -> None:
        """Replace this worker's report: its unclaimed deliveries per (lane, tenant), and what
        one of its consumers can hold unacked (``prefetch``, and up to ``keep`` more that an
        aging sweep of that queue kept)."""
        pairs = sorted(holds)
        await self._execute(
            "report_holds",
            worker_id,
            [p[0] for p in pairs],
            [p[1] for p in pairs],
            [holds[p] for p in pairs],
            prefetch,
            keep,
        )

    async def record_sweep(
        self, worker_id: str, queue: str, tenant: str, taking: int, *, window: float
    ) -> None:
        """An aging sweep of the queue begins and may take ``taking`` ready messages at once
        (the record keeps the largest of the last ``window`` seconds)."""
        await self._execute("record_sweep", worker_id, queue, tenant, taking, window)

    async def list_queue_looks(self) -> list[QueueLook]:
        """The latest look at each (lane, tenant) queue (``coldbrew stats``, the gauges)."""
        return [QueueLook(**dict(row)) for row in await self._fetch("list_queue_looks")]


@dataclass(frozen=True, slots=True)
class QueueLook:
    """The latest look at one (lane, tenant) queue; ``ready`` None: the queue was missing."""

    queue: str
    tenant: str
    ready: int | None
    consumers: int | None
    waiting: int
    deficit: int | None
    age_seconds: float


@dataclass(frozen=True, slots=True)
class WaitingCount:
    """What PostgreSQL says one (lane, tenant) queue should hold, read after the broker's count.

    ``waiting``: waiting rows whose message was confirmed before this look
    began; ``waiting_before``: those confirmed before the previous look;
    ``top_priority``: their highest priority; ``held``: unclaimed deliveries
    workers reported holding since that look; ``sweeping``: what aging sweeps
    begun about then may hold; ``fleet_prefetch`` and ``fleet_keep``: the
    largest any live worker reported (None: none did); ``fleet_prefetch_sum``:
    their prefetches added up (what paused consumers, which the broker does
    not count, may have received before their pause).
    """

    queue: str
    tenant: str
    waiting: int
    waiting_before: int
    top_priority: int
    held: int
    previous_look: datetime | None
    previous_ready: int | None
    previous_deficit: int | None
    previous_suspects: datetime | None = None
    sweeping: int = 0
    fleet_prefetch: int | None = None
    fleet_keep: int | None = None
    fleet_prefetch_sum: int | None = None


@dataclass(frozen=True, slots=True)
class LookRecord:
    """One queue's look as this pass records it (``ready`` None: the queue was missing)."""

    queue: str
    tenant: str
    ready: int | None
    consumers: int | None
    waiting: int
    deficit: int | None
    suspects: datetime | None = None
    """Rows confirmed up to then may be lost (the oldest ones, as many as the look found
    missing); None: none is. The next look republishes only among them: a row that was
    merely held by a worker has been claimed by then."""
    counted_at: datetime | None = None
    """Just after the broker counted the queue: holding reports made since then cover it."""


class ReconcilePass:
    """The statements of one reconcile pass, on the connection that holds the lock.

    ``started`` is PostgreSQL's clock when the pass took the lock, read before
    any broker count: a row confirmed by then had its message in its queue
    before the queue was counted. ``last_look``: the fleet's latest look (None:
    none is kept), so that a fleet of workers looks once per interval, not
    once each.
    """

    def __init__(
        self, conn: asyncpg.Connection, started: datetime, last_look: datetime | None
    ) -> None:
        self._conn = conn
        self.started = started
        self.last_look = last_look

    async def pairs(self) -> list[tuple[str, str]]:
        rows = await self._conn.fetch(QUERIES["reconcile_pairs"].text)
        return [(row["queue"], row["tenant"]) for row in rows]

    async def counts(
        self, *, report_age: float, sweep_seconds: float
    ) -> dict[tuple[str, str], WaitingCount]:
        """What PostgreSQL says each queue holds; workers' reports older than ``report_age``
        seconds do not count (the worker is gone), nor sweeps begun ``sweep_seconds`` before
        the previous look (they ended before it)."""
        rows = await self._conn.fetch(
            QUERIES["reconcile_counts"].text, self.started, report_age, sweep_seconds
        )
        return {(row["queue"], row["tenant"]): WaitingCount(**dict(row)) for row in rows}

    async def suspects(self, queue: str, tenant: str, count: int) -> datetime:
        """When the ``count``-th oldest confirmed waiting row of the queue was confirmed."""
        value: datetime = await self._conn.fetchval(
            QUERIES["reconcile_suspects"].text, queue, tenant, count, self.started
        )
        return value

    async def republish(
        self, queue: str, tenant: str, *, confirmed_by: datetime, limit: int
    ) -> list[str]:
        """Make up to ``limit`` rows due for the relay, oldest confirmed first; their ids."""
        rows = await self._conn.fetch(
            QUERIES["reconcile_republish"].text, queue, tenant, confirmed_by, limit
        )
        return [row["id"] for row in rows]

    async def save(self, looks: Sequence[LookRecord], *, forget_after: float) -> None:
        """Record this pass's looks; forget looks and holding reports older than
        ``forget_after`` seconds."""
        await self._conn.execute(
            QUERIES["save_queue_looks"].text,
            [look.queue for look in looks],
            [look.tenant for look in looks],
            self.started,
            [look.ready for look in looks],
            [look.consumers for look in looks],
            [look.waiting for look in looks],
            [look.deficit for look in looks],
            [look.suspects for look in looks],
            [look.counted_at for look in looks],
        )
        await self._conn.execute(QUERIES["prune_queue_looks"].text, forget_after)
