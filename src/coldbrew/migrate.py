"""``coldbrew migrate``: create or upgrade the schema of one namespace.

Migrations run in order inside one transaction each, under a transaction-level
advisory lock, so several containers may run ``migrate`` at once. The database
itself is created when it is missing and the role may create it. The
statements are the store's (store/schema.py); this module decides their order.
"""

from __future__ import annotations

import structlog

from coldbrew.sql import migrations
from coldbrew.store.schema import (
    SchemaStore,
    connect_creating_database,
    drop_namespace,
    quote_ident,
)

__all__ = ["connect_creating_database", "drop_namespace", "migrate", "quote_ident"]

log = structlog.get_logger("coldbrew.migrate")


async def migrate(dsn: str, namespace: str) -> list[int]:
    """Apply every migration the namespace lacks; return the versions applied."""
    applied: list[int] = []
    async with SchemaStore.migrating(dsn) as schema:
        for version, name, sql in migrations():
            async with schema.transaction():
                await schema.lock_migrations(namespace)
                await schema.create_schema(namespace)
                await schema.use_schema(namespace)
                await schema.create_migrations_table()
                if await schema.migration_applied(version):
                    continue
                await schema.apply_migration(sql)
                await schema.record_migration(version, name)
                applied.append(version)
                log.info("migration_applied", namespace=namespace, version=version, name=name)
    return applied
