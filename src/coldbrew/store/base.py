"""What every store stands on: the pool, connection settings, driver-error translation.

``Database`` is the one pool (and the few dedicated connections: one per
group-commit statement, one per LISTEN). ``StoreBase`` gives each store its
helpers: run one named query from ``sql/queries.sql``, with connection
trouble turned into ``DatabaseUnavailable`` here, once, and a rolled-back
transaction into ``TransientDatabaseError``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final, TypeVar

import asyncpg

from coldbrew.errors import DatabaseUnavailable, DataRefused, TransientDatabaseError
from coldbrew.settings import mask_url
from coldbrew.sql import QUERIES
from coldbrew.store.records import RawJSON

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

# Event-loop turns a busy claim or completion batch waits for company (batching.py).
GATHER_TURNS: Final = 8

# The group-commit statements join a batch of keys (at most a few hundred) to
# ``jobs``; the right plan is always one primary-key probe per key. asyncpg
# prepares them, and after five runs PostgreSQL caches a generic plan costed
# on the table's size *then*: a fresh namespace's table looks empty, so that
# plan hash-joins a sequential scan of ``jobs``, and keeps doing so as the
# table grows (autoanalyze comes a minute later, if at all). Measured in
# bench/throughput.py: the claim backend spent 200 µs of CPU per job instead
# of 50. These connections run nothing but those statements, so the other
# plan shapes are simply ruled out for them.
#
# With those shapes ruled out the generic plan is the right one for every batch size,
# so it is forced: under the default plan_cache_mode (auto) PostgreSQL compares the
# generic plan's cost (costed for unnest's default of 10 rows) with its custom plans'
# (costed for the array it was given), and for batches of fewer than about 5 jobs
# keeps planning each statement anew. Measured with bench/pg_cost.py (batches of 2):
# the claim and completion cost PostgreSQL 955 µs of CPU per job with a plan per
# statement, 488 with the generic plan; at 5 and 20 jobs a batch the two are the same
# (auto had chosen the generic plan). Small batches are the low-load, latency-bound
# case: each job its own claim and completion.
KEYED_BATCH_PLANS: Final = MappingProxyType(
    {
        "enable_seqscan": "off",
        "enable_bitmapscan": "off",
        "enable_hashjoin": "off",
        "enable_mergejoin": "off",
        "plan_cache_mode": "force_generic_plan",
    }
)


def connection_settings(namespace: str) -> dict[str, str]:
    """Server settings for every connection: the namespace is the schema searched."""
    return {"search_path": namespace, "application_name": f"coldbrew:{namespace}"}


def server_node(conn: asyncpg.Connection) -> str:
    """``host:port`` (or the socket path) ``conn`` is connected to: which of a multi-host
    URL's hosts. asyncpg keeps the address it connected to in ``_addr`` (0.2x to 0.32)."""
    addr = getattr(conn, "_addr", None)
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = str(addr[0])
        return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"
    return str(addr) if addr else "unknown"


def _encode_json(value: Any) -> str:
    return value if type(value) is RawJSON else json.dumps(value)


async def init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb", encoder=_encode_json, decoder=json.loads, schema="pg_catalog"
    )


# PostgreSQL refused a statement for the data it carried (errors.DataRefused): class 22
# (asyncpg's own "invalid input for query argument" is one too), the CHECK and NOT NULL
# constraints, and class 54 (a jsonb or array over a size limit). Not unique or foreign
# key violations: those come from other rows, not from this statement's data.
DATA_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.DataError,
    asyncpg.CheckViolationError,
    asyncpg.NotNullViolationError,
    asyncpg.ProgramLimitExceededError,
)


def refused(exc: BaseException) -> DataRefused:
    sqlstate = getattr(exc, "sqlstate", None)
    detail = f"{sqlstate} {type(exc).__name__}: {exc}"  # asyncpg's text has PostgreSQL's DETAIL
    return DataRefused(f"PostgreSQL refused the data ({detail})", sqlstate)


def transient(exc: asyncpg.TransactionRollbackError) -> TransientDatabaseError:
    return TransientDatabaseError(
        f"PostgreSQL rolled the statement back ({exc.sqlstate} {type(exc).__name__}: {exc}); "
        "nothing was written, retrying"
    )


