"""``JobStore``: what is opened -- one pool, and the stores grouped by concern over it.

Callers name the concern they touch (``store.claims.claim``,
``store.tenants.set_tenant``, ``store.dead.dlq_list``), so a call site says
which part of the schema it reaches, and each store stays a page long. Only
what is about the connection itself lives here: the schema check, the ping,
LISTEN, and the claim settings that claims and capped claims share.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import asyncpg

from coldbrew.batching import GroupCommit
from coldbrew.errors import SchemaOutOfDate
from coldbrew.sql import LATEST_VERSION, QUERIES
from coldbrew.store.base import Database, StoreBase, open_pool, server_node
from coldbrew.store.batches import BatchRows
from coldbrew.store.capacity import CapacityStore
from coldbrew.store.caps import CapStore
from coldbrew.store.claims import CLAIM_COMMITS, ClaimConfig, ClaimStore
from coldbrew.store.cron import CronStore
from coldbrew.store.dashboard import DashboardStore
from coldbrew.store.dead import DeadLetterStore
from coldbrew.store.flow import FlowStore
from coldbrew.store.history import HistoryStore
from coldbrew.store.jobs import JobRows
from coldbrew.store.leases import LeaseStore
from coldbrew.store.liveness import LivenessStore
from coldbrew.store.outbox import Outbox
from coldbrew.store.reconcile import ReconcileStore
from coldbrew.store.rollup import RollupStore
from coldbrew.store.stats import StatsStore
from coldbrew.store.tenants import TenantStore
from coldbrew.store.types import TypeRegistry
from coldbrew.store.unique import UniqueRows
from coldbrew.store.webhooks import WebhookRows


class JobStore(StoreBase):
    """The job store: one asyncpg pool, and a store per concern over it."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.namespace = db.namespace
        self.claim_config = ClaimConfig()
        self.jobs = JobRows(db)
        """Submissions, reads, cancels, and a running attempt's own fenced writes."""
        self.outbox = Outbox(db)
        """Rows waiting for their publish (the relay)."""
        self.claims = ClaimStore(db, self.claim_config)
        """Claims and outcomes (group commit), and what makes async claims durable."""
        self.leases = LeaseStore(db, self.claim_config)
        """Held jobs: heartbeats, progress, releases, expired leases."""
        self.caps = CapStore(db, self.claim_config)
        """The capped claim's statements and the ``<ns>.caps`` NOTIFYs."""
        self.tenants = TenantStore(db)
        """Tenant queues, and tenants' and job types' settings."""
        self.dead = DeadLetterStore(db)
        """Dead jobs and rejected messages."""
        self.stats = StatsStore(db)
        """Counts per lane and tenant."""
        self.liveness = LivenessStore(db)
        """Workers' rows and liveness locks, the server's clock, dead workers' jobs."""
        self.reconcile = ReconcileStore(db)
        """The reconcile passes' lock and looks, and workers' holding reports."""
        self.unique = UniqueRows(db)
        """Unique jobs' keys, and the aliases of raw duplicates' message ids."""
        self.cron = CronStore(db)
        """Cron schedules: declarations, watermarks, the firing transaction, pauses."""
        self.types = TypeRegistry(db)
        """The job types workers' apps registered: lanes for submitters without the app."""
        self.capacity = CapacityStore(db)
        """Arrivals and service times per lane, for ``coldbrew plan``."""
        self.batches = BatchRows(db)
        """Batches: creation with their members, counts, cancels, members added by members."""
        self.webhooks = WebhookRows(db)
        """A raw delivery's webhook URL, recorded before its claim (migration 0012)."""
        self.dashboard = DashboardStore(db)
        """The web dashboard's sessions, audit log, attempts, search and charts."""
        self.flow = FlowStore(db)
        """Submissions in a caller's transaction; chains' records."""
        self.history = HistoryStore(db)
        """Finished rows past their retention: batched deletes and their dry run."""
        self.rollup = RollupStore(db)
        """The per-minute rollup of finished jobs that ``coldbrew stats --since`` reads."""

    @classmethod
    @asynccontextmanager
    async def open(
        cls, dsn: str, namespace: str, *, pool_size: int = 10
    ) -> AsyncIterator[JobStore]:
        """Open a pool (failing fast with ``DatabaseUnavailable``) and close it on exit."""
        pool = await open_pool(dsn, namespace, pool_size)
        db = Database(pool, dsn, namespace)
        store = cls(db)
        try:
            yield store
        finally:
            await store.claims.close()
            await store.leases.close()
            db.close_batch_conns()
            await pool.close()

    @property
    def group_commits(self) -> list[GroupCommit[Any, Any]]:
        """The batchers of claims, completions and releases (their sizes are metrics)."""
        claims = self.claims
        return [claims.claim_batches, claims.completion_batches, self.leases.release_batches]

    def configure_claims(
        self, *, lease_seconds: float, worker_id: str, commit: str = "sync"
    ) -> None:
        """Set the lease and owner that claims made through this store carry, and whether
        their batches commit synchronously (``sync``) or not (``async``: see ``CommitMark``)."""
        if commit not in CLAIM_COMMITS:
            raise ValueError(f"claim commit must be sync or async, not {commit!r}")
        self.claim_config.lease_seconds = lease_seconds
        self.claim_config.worker_id = worker_id
        self.claim_config.commit = commit
        self._db.set_async_commit("claim_batch", commit == "async")

    async def check_schema(self) -> None:
        """Refuse to run on a schema that is missing or not at this release's version."""
        try:
            version = await self._fetchval("schema_version")
        except asyncpg.UndefinedTableError:
            version = None
        if version != LATEST_VERSION:
            found = "missing" if version is None else f"at version {version}"
            raise SchemaOutOfDate(
                f"schema {self.namespace!r} is {found}; this coldbrew needs version "
                f"{LATEST_VERSION}: run `coldbrew migrate`"
            )

    async def ping(self) -> str:
        """Run a trivial query; return the ``host:port`` that answered it (of a multi-host
        ``COLDBREW_DATABASE_URL``, the one the pool is on: /readyz reports it)."""

        async def op(conn: asyncpg.Connection) -> str:
            await conn.fetchval(QUERIES["ping"].text)
            return server_node(conn)

        return await self._run(op)

    def listen(
        self, channel: str, callback: Callable[[str], None]
    ) -> AbstractAsyncContextManager[asyncpg.Connection]:
        """A dedicated connection LISTENing on ``channel`` (a pooled one would lose it)."""
        return self._db.listen(channel, callback)

    def is_own_backend(self, pid: int) -> bool:
        """Whether ``pid`` is the server process of one of this store's batch connections
        (a NOTIFY from there reports what this worker already knows)."""
        return self._db.is_own_backend(pid)
