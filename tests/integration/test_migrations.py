"""The migrations build exactly ``sql/schema.sql``, once, under a lock, creating the database."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from coldbrew.migrate import connect_creating_database, migrate, quote_ident
from coldbrew.sql import LATEST_VERSION, migrations, read_sql
from tests.helpers import DATABASE_URL, new_namespace

EXCLUDED = "schema_migrations"  # exists only where the migrations ran

COLUMNS = """
SELECT c.relname AS table_name, a.attname AS column_name,
       format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null,
       pg_get_expr(d.adbin, d.adrelid) AS default_expr
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm') AND a.attnum > 0
  AND NOT a.attisdropped AND c.relname <> $2
"""
CONSTRAINTS = """
SELECT c.relname AS table_name, k.contype::text AS type, pg_get_constraintdef(k.oid) AS definition
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = k.connamespace
WHERE n.nspname = $1 AND c.relname <> $2
"""
INDEXES = """
SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename <> $2
"""
ENUMS = """
SELECT t.typname, array_agg(e.enumlabel::text ORDER BY e.enumsortorder) AS labels
FROM pg_type t
JOIN pg_enum e ON e.enumtypid = t.oid
JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE n.nspname = $1
GROUP BY t.typname
"""
RELATIONS = """
SELECT c.relname, c.relkind::text AS kind
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname NOT LIKE $2 || '%'
"""

VERSIONS = [version for version, _, _ in migrations()]
"""Every migration's number, in order (a branch may skip numbers not yet merged)."""


@pytest.fixture
async def conn() -> AsyncIterator[asyncpg.Connection]:
    first = await connect_creating_database(DATABASE_URL)
    try:
        yield first
    finally:
        await first.close()


@pytest.fixture
async def schemas(conn: asyncpg.Connection) -> AsyncIterator[list[str]]:
    """Fresh namespace names; every one is dropped at teardown."""
    names: list[str] = []
    yield names
    for name in names:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(name)} CASCADE")


def fresh(schemas: list[str]) -> str:
    name = new_namespace()
    schemas.append(name)
    return name


async def catalog(conn: asyncpg.Connection, namespace: str) -> dict[str, Any]:
    """Everything that makes up the namespace's schema, with the namespace's name taken out."""

    def neutral(value: Any) -> Any:
        if isinstance(value, str):
            quoted = value.replace(f"{quote_ident(namespace)}.", "NS.")
            return quoted.replace(f"{namespace}.", "NS.")
        if isinstance(value, list):
            return [neutral(item) for item in value]
        return value

    async def rows(query: str, *args: Any) -> list[tuple[Any, ...]]:
        found = await conn.fetch(query, namespace, *args)
        return sorted(tuple(neutral(v) for v in row.values()) for row in found)

    return {
        "columns": await rows(COLUMNS, EXCLUDED),
        "constraints": await rows(CONSTRAINTS, EXCLUDED),
        "indexes": await rows(INDEXES, EXCLUDED),
        "enums": await rows(ENUMS),
        "relations": await rows(RELATIONS, EXCLUDED),
    }


async def test_migrations_build_schema_sql(conn: asyncpg.Connection, schemas: list[str]) -> None:
    """Applying every migration yields the same catalog as executing sql/schema.sql."""
    migrated, declared = fresh(schemas), fresh(schemas)
    assert await migrate(DATABASE_URL, migrated) == VERSIONS
    async with conn.transaction():
        await conn.execute(f"CREATE SCHEMA {quote_ident(declared)}")
        await conn.execute(f"SET LOCAL search_path TO {quote_ident(declared)}")
        await conn.execute(read_sql("schema.sql"))

    want, got = await catalog(conn, declared), await catalog(conn, migrated)
    assert want["columns"], "schema.sql created no tables in its namespace"
    assert {row[0] for row in want["columns"]} >= {"jobs", "job_once", "tenants"}
    for part in want:
        assert got[part] == want[part], f"{part} differ between migrations and schema.sql"
    assert await conn.fetchval(
        f"SELECT count(*) FROM {quote_ident(migrated)}.schema_migrations"
    ) == len(VERSIONS)


