"""The webhook trigger writes to its own namespace whatever the session's search_path.

Migration 0023 took ``SET search_path FROM CURRENT`` off the trigger's function (two
thirds of its cost per outcome, bench/pg_cost.py) and qualifies its tables with the
namespace's schema instead; these tests hold it to what the SET guaranteed.
"""

from __future__ import annotations

import asyncpg

from coldbrew.migrate import quote_ident
from coldbrew.settings import Settings

SEED = """
INSERT INTO {ns}.tenants (name, webhook_url) VALUES ('hooked', 'https://h.example/x');
INSERT INTO {ns}.jobs (id, type, queue, tenant, max_attempts, status, attempt)
VALUES ('path-1', 'noop', 'default', 'hooked', 3, 'running', 1),
       ('path-2', 'noop', 'default', 'other', 3, 'running', 1);
"""


async def test_outcome_from_another_search_path_enqueues_in_the_namespace(
    settings: Settings,
) -> None:
    ns = quote_ident(settings.namespace)
    conn = await asyncpg.connect(settings.database_url, server_settings={"search_path": "public"})
    try:
        await conn.execute(SEED.format(ns=ns))
        await conn.execute(
            f"UPDATE {ns}.jobs SET status = 'succeeded', finished_at = now()"
            " WHERE id IN ('path-1', 'path-2')"
        )
        rows = await conn.fetch(
            f"SELECT tenant, args->>'url' AS url, args->'job'->>'id' AS job"
            f" FROM {ns}.jobs WHERE type = 'coldbrew.webhook'"
        )
        assert [tuple(r) for r in rows] == [("hooked", "https://h.example/x", "path-1")]
        assert await conn.fetchval("SELECT current_setting('search_path')") == "public"
    finally:
        await conn.close()


async def test_the_trigger_function_sets_no_search_path(settings: Settings) -> None:
    """Each call of a function with a SET clause saves and restores the setting."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        config = await conn.fetchval(
            "SELECT p.proconfig FROM pg_proc AS p JOIN pg_namespace AS n"
            " ON n.oid = p.pronamespace WHERE n.nspname = $1"
            " AND p.proname = 'coldbrew_enqueue_webhook'",
            settings.namespace,
        )
        assert config is None
    finally:
        await conn.close()