async def open_pool(dsn: str, namespace: str, pool_size: int) -> asyncpg.Pool:
    """The pool every store shares; fails fast with ``DatabaseUnavailable``."""
    try:
        return await asyncpg.create_pool(
            dsn,
            min_size=1,
            max_size=pool_size,
            server_settings=connection_settings(namespace),
            init=init_connection,
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


class Database:
    """One pool, and the dedicated connections of the group-commit statements."""

    def __init__(self, pool: asyncpg.Pool, dsn: str, namespace: str) -> None:
        self.pool = pool
        self.dsn = dsn
        self.namespace = namespace
        self._batch_conns: dict[str, asyncpg.Connection] = {}
        self._batch_servers: dict[str, datetime] = {}  # each batch connection's server start
        self._async_commit: set[str] = set()  # batch statements that commit asynchronously

    def unavailable(self, exc: BaseException) -> DatabaseUnavailable:
        return DatabaseUnavailable(f"PostgreSQL at {mask_url(self.dsn)}: {exc}")

    async def run(self, op: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """``op`` on a pooled connection, with the driver's errors translated."""
        try:
            async with self.pool.acquire() as conn:
                return await op(conn)
        except CONNECTION_ERRORS as exc:
            raise self.unavailable(exc) from exc
        except asyncpg.TransactionRollbackError as exc:
            raise transient(exc) from exc
        except DATA_ERRORS as exc:  # this statement's data; the connection is fine
            raise refused(exc) from exc

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection in a transaction, for as long as the caller's block runs."""
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                yield conn
        except CONNECTION_ERRORS as exc:
            raise self.unavailable(exc) from exc
        except DATA_ERRORS as exc:  # rolled back with its transaction
            raise refused(exc) from exc

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection for the caller's block, with the driver's errors translated."""
        try:
            async with self.pool.acquire() as conn:
                yield conn
        except CONNECTION_ERRORS as exc:
            raise self.unavailable(exc) from exc
        except asyncpg.TransactionRollbackError as exc:
            raise transient(exc) from exc
        except DATA_ERRORS as exc:  # this statement's data; the connection is fine
            raise refused(exc) from exc

    # --- the group-commit statements' connections ------------------------------------

    async def batch_fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
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
                conn = await self._connect_batch(name)
            rows: list[asyncpg.Record] = await conn.fetch(QUERIES[name].text, *args)
        except CONNECTION_ERRORS as exc:
            self.drop_batch_conn(name)
            raise self.unavailable(exc) from exc
        except asyncpg.TransactionRollbackError as exc:  # rolled back; the connection is fine
            raise transient(exc) from exc
        except DATA_ERRORS as exc:  # this statement's data; the connection is fine
            raise refused(exc) from exc
        except asyncio.CancelledError:
            self.drop_batch_conn(name)  # a statement may still be in flight on it
            raise
        return rows

    async def batch_transaction(
        self, name: str, op: Callable[[asyncpg.Connection], Awaitable[T]]
    ) -> T:
        """``op`` in one transaction on ``name``'s group-commit connection, with the same
        error translation as ``batch_fetch`` (an outcome batch that spawns child jobs)."""
        conn = self._batch_conns.get(name)
        try:
            if conn is None or conn.is_closed():
                conn = await self._connect_batch(name)
            async with conn.transaction():
                return await op(conn)
        except CONNECTION_ERRORS as exc:
            self.drop_batch_conn(name)
            raise self.unavailable(exc) from exc
        except asyncpg.TransactionRollbackError as exc:
            raise transient(exc) from exc
        except DATA_ERRORS as exc:
            raise refused(exc) from exc
        except asyncio.CancelledError:
            self.drop_batch_conn(name)
            raise

    async def _connect_batch(self, name: str) -> asyncpg.Connection:
        settings = {**connection_settings(self.namespace), **KEYED_BATCH_PLANS}
        # every other batch commit must flush the WAL: completions and the barrier
        # are what make asynchronous claims durable (claimacks.py), whatever the
        # server's or the role's default says
        settings["synchronous_commit"] = "off" if name in self._async_commit else "on"
        conn = await asyncpg.connect(
            self.dsn, server_settings=settings, timeout=10, command_timeout=60
        )
        await init_connection(conn)
        # after a failover, the first connection to the promoted standby records its
        # timeline, so that every connection reads one server_started() for it (0019)
        await conn.execute(QUERIES["note_server_epoch"].text)
        self._batch_servers[name] = await conn.fetchval(QUERIES["server_started"].text)
        self._batch_conns[name] = conn
        return conn

    def batch_server(self, name: str) -> datetime:
        """The start time of the server that ``name``'s connection last ran on."""
        return self._batch_servers[name]

    def set_async_commit(self, name: str, on: bool) -> None:
        """Whether ``name``'s batches commit without waiting for the WAL flush."""
        if on == (name in self._async_commit):
            return
        if on:
            self._async_commit.add(name)
        else:
            self._async_commit.discard(name)
        self.drop_batch_conn(name)  # synchronous_commit is set when it connects

    def drop_batch_conn(self, name: str) -> None:
        conn = self._batch_conns.pop(name, None)
        if conn is not None and not conn.is_closed():
            conn.terminate()

    def close_batch_conns(self) -> None:
        for name in list(self._batch_conns):
            self.drop_batch_conn(name)

    def is_own_backend(self, pid: int) -> bool:
        """Whether ``pid`` is the server process of one of the batch connections
        (a NOTIFY from there reports what this worker already knows)."""
        return any(
            not conn.is_closed() and conn.get_server_pid() == pid
            for conn in self._batch_conns.values()
        )

    # --- LISTEN ------------------------------------------------------------------------

    @asynccontextmanager
    async def listen(
        self, channel: str, callback: Callable[[str], None]
    ) -> AsyncIterator[asyncpg.Connection]:
        """A dedicated connection LISTENing on ``channel`` (a pooled one would lose it)."""
        try:
            conn = await asyncpg.connect(
                self.dsn, server_settings=connection_settings(self.namespace), timeout=10
            )
        except CONNECTION_ERRORS as exc:
            raise self.unavailable(exc) from exc

        def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
            callback(payload)

        try:
            await conn.add_listener(channel, on_notify)
            yield conn
        finally:
            if not conn.is_closed():
                await conn.close(timeout=5)


class StoreBase:
    """A store over the shared ``Database``: one named query per helper call."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def _run(self, op: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        return await self._db.run(op)

    async def _fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        query = QUERIES[name].text
        return await self._db.run(lambda conn: conn.fetch(query, *args))

    async def _fetchrow(self, name: str, *args: Any) -> asyncpg.Record | None:
        query = QUERIES[name].text
        return await self._db.run(lambda conn: conn.fetchrow(query, *args))

    async def _fetchval(self, name: str, *args: Any) -> Any:
        query = QUERIES[name].text
        return await self._db.run(lambda conn: conn.fetchval(query, *args))

    async def _execute(self, name: str, *args: Any) -> str:
        query = QUERIES[name].text
        return await self._db.run(lambda conn: conn.execute(query, *args))

    async def _batch_fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        return await self._db.batch_fetch(name, *args)
