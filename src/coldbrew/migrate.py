"""``coldbrew migrate``: create or upgrade the schema of one namespace.

Migrations run in order inside one transaction each, under a transaction-level
advisory lock, so several containers may run ``migrate`` at once. The database
itself is created when it is missing and the role may create it.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import asyncpg
import structlog

from coldbrew.errors import DatabaseUnavailable
from coldbrew.settings import mask_url
from coldbrew.sql import migrations
from coldbrew.store import CONNECTION_ERRORS

log = structlog.get_logger("coldbrew.migrate")

_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtext('coldbrew.migrate.' || $1))"
_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)"""


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


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
        await admin.execute(f"CREATE DATABASE {quote_ident(database)}")
        log.info("database_created", database=database)
    except asyncpg.DuplicateDatabaseError:
        pass
    finally:
        await admin.close()
    return await asyncpg.connect(dsn, timeout=10)


async def migrate(dsn: str, namespace: str) -> list[int]:
    """Apply every migration the namespace lacks; return the versions applied."""
    conn = await connect_creating_database(dsn)
    applied: list[int] = []
    try:
        for version, name, sql in migrations():
            async with conn.transaction():
                await conn.execute(_LOCK_SQL, namespace)
                await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(namespace)}")
                await conn.execute(f"SET LOCAL search_path TO {quote_ident(namespace)}")
                await conn.execute(_TABLE_SQL)
                done = await conn.fetchval(
                    "SELECT 1 FROM schema_migrations WHERE version = $1", version
                )
                if done:
                    continue
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name
                )
                applied.append(version)
                log.info("migration_applied", namespace=namespace, version=version, name=name)
    except CONNECTION_ERRORS as exc:
        raise DatabaseUnavailable(f"PostgreSQL at {mask_url(dsn)}: {exc}") from exc
    finally:
        await conn.close()
    return applied


async def drop_namespace(dsn: str, namespace: str) -> None:
    """Drop the namespace's schema and everything in it (tests and `coldbrew demo --clean`)."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(namespace)} CASCADE")
    finally:
        await conn.close()
