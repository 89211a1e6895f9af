"""``SchemaStore``: the statements of ``coldbrew migrate``, on a connection of their own.

They run before the namespace's schema exists, so not on the pool (whose
``search_path`` is that schema). A schema or database name cannot be bound
to a placeholder: those few statements name it as ``{schema}`` or
``{database}`` in ``queries.sql``, and only ``quote_ident`` fills it in.
Which migrations run, in what order and under which lock is ``migrate.py``'s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import structlog
from asyncpg.transaction import Transaction

from coldbrew.errors import DatabaseUnavailable
from coldbrew.settings import mask_url
from coldbrew.sql import QUERIES
from coldbrew.store.base import CONNECTION_ERRORS

log = structlog.get_logger("coldbrew.migrate")


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SchemaStore:
    """One direct connection: one method per statement a migration run sends."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    @classmethod
    @asynccontextmanager
    async def migrating(cls, dsn: str) -> AsyncIterator[SchemaStore]:
        """A connection to ``dsn`` (its database created when missing), closed on exit;
        connection trouble meanwhile becomes ``DatabaseUnavailable``."""
        conn = await connect_creating_database(dsn)
        try:
            yield cls(conn)
        except CONNECTION_ERRORS as exc:
            raise DatabaseUnavailable(f"PostgreSQL at {mask_url(dsn)}: {exc}") from exc
        finally:
            await conn.close()

    def transaction(self) -> Transaction:
        return self._conn.transaction()

    async def _execute(self, name: str, *args: Any, **identifiers: str) -> str:
        """Run a named statement; ``identifiers`` fill its ``{name}`` slots, quoted."""
        query = QUERIES[name].text
        if identifiers:
            query = query.format(**{key: quote_ident(value) for key, value in identifiers.items()})
        status: str = await self._conn.execute(query, *args)
        return status

    async def _fetchval(self, name: str, *args: Any) -> Any:
        return await self._conn.fetchval(QUERIES[name].text, *args)

    async def create_database(self, database: str) -> None:
        await self._execute("create_database", database=database)

    async def lock_migrations(self, namespace: str) -> None:
        """Wait for any other migration of ``namespace``; held until the transaction ends."""
        await self._execute("lock_migrations", namespace)

    async def create_schema(self, namespace: str) -> None:
        await self._execute("create_schema", schema=namespace)

    async def use_schema(self, namespace: str) -> None:
        """Search ``namespace``'s schema for the rest of the transaction."""
        await self._execute("use_schema", quote_ident(namespace))

    async def create_migrations_table(self) -> None:
        await self._execute("create_migrations_table")

    async def migration_applied(self, version: int) -> bool:
        return bool(await self._fetchval("migration_applied", version))

    async def apply_migration(self, sql: str) -> None:
        """Run one migration file (``sql/migrations/NNNN_*.sql``) as it is."""
        await self._conn.execute(sql)

    async def record_migration(self, version: int, name: str) -> None:
        await self._execute("record_migration", version, name)

    async def drop_schema(self, namespace: str) -> None:
        await self._execute("drop_schema", schema=namespace)


async def connect_creating_database(dsn: str) -> asyncpg.Connection:
    """Connect to ``dsn``; if its database is missing, create it through ``postgres``."""
    try:
        return await asyncpg.connect(dsn, timeout=10)
    except asyncpg.InvalidCatalogNameError:
        pass
    except CONNECTION_ERRORS as exc:
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {mask_url(dsn)}: {exc}"
        ) from exc
    parts = urlsplit(dsn)
    database = parts.path.lstrip("/")
    admin_dsn = urlunsplit(parts._replace(path="/postgres"))
    admin = await asyncpg.connect(admin_dsn, timeout=10)
    try:
        await SchemaStore(admin).create_database(database)
        log.info("database_created", database=database)
    except asyncpg.DuplicateDatabaseError:
        pass
    finally:
        await admin.close()
    return await asyncpg.connect(dsn, timeout=10)


async def drop_namespace(dsn: str, namespace: str) -> None:
    """Drop the namespace's schema and everything in it (tests and `coldbrew demo --clean`)."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await SchemaStore(conn).drop_schema(namespace)
    finally:
        await conn.close()
