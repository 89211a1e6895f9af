"""``JobStore``: the only code that talks to PostgreSQL.

One method per named query in ``sql/queries.sql``. Per-job writes that happen
at high rate (claims, completions) go through group commit. Driver errors are
translated here, once: connection trouble becomes ``DatabaseUnavailable``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final, TypeVar

import asyncpg

from coldbrew.batching import GroupCommit
from coldbrew.errors import (
    DatabaseUnavailable,
    JobNotFound,
    SchemaOutOfDate,
    StaleWrite,
    TransientDatabaseError,
)
from coldbrew.model import JobRecord
from coldbrew.settings import mask_url
from coldbrew.sql import LATEST_VERSION, QUERIES
from coldbrew.topology import Topology

T = TypeVar("T")

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    # After a server restart asyncpg can hand back a connection whose protocol
    # is still mid-operation; the pool's reset then discards it, so retrying works.
    asyncpg.InternalClientError,
    TimeoutError,
)


@dataclass(slots=True)  # built per job: not frozen, a frozen __init__ costs ~2.5x
class ClaimRequest:
    """A delivered job to upsert and claim."""

    id: str
    type: str
    queue: str
    tenant: str
    args: dict[str, Any]
    priority: int
    max_attempts: int
    timeout: float | None
    idempotency_key: str | None


@dataclass(frozen=True, slots=True)
class CommitMark:
    """Where an asynchronously committed claim stands in this store's commit order.

    ``server`` is the start time of the PostgreSQL server it committed on (a
    restart changes it); ``seq`` counts this store's claim batches. A
    synchronous commit that wrote WAL on the same server and was sent after
    claim batch ``seq`` returned flushed that claim to disk.
    """

    server: datetime
    seq: int


@dataclass(slots=True)  # built per job: not frozen, a frozen __init__ costs ~2.5x
class ClaimResult:
    """What a claim found: ``claimed`` with our attempt number, or the row's status.

    A capped claim that found no room has status ``capped:tenant`` or
    ``capped:type``: the job is recorded as queued and its delivery waits.
    ``capped:tenant:busy`` or ``capped:type:busy``: another worker's capped
    claim held that scope's lock at that instant (there may be room; try soon).
    """

    id: str
    claimed: bool
    status: str
    attempt: int
    max_attempts: int
    timeout: float | None
    checkpoint: Any
    started_at: datetime | None
    mark: CommitMark | None = None
    """Set when the claim committed asynchronously: it is not durable until a later
    synchronous commit covers it (``JobStore.on_durable``). None: durable already."""


@dataclass(slots=True)  # built per job: not frozen, a frozen __init__ costs ~2.5x
class Outcome:
    """A fenced final (or retrying) write for one attempt."""

    id: str
    attempt: int
    status: str
    result: Any = None
    error_kind: str | None = None
    error_message: str | None = None
    delay: float = 0.0
    dead_reason: str | None = None
    progress: float | None = None
    progress_message: str | None = None


@dataclass(frozen=True, slots=True)
class DuePublish:
    """A row the relay must (re)publish."""

    id: str
    type: str
    queue: str
    tenant: str
    args: dict[str, Any]
    priority: int
    max_attempts: int
    timeout: float | None
    idempotency_key: str | None
    attempt: int
    publish_after: datetime


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    tenant: str
    queued: int
    running: int
    retrying: int
    dead: int
    failed: int
    oldest_waiting_seconds: float
    finished: int = 0


class RawJSON(str):
    """Text that is already JSON: written to a jsonb column as is, not encoded again."""

    __slots__ = ()


def _encode_json(value: Any) -> str:
    return value if type(value) is RawJSON else json.dumps(value)


TENANTS_CHANGED = "tenants-changed"
"""NOTIFY payload that says: re-read the tenants table."""


@dataclass(frozen=True, slots=True)
class TenantSettings:
    name: str
    weight: float
    max_running: int | None
    paused: bool
    created_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> TenantSettings:
        return cls(row["name"], row["weight"], row["max_running"], row["paused"], row["created_at"])


@dataclass(frozen=True, slots=True)
class JobTypeSettings:
    name: str
    max_running: int | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> JobTypeSettings:
        return cls(row["name"], row["max_running"], row["created_at"])


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb", encoder=_encode_json, decoder=json.loads, schema="pg_catalog"
    )


def connection_settings(namespace: str) -> dict[str, str]:
    """Server settings for every connection: the namespace is the schema searched."""
    return {"search_path": namespace, "application_name": f"coldbrew:{namespace}"}


# The group-commit statements join a batch of keys (at most a few hundred) to
# ``jobs``; the right plan is always one primary-key probe per key. asyncpg
# prepares them, and after five runs PostgreSQL caches a generic plan costed
# on the table's size *then*: a fresh namespace's table looks empty, so that
# plan hash-joins a sequential scan of ``jobs``, and keeps doing so as the
# table grows (autoanalyze comes a minute later, if at all). Measured in
# bench/throughput.py: the claim backend spent 200 µs of CPU per job instead
# of 50. These connections run nothing but those statements, so the other
# plan shapes are simply ruled out for them.
# Event-loop turns a busy claim or completion batch waits for company (batching.py).
GATHER_TURNS: Final = 8

KEYED_BATCH_PLANS: Final = MappingProxyType(
    {
        "enable_seqscan": "off",
        "enable_bitmapscan": "off",
        "enable_hashjoin": "off",
        "enable_mergejoin": "off",
    }
)


class JobStore:
    """Job rows, leases, tenants and rejected messages, on one asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool, dsn: str, namespace: str) -> None:
        self._pool = pool
        self._dsn = dsn
        self.namespace = namespace
        self.claims: GroupCommit[ClaimRequest, ClaimResult] = GroupCommit(
            "claim", self._claim_batch, gather_turns=GATHER_TURNS
        )
        self.completions: GroupCommit[Outcome, bool] = GroupCommit(
            "complete", self._complete_batch, gather_turns=GATHER_TURNS
        )
        # a drain hands back every held job at once: one statement per batch, not per job
        self.releases: GroupCommit[tuple[str, int, bool], bool] = GroupCommit(
            "release", self._release_batch
        )
        self._batch_conns: dict[str, asyncpg.Connection] = {}
        self._batch_servers: dict[str, datetime] = {}  # each batch connection's server start
        self._claim_seq = 0  # claim batches that returned so far (CommitMark.seq)
        self.on_durable: Callable[[datetime, int], None] | None = None
        """Told ``(server, seq)`` after each synchronous commit that wrote WAL: every
        asynchronous claim committed on that server with ``mark.seq <= seq`` is durable."""

    @classmethod
    @asynccontextmanager
    async def open(
        cls, dsn: str, namespace: str, *, pool_size: int = 10
    ) -> AsyncIterator[JobStore]:
        """Open a pool (failing fast with ``DatabaseUnavailable``) and close it on exit."""
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=1,
                max_size=pool_size,
                server_settings=connection_settings(namespace),
                init=_init_connection,
                timeout=10,
                command_timeout=60,
            )
        except CONNECTION_ERRORS as exc:
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL at {mask_url(dsn)}: {exc}"
            ) from exc
        except asyncpg.InvalidCatalogNameError as exc:
            raise DatabaseUnavailable(
                f"database of {mask_url(dsn)} does not exist: run `coldbrew migrate`"
            ) from exc
        store = cls(pool, dsn, namespace)
        try:
            yield store
        finally:
            await store.claims.close()
            await store.completions.close()
            await store.releases.close()
            for name in list(store._batch_conns):
                await store._drop_batch_conn(name)
            await pool.close()

    async def _run(self, op: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        try:
            async with self._pool.acquire() as conn:
                return await op(conn)
        except CONNECTION_ERRORS as exc:
            raise DatabaseUnavailable(f"PostgreSQL at {mask_url(self._dsn)}: {exc}") from exc
        except asyncpg.TransactionRollbackError as exc:
            raise _transient(exc) from exc

    async def _fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        query = QUERIES[name].text
        return await self._run(lambda conn: conn.fetch(query, *args))

    async def _batch_fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        """Run a group-commit statement on a connection of its own.

        Each batcher flushes one statement at a time, so one connection per
        query is enough, and it skips the pool's acquire and its reset query
        (one more round trip and commit per batch). A connection that fails
        or is interrupted is thrown away; the next flush connects anew, which
        is how a PostgreSQL restart is survived.
        """
        conn = self._batch_conns.get(name)
        try:
            if conn is None or conn.is_closed():
                settings = {**connection_settings(self.namespace), **KEYED_BATCH_PLANS}
                # every other batch commit must flush the WAL: completions and the
                # barrier are what make asynchronous claims durable (claimacks.py),
                # whatever the server's or the role's default says
                async_claims = name == "claim_batch" and self.claim_commit == "async"
                settings["synchronous_commit"] = "off" if async_claims else "on"
                conn = await asyncpg.connect(
                    self._dsn, server_settings=settings, timeout=10, command_timeout=60
                )
                await _init_connection(conn)
                self._batch_servers[name] = await conn.fetchval(QUERIES["server_started"].text)
                self._batch_conns[name] = conn
            rows: list[asyncpg.Record] = await conn.fetch(QUERIES[name].text, *args)
        except CONNECTION_ERRORS as exc:
            await self._drop_batch_conn(name)
            raise DatabaseUnavailable(f"PostgreSQL at {mask_url(self._dsn)}: {exc}") from exc
        except asyncpg.TransactionRollbackError as exc:  # rolled back; the connection is fine
            raise _transient(exc) from exc
        except asyncio.CancelledError:
            await self._drop_batch_conn(name)  # a statement may still be in flight on it
            raise
        return rows

    async def _drop_batch_conn(self, name: str) -> None:
        conn = self._batch_conns.pop(name, None)
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def _fetchrow(self, name: str, *args: Any) -> asyncpg.Record | None:
        query = QUERIES[name].text
        return await self._run(lambda conn: conn.fetchrow(query, *args))

    async def _fetchval(self, name: str, *args: Any) -> Any:
        query = QUERIES[name].text
        return await self._run(lambda conn: conn.fetchval(query, *args))

    async def _execute(self, name: str, *args: Any) -> str:
        query = QUERIES[name].text
        return await self._run(lambda conn: conn.execute(query, *args))

    # --- schema -------------------------------------------------------------

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

    async def ping(self) -> None:
        await self._run(lambda conn: conn.fetchval("SELECT 1"))

    # --- submissions and reads ---------------------------------------------

    async def insert_job(
        self, request: ClaimRequest, *, relay_grace: float
    ) -> tuple[JobRecord, datetime | None]:
        """Insert a queued, unpublished job; return it and, if it is new, its publish mark."""
        row = await self._fetchrow(
            "insert_job",
            request.id,
            request.type,
            request.queue,
            request.tenant,
            request.args,
            request.priority,
            request.max_attempts,
            request.timeout,
            request.idempotency_key,
            relay_grace,
        )
        if row is not None:
            return JobRecord.from_row(row), row["publish_after"]
        return await self.get_job(request.id), None

    async def get_job(self, job_id: str) -> JobRecord:
        row = await self._fetchrow("get_job", job_id)
        if row is None:
            raise JobNotFound(job_id)
        return JobRecord.from_row(row)

    async def get_finished_jobs(self, ids: Sequence[str]) -> list[JobRecord]:
        """Which of ``ids`` are terminal: one primary-key lookup per id, in one statement."""
        return [
            JobRecord.from_row(row) for row in await self._fetch("get_finished_jobs", list(ids))
        ]

    async def mark_published(self, marks: Sequence[tuple[str, datetime]]) -> None:
        if marks:
            await self._execute("mark_published", [m[0] for m in marks], [m[1] for m in marks])

    # --- the hot path: claims and completions (group commit) --------------

    async def _claim_batch(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        rows = await self._batch_fetch("claim_batch", *self._claim_args(requests))
        mark = None
        if self.claim_commit == "async":
            self._claim_seq += 1
            mark = CommitMark(self._batch_servers["claim_batch"], self._claim_seq)
        found = {
            row["id"]: _claim_result(
                row, row["claimed"], row["status"], mark if row["claimed"] else None
            )
            for row in rows
        }
        return [found.get(r.id) or _vanished(r.id) for r in requests]

    def _claim_args(self, requests: Sequence[ClaimRequest]) -> tuple[Any, ...]:
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
        )

    async def claim_capped(self, request: ClaimRequest) -> ClaimResult:
        """Claim a job whose tenant or type has a fleet-wide cap, if the caps leave room.

        A short transaction takes the capped scopes' advisory locks *without
        waiting* (tenant, then type), then counts their ``running`` rows in a
        statement of its own, so its snapshot is taken under the locks: two
        workers cannot both see the last free place, and a crashed worker's
        jobs free their places when the reaper moves them, with no counter to
        drift. A lock held by another worker's capped claim answers at once:
        ``capped:<scope>:busy``, so no pooled connection ever waits on a lock.
        Without room the lock is let go, the job is recorded as queued (visible
        to ``status`` and the gauges) and ``capped:<scope>`` is returned; its
        delivery is held, not nacked. ``on_capped_claim`` then hears the result,
        with the places each capped scope has left after a claim (0 when full).
        """
        left: dict[str, int] = {}

        async def op(conn: asyncpg.Connection) -> ClaimResult:
            left.clear()
            async with conn.transaction():
                locks = await conn.fetchrow(
                    QUERIES["try_lock_cap_scopes"].text, request.tenant, request.type
                )
                full = _busy_scope(locks)
                if full is None:
                    room = await conn.fetchrow(
                        QUERIES["cap_room"].text,
                        request.tenant if locks["tenant_cap"] is not None else None,
                        request.type if locks["type_cap"] is not None else None,
                    )
                    full = _full_scope(locks, room)
                    if full is None:
                        left.update(_places_left(locks, room))
                        rows = await conn.fetch(
                            QUERIES["claim_batch"].text, *self._claim_args([request])
                        )
                        if not rows:
                            return _vanished(request.id)
                        return _claim_result(rows[0], rows[0]["claimed"], rows[0]["status"])
            # no room: the locks are already let go; record the job as waiting
            await conn.execute(QUERIES["register_waiting"].text, *_waiting_args(request))
            row = await conn.fetchrow(QUERIES["claimability"].text, request.id)
            if row is None:
                return _vanished(request.id)
            status = f"capped:{full}" if row["claimable"] else row["status"]
            return _claim_result(row, False, status)

        result = await self._run(op)
        if self.on_capped_claim is not None:
            self.on_capped_claim(request, result, left if result.claimed else {})
        return result

    on_capped_claim: Callable[[ClaimRequest, ClaimResult, Mapping[str, int]], None] | None = None
    """Told every ``claim_capped`` result as soon as it is known, before the job runs, with
    the places its capped scopes (``tenant``, ``type``) have left once it took one: the
    worker lets the scope's next waiting delivery try then, unless none is left."""

    def cap_channel(self) -> str:
        """The NOTIFY channel on which ``complete_batch`` names capped scopes that freed a place."""
        return Topology(self.namespace).caps_channel

    def is_own_backend(self, pid: int) -> bool:
        """Whether ``pid`` is the server process of one of this store's batch connections
        (a NOTIFY from there reports what this worker already knows)."""
        return any(
            not conn.is_closed() and conn.get_server_pid() == pid
            for conn in self._batch_conns.values()
        )

    async def notify_caps_freed(self, scopes: Sequence[str]) -> None:
        """NOTIFY the fleet that places of these capped scopes (``tenant:x``, ``type:y``) freed."""
        channel = self.cap_channel()

        async def op(conn: asyncpg.Connection) -> None:
            for scope in scopes:
                await conn.execute(QUERIES["notify"].text, channel, scope)

        await self._run(op)

    async def _complete_batch(self, outcomes: Sequence[Outcome]) -> list[bool]:
        covers = self._claim_seq  # claim batches that committed before this statement is sent
        rows = await self._batch_fetch(
            "complete_batch",
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
        written = {row["id"] for row in rows}
        if written:  # a transaction that changed nothing writes no commit record: no flush
            self._durable(self._batch_servers["complete_batch"], covers)
        return [o.id in written for o in outcomes]

    def _durable(self, server: datetime, covers: int) -> None:
        if self.on_durable is not None and covers > 0:
            self.on_durable(server, covers)

    async def durability_barrier(self) -> tuple[datetime, int]:
        """Commit a tiny transaction synchronously; return ``(server, seq)`` it made durable.

        Every asynchronous claim committed on ``server`` with ``mark.seq <= seq``
        is on disk once this returns (``on_durable`` is not told: the caller
        is). A claim made on another server start is not covered: it may be lost.
        """
        covers = self._claim_seq
        rows = await self._batch_fetch("durability_barrier")
        server: datetime = rows[0]["server_started"]
        return server, covers

    async def verify_claims(self, ids: Sequence[str]) -> dict[str, asyncpg.Record]:
        """The rows of these jobs (those that exist), by id: did their claims survive a restart?"""
        rows = await self._fetch("verify_claims", list(ids))
        return {row["id"]: row for row in rows}

    lease_seconds: float = 30.0
    worker_id: str = "unknown"
    claim_commit: str = "sync"

    def configure_claims(
        self, *, lease_seconds: float, worker_id: str, commit: str = "sync"
    ) -> None:
        """Set the lease and owner that claims made through this store carry, and whether
        their batches commit synchronously (``sync``) or not (``async``: see ``CommitMark``)."""
        if commit not in ("sync", "async"):
            raise ValueError(f"claim commit must be sync or async, not {commit!r}")
        self.lease_seconds = lease_seconds
        self.worker_id = worker_id
        if commit != self.claim_commit:
            self.claim_commit = commit
            # the claim connection's synchronous_commit is set when it connects
            conn = self._batch_conns.pop("claim_batch", None)
            if conn is not None and not conn.is_closed():
                conn.terminate()

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        return await self.claims.submit(request)

    async def complete(self, outcome: Outcome) -> bool:
        """Write an attempt's outcome; False when it was fenced (the row moved on)."""
        return await self.completions.submit(outcome)

    def complete_soon(self, outcome: Outcome) -> asyncio.Future[bool]:
        """``complete`` as a future: the write proceeds even if its waiter is cancelled."""
        return self.completions.enqueue(outcome)

    # --- leases ------------------------------------------------------------

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

    async def _release_batch(self, held: Sequence[tuple[str, int, bool]]) -> list[bool]:
        released = await self.release(held)
        return [h[0] in released for h in held]

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

    async def list_rejected(self, reason_contains: str | None, limit: int) -> list[asyncpg.Record]:
        return await self._fetch("list_rejected", reason_contains, limit)

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
        ``server_clock``); without it, it is read here first.
        """
        if contact is None:
            contact = (await self.server_clock())[0]
        lease = self.lease_seconds if lease_seconds is None else lease_seconds
        return await self._fetch("reap_expired", limit, lease, contact, max_gap)

    async def take_due_publishes(self, limit: int, retry_after: float) -> list[DuePublish]:
        await self._execute("clear_stale_publish_marks", limit)
        rows = await self._fetch("take_due_publishes", limit, retry_after)
        return [
            DuePublish(
                id=row["id"],
                type=row["type"],
                queue=row["queue"],
                tenant=row["tenant"],
                args=row["args"],
                priority=row["priority"],
                max_attempts=row["max_attempts"],
                timeout=row["timeout_seconds"],
                idempotency_key=row["idempotency_key"],
                attempt=row["attempt"],
                publish_after=row["publish_after"],
            )
            for row in rows
        ]

    # --- job-side writes (fenced) -----------------------------------------

    async def request_cancel(self, job_id: str, reason: str) -> JobRecord:
        row = await self._fetchrow("request_cancel", job_id, reason)
        if row is None:
            return await self.get_job(job_id)  # raises JobNotFound, or shows the final status
        return JobRecord.from_row(row)

    async def claim_once(self, job_id: str, name: str, attempt: int) -> bool:
        row = await self._fetchrow("claim_once", job_id, name, attempt)
        if row is None or not row["holds"]:
            raise StaleWrite(f"job {job_id} attempt {attempt} no longer holds its claim")
        return bool(row["taken"])

    @asynccontextmanager
    async def once_transaction(
        self, job_id: str, name: str, attempt: int
    ) -> AsyncIterator[asyncpg.Connection | None]:
        """A transaction holding the once-guard; yields the connection, or None if taken."""
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                row = await conn.fetchrow(QUERIES["claim_once"].text, job_id, name, attempt)
                if row is None or not row["holds"]:
                    raise StaleWrite(f"job {job_id} attempt {attempt} no longer holds its claim")
                yield conn if row["taken"] else None
        except CONNECTION_ERRORS as exc:
            raise DatabaseUnavailable(f"PostgreSQL at {mask_url(self._dsn)}: {exc}") from exc

    async def save_checkpoint(self, job_id: str, attempt: int, state: Any) -> None:
        if await self._fetchval("save_checkpoint", job_id, attempt, state) is None:
            raise StaleWrite(f"job {job_id} attempt {attempt} no longer holds its claim")

    # --- tenants and rejected messages -------------------------------------

    async def list_tenant_queues(self) -> list[tuple[str, str]]:
        return [(row["queue"], row["tenant"]) for row in await self._fetch("list_tenant_queues")]

    async def add_tenant_queue(self, queue: str, tenant: str, channel: str) -> bool:
        """Record a provisioned queue and NOTIFY the fleet, in one transaction."""

        async def op(conn: asyncpg.Connection) -> bool:
            async with conn.transaction():
                added = bool(await conn.fetchval(QUERIES["add_tenant_queue"].text, queue, tenant))
                await conn.execute(QUERIES["notify"].text, channel, f"{queue}.{tenant}")
                return added

        return await self._run(op)

    async def list_tenants(self) -> list[TenantSettings]:
        return [TenantSettings.from_row(row) for row in await self._fetch("list_tenants")]

    async def set_tenant(
        self,
        name: str,
        *,
        weight: float | None = None,
        paused: bool | None = None,
        max_running: int | None = None,
        uncap: bool = False,
        channel: str,
    ) -> TenantSettings:
        """Create or change a tenant and tell the fleet (NOTIFY), in one transaction."""

        async def op(conn: asyncpg.Connection) -> TenantSettings:
            async with conn.transaction():
                row = await conn.fetchrow(
                    QUERIES["set_tenant"].text, name, weight, paused, max_running, uncap
                )
                await _notify_settings_changed(conn, channel)
                return TenantSettings.from_row(row)

        return await self._run(op)

    async def list_job_types(self) -> list[JobTypeSettings]:
        return [JobTypeSettings.from_row(row) for row in await self._fetch("list_job_types")]

    async def set_job_type(
        self, name: str, *, max_running: int | None, channel: str
    ) -> JobTypeSettings:
        """Set (or, with None, remove) a job type's fleet-wide cap and tell the fleet."""

        async def op(conn: asyncpg.Connection) -> JobTypeSettings:
            async with conn.transaction():
                row = await conn.fetchrow(QUERIES["set_job_type"].text, name, max_running)
                await _notify_settings_changed(conn, channel)
                return JobTypeSettings.from_row(row)

        return await self._run(op)

    async def insert_rejected(
        self,
        rows: Sequence[tuple[str, str, str | None, str, dict[str, Any] | None, bytes]],
    ) -> None:
        query = QUERIES["insert_rejected"].text
        await self._run(lambda conn: conn.executemany(query, rows))

    async def rejected_counts(self, tenant: str | None = None) -> dict[str, int]:
        """Rejected messages by reason; with ``tenant``, only those routed to that tenant."""
        rows = await self._fetch("rejected_counts", tenant)
        return {row["reason"]: row["count"] for row in rows}

    async def queue_stats(self, tenant: str | None = None) -> list[QueueStats]:
        """Counts per lane and tenant; with ``tenant``, that tenant's lanes only."""
        return [QueueStats(**dict(row)) for row in await self._fetch("queue_stats", tenant)]

    # --- LISTEN ---------------------------------------------------------------

    @asynccontextmanager
    async def listen(
        self, channel: str, callback: Callable[[str], None]
    ) -> AsyncIterator[asyncpg.Connection]:
        """A dedicated connection LISTENing on ``channel`` (a pooled one would lose it)."""
        try:
            conn = await asyncpg.connect(
                self._dsn, server_settings=connection_settings(self.namespace), timeout=10
            )
        except CONNECTION_ERRORS as exc:
            raise DatabaseUnavailable(f"PostgreSQL at {mask_url(self._dsn)}: {exc}") from exc

        def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
            callback(payload)

        try:
            await conn.add_listener(channel, on_notify)
            yield conn
        finally:
            if not conn.is_closed():
                await conn.close(timeout=5)

    # --- worker liveness ------------------------------------------------------------------
    # The liveness session is a dedicated connection (never a pooled one: the pool's
    # reset query runs pg_advisory_unlock_all()), passed back in by its owner,
    # worker/liveness.py. Errors are translated as everywhere else in the store.

    async def server_clock(self) -> tuple[datetime, datetime]:
        """The server's ``now()`` and start time (a restart changes the latter)."""
        row = await self._fetchrow("server_clock")
        assert row is not None  # a SELECT without FROM returns one row
        return row["now"], row["server_started"]

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
            **connection_settings(self.namespace),
            "application_name": f"coldbrew:{self.namespace}:liveness:{worker_id}"[:63],
            "tcp_keepalives_idle": str(idle),
            "tcp_keepalives_interval": str(interval),
            "tcp_keepalives_count": "3",
        }
        try:
            return await asyncpg.connect(
                self._dsn, server_settings=settings, timeout=10, command_timeout=30
            )
        except (*CONNECTION_ERRORS, asyncpg.TooManyConnectionsError) as exc:
            raise DatabaseUnavailable(f"PostgreSQL at {mask_url(self._dsn)}: {exc}") from exc

    async def _on(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run ``op`` on a dedicated connection, translating the driver's errors."""
        try:
            return await op()
        except CONNECTION_ERRORS as exc:
            raise DatabaseUnavailable(f"PostgreSQL at {mask_url(self._dsn)}: {exc}") from exc
        except asyncpg.TransactionRollbackError as exc:
            raise _transient(exc) from exc
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


async def _notify_settings_changed(conn: asyncpg.Connection, channel: str) -> None:
    """NOTIFY ``tenants-changed`` (delivered when the caller's transaction commits)."""
    await conn.execute(QUERIES["notify"].text, channel, TENANTS_CHANGED)


def _transient(exc: asyncpg.TransactionRollbackError) -> TransientDatabaseError:
    return TransientDatabaseError(
        f"PostgreSQL rolled the statement back ({exc.sqlstate} {type(exc).__name__}: {exc}); "
        "nothing was written, retrying"
    )


def _claim_result(
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
    )


def _busy_scope(locks: Any) -> str | None:
    """Which scope's lock another transaction holds (``<scope>:busy``), or None."""
    if locks["tenant_locked"] is False:
        return "tenant:busy"
    if locks["type_locked"] is False:
        return "type:busy"
    return None


def _places_left(locks: Any, room: Any) -> dict[str, int]:
    """Places each capped scope has left once this claim took one."""
    left = {}
    if locks["tenant_cap"] is not None:
        left["tenant"] = locks["tenant_cap"] - room["tenant_running"] - 1
    if locks["type_cap"] is not None:
        left["type"] = locks["type_cap"] - room["type_running"] - 1
    return left


def _full_scope(locks: Any, room: Any) -> str | None:
    """Which cap (``tenant`` first, then ``type``) leaves no room, or None."""
    if locks["tenant_cap"] is not None and room["tenant_running"] >= locks["tenant_cap"]:
        return "tenant"
    if locks["type_cap"] is not None and room["type_running"] >= locks["type_cap"]:
        return "type"
    return None


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


def _vanished(job_id: str) -> ClaimResult:
    """A claim that found no row at all: another worker's insert is still in flight."""
    return ClaimResult(job_id, False, "unknown", 0, 0, None, None, None)


# --- worker liveness ------------------------------------------------------------------


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