async def test_migrate_is_idempotent(conn: asyncpg.Connection, schemas: list[str]) -> None:
    """A second `migrate` on an up-to-date namespace applies nothing and changes nothing."""
    namespace = fresh(schemas)
    assert await migrate(DATABASE_URL, namespace) == VERSIONS
    before = await catalog(conn, namespace)
    assert await migrate(DATABASE_URL, namespace) == []
    assert await catalog(conn, namespace) == before
    assert await conn.fetchval(
        f"SELECT count(*) FROM {quote_ident(namespace)}.schema_migrations"
    ) == len(VERSIONS)


async def test_concurrent_migrate_applies_once(
    conn: asyncpg.Connection, schemas: list[str]
) -> None:
    """Two `migrate` calls at once on a fresh namespace both succeed and apply each version once."""
    namespace = fresh(schemas)
    first, second = await asyncio.gather(
        migrate(DATABASE_URL, namespace), migrate(DATABASE_URL, namespace)
    )
    assert sorted(first + second) == VERSIONS
    versions = await conn.fetch(
        f"SELECT version FROM {quote_ident(namespace)}.schema_migrations ORDER BY version"
    )
    assert [row["version"] for row in versions] == VERSIONS


async def test_migrate_creates_missing_database(conn: asyncpg.Connection) -> None:
    """`migrate` against a database that does not exist creates it, then the schema in it."""
    database = f"coldbrew_mig_{secrets.token_hex(4)}"
    dsn = urlunsplit(urlsplit(DATABASE_URL)._replace(path=f"/{database}"))
    exists = "SELECT count(*) FROM pg_database WHERE datname = $1"
    assert await conn.fetchval(exists, database) == 0
    try:
        assert await migrate(dsn, "created") == VERSIONS
        assert await conn.fetchval(exists, database) == 1
        inside = await asyncpg.connect(dsn)
        try:
            assert (
                await inside.fetchval("SELECT max(version) FROM created.schema_migrations")
                == LATEST_VERSION
            )
        finally:
            await inside.close()
    finally:
        await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(database)} WITH (FORCE)")


async def test_namespaces_share_pg_trgm_and_a_role_that_cannot_use_it_is_told_what_to_run() -> None:
    """Migration 0016's pg_trgm lives in coldbrew_extensions, not in a namespace: a second
    namespace migrates beside the first, and dropping the first keeps the second's index.
    A role that may not use the extension's schema gets one clear error naming what to run
    (the extension is trusted: such a role creates it, but cannot reference its opclass)."""
    suffix = secrets.token_hex(4)
    database, role = f"coldbrew_trgm_{suffix}", f"coldbrew_trgm_{suffix}"
    parts = urlsplit(DATABASE_URL)
    dsn = urlunsplit(parts._replace(path=f"/{database}"))
    as_role = urlunsplit(
        parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}", path=f"/{database}")
    )
    admin = await asyncpg.connect(DATABASE_URL)
    try:
        await admin.execute(f"CREATE DATABASE {quote_ident(database)}")
        await admin.execute(f"CREATE ROLE {quote_ident(role)} LOGIN")
        await admin.execute(
            f"GRANT CREATE ON DATABASE {quote_ident(database)} TO {quote_ident(role)}"
        )
        await migrate(dsn, "first")
        await migrate(dsn, "second")
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("DROP SCHEMA first CASCADE")
            where = await conn.fetchval(
                "SELECT extnamespace::regnamespace::text FROM pg_extension"
                " WHERE extname = 'pg_trgm'"
            )
            kept = await conn.fetchval(
                "SELECT count(*) FROM pg_indexes WHERE indexname = 'jobs_search_error'"
            )
            assert (where, kept) == ("coldbrew_extensions", 1)
            await conn.execute("DROP SCHEMA second CASCADE")
            await conn.execute("DROP EXTENSION pg_trgm")  # the schema stays, not the role's
        finally:
            await conn.close()
        with pytest.raises(Exception, match="needs the PostgreSQL extension pg_trgm") as caught:
            await migrate(as_role, "third")
        assert "permission denied" in str(caught.value)
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {quote_ident(database)} WITH (FORCE)")
        await admin.execute(f"DROP ROLE IF EXISTS {quote_ident(role)}")
        await admin.close()
