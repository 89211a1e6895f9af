"""``LivenessStore``: which workers are alive, told by PostgreSQL (worker/liveness.py).

Each worker holds a session-level advisory lock on a dedicated connection
(never a pooled one: the pool's reset query runs ``pg_advisory_unlock_all()``)
and keeps a ``workers`` row. When a worker's backend dies, its lock is free at
once, and another worker releases its running jobs instead of waiting for
their leases. The connection is passed back in by its owner; errors are
translated as everywhere else in the store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from coldbrew.errors import DatabaseUnavailable, TransientDatabaseError
from coldbrew.settings import mask_url
from coldbrew.sql import QUERIES
from coldbrew.store.base import (
    CONNECTION_ERRORS,
    StoreBase,
    connection_settings,
    server_node,
    transient,
)

T = TypeVar("T")


class LivenessStore(StoreBase):
    """The workers' rows and locks, the server's clock, and releasing a dead worker's jobs."""

    async def server_clock(self) -> tuple[datetime, datetime]:
        """The server's ``now()`` and start time (a restart changes the latter)."""
        now, started, _ = await self.server_contact()
        return now, started

    async def server_contact(self) -> tuple[datetime, datetime, str]:
        """``server_clock`` and the ``host:port`` that answered: a change of either start
        time or host (a multi-host URL's failover, a promoted standby) is a new server."""

        async def op(conn: asyncpg.Connection) -> tuple[datetime, datetime, str]:
            row = await conn.fetchrow(QUERIES["server_clock"].text)
            return row["now"], row["server_started"], server_node(conn)

        return await self._run(op)

    async def open_liveness_session(
        self, worker_id: str, *, keepalive_seconds: float
    ) -> asyncpg.Connection:
        """A dedicated connection for a worker's liveness lock.

        Server-side TCP keepalives end the session of a worker whose host
        vanished without closing its connection (no FIN) after about
        ``keepalive_seconds``, so its lock does not linger for the kernel's two
        hours; they are set near the lease, so that a worker cut off for less
        than that keeps its lock, as it keeps its leases.
        """
        idle = max(1, round(keepalive_seconds * 2 / 3))
        interval = max(1, round(keepalive_seconds / 9))
        settings = {
            **connection_settings(self._db.namespace),
            "application_name": f"coldbrew:{self._db.namespace}:liveness:{worker_id}"[:63],
            "tcp_keepalives_idle": str(idle),
            "tcp_keepalives_interval": str(interval),
            "tcp_keepalives_count": "3",
        }
        try:
            return await asyncpg.connect(
                self._db.dsn, server_settings=settings, timeout=10, command_timeout=30
            )
        except (*CONNECTION_ERRORS, asyncpg.TooManyConnectionsError) as exc:
            raise DatabaseUnavailable(f"PostgreSQL at {mask_url(self._db.dsn)}: {exc}") from exc

    async def _on(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run ``op`` on a dedicated connection, translating the driver's errors."""
        try:
            return await op()
        except CONNECTION_ERRORS as exc:
            raise DatabaseUnavailable(f"PostgreSQL at {mask_url(self._db.dsn)}: {exc}") from exc
        except asyncpg.TransactionRollbackError as exc:
            raise transient(exc) from exc
        except asyncpg.LockNotAvailableError as exc:
            raise TransientDatabaseError(
                f"PostgreSQL: a row stayed locked past the lock timeout ({exc}); retrying"
            ) from exc

    async def take_worker_lock(self, conn: asyncpg.Connection, worker_id: str) -> WorkerLock:
        """Try to take the worker's liveness lock in ``conn``'s session (never waits)."""
        row = await self._on(lambda: conn.fetchrow(QUERIES["take_worker_lock"].text, worker_id))
        return WorkerLock(row["locked"], row["holder"], row["backend_pid"], row["server_started"])

    async def terminate_backend(self, conn: asyncpg.Connection, pid: int) -> bool:
        """End the server session ``pid`` (this worker's own, left behind by an outage)."""
        return bool(await self._on(lambda: conn.fetchval(QUERIES["terminate_backend"].text, pid)))

    async def register_worker(
        self, conn: asyncpg.Connection, info: WorkerInfo, jobs_in_flight: int
    ) -> datetime:
        """Record the worker (or refresh its row) from its liveness session; its start time."""
        started: datetime = await self._on(
            lambda: conn.fetchval(
                QUERIES["register_worker"].text,
                info.id,
                info.instance,
                info.host,
                info.pid,
                info.version,
                list(info.lanes),
                info.concurrency,
                jobs_in_flight,
            )
        )
        return started

    async def worker_heartbeat(
        self,
        conn: asyncpg.Connection,
        info: WorkerInfo,
        jobs_in_flight: int,
        *,
        grace: float,
        lease_seconds: float,
    ) -> WorkerBeat:
        """Refresh the worker's heartbeat and find the workers that look dead, in one statement."""
        row = await self._on(
            lambda: conn.fetchrow(
                QUERIES["worker_heartbeat"].text,
                info.id,
                info.instance,
                jobs_in_flight,
                grace,
                lease_seconds,
            )
        )
        return WorkerBeat(row["registered"], row["locked"], list(row["dead"]))

    async def release_dead_workers(
        self, conn: asyncpg.Connection, ids: Sequence[str], *, grace: float, lease_seconds: float
    ) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
        """Remove the rows of workers that are still dead and release their running jobs,
        in one transaction; returns ``(removed workers, released jobs)``."""

        async def op() -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
            async with conn.transaction():
                await conn.execute(QUERIES["liveness_lock_timeout"].text, "5s")
                removed = await conn.fetch(
                    QUERIES["remove_dead_workers"].text, list(ids), grace, lease_seconds
                )
                if not removed:
                    return [], []
                released = await conn.fetch(
                    QUERIES["release_worker_jobs"].text, [row["id"] for row in removed]
                )
                return removed, released

        return await self._on(op)

    async def release_worker_jobs(
        self, conn: asyncpg.Connection, ids: Sequence[str]
    ) -> list[asyncpg.Record]:
        """Release the running jobs of these (dead) workers: due again at once."""
        return await self._on(lambda: conn.fetch(QUERIES["release_worker_jobs"].text, list(ids)))

    async def unregister_worker(self, conn: asyncpg.Connection, info: WorkerInfo) -> None:
        """Remove the worker's own row (a clean stop)."""
        await self._on(
            lambda: conn.execute(QUERIES["unregister_worker"].text, info.id, info.instance)
        )

    async def list_workers(self) -> list[WorkerRow]:
        """Every registered worker, oldest first, with whether its liveness lock is held."""
        return [WorkerRow.from_row(row) for row in await self._fetch("list_workers")]


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """Who a worker is, as its ``workers`` row says; ``instance`` is new for every run, so a
    worker restarted under the same id is told from the process that wrote the row."""

    id: str
    instance: str
    host: str
    pid: int
    version: str
    lanes: tuple[str, ...]
    concurrency: int


@dataclass(frozen=True, slots=True)
class WorkerLock:
    """``take_worker_lock``'s answer: held now, or the server pid of the session holding it."""

    locked: bool
    holder: int | None
    backend_pid: int
    server_started: datetime


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """One liveness tick: our row exists, our session holds our lock, who looks dead."""

    registered: bool
    locked: bool
    dead: list[str]


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """A ``workers`` row for ``coldbrew workers`` and the dashboard."""

    id: str
    host: str
    pid: int
    version: str
    lanes: list[str]
    concurrency: int
    jobs_in_flight: int
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_seconds: float
    alive: bool

    @classmethod
    def from_row(cls, row: Any) -> WorkerRow:
        return cls(
            row["id"],
            row["host"],
            row["pid"],
            row["version"],
            list(row["lanes"]),
            row["concurrency"],
            row["jobs_in_flight"],
            row["started_at"],
            row["heartbeat_at"],
            row["heartbeat_age_seconds"],
            row["alive"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "lanes": self.lanes,
            "concurrency": self.concurrency,
            "jobs_in_flight": self.jobs_in_flight,
            "started_at": self.started_at.isoformat(),
            "heartbeat_at": self.heartbeat_at.isoformat(),
            "heartbeat_age_seconds": round(self.heartbeat_age_seconds, 3),
            "alive": self.alive,
        }
