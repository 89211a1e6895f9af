"""The dashboard's job search and charts on a large job table: plans and timings.

    .venv/bin/python bench/dashboard_search.py [--rows 1000000] [--repeat 7]

Fills a namespace of its own with ``--rows`` jobs in one ``INSERT ... SELECT
generate_series`` (10 tenants, 5 types, 30 days of history, 94% succeeded, the
rest failed, dead, queued, running), ANALYZEs, then for each search the dashboard
makes (first page, a page deep in the history through its keyset cursor, one
tenant's, one status's, a type, an error text, a time range) and the two chart
reads prints the plan's top node and index, and the median and spread of
``--repeat`` executions of the statements the store runs (through asyncpg, as the
API does). The namespace is dropped at the end. The machine is shared: read
medians, and the spread beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from coldbrew.migrate import migrate, quote_ident
from coldbrew.sql import QUERIES
from coldbrew.store.base import connection_settings
from coldbrew.store.dashboard import RECENT_ROWS, like_escape

DATABASE_URL = "postgresql://127.0.0.1:5432/coldbrew_bench"

FILL = """
INSERT INTO jobs (id, type, queue, tenant, status, attempt, max_attempts, error_kind,
                  error_message, dead_reason, created_at, started_at, finished_at, run_at)
SELECT 'job-' || g,
       'type_' || (g % 5),
       CASE WHEN g % 3 = 0 THEN 'slow' ELSE 'default' END,
       'tenant_' || (g % 10),
       s.status::job_status,
       1, 5,
       CASE WHEN s.status IN ('failed', 'dead') THEN 'ValueError' END,
       CASE WHEN s.status IN ('failed', 'dead') THEN 'upstream said ' || (g % 97) END,
       CASE WHEN s.status = 'dead' THEN 'max_attempts' END,
       t.created,
       CASE WHEN s.status <> 'queued' THEN t.created + interval '1 second' END,
       CASE WHEN s.status IN ('succeeded', 'failed', 'dead')
            THEN t.created + interval '2 seconds' END,
       t.created
FROM generate_series(1, $1) AS g,
     LATERAL (SELECT now() - (($1 - g) * interval '30 days' / $1) AS created) AS t,
     LATERAL (SELECT CASE
         WHEN g % 100 < 94 THEN 'succeeded'
         WHEN g % 100 < 97 THEN 'failed'
         WHEN g % 100 < 98 THEN 'dead'
         WHEN g % 100 < 99 THEN 'queued'
         ELSE 'running' END AS status) AS s
"""


def err(tenant: str | None, text: str, status: str | None = None) -> list[Any]:
    """A search's arguments filtering on an error text (and a tenant, a status), page one."""
    return [tenant, status, None, None, None, text, None, "", 51]


def cases(rows: int) -> list[tuple[str, str, list[Any]]]:
    """(label, query name, arguments) of each read measured."""
    now = datetime.now(UTC)
    deep = (now - timedelta(days=15), f"job-{rows // 2}")  # a cursor half-way down the history
    day = (now - timedelta(days=10), now - timedelta(days=9))
    base = [None, None, None, None, None, None, None, "", 51]
    return [
        ("first page, every job", "search_jobs_all", base),
        ("page half-way down (keyset)", "search_jobs_all", [*base[:6], *deep, 51]),
        ("one tenant, first page", "search_jobs_tenant", ["tenant_3", *base[1:]]),
        ("one tenant, half-way down", "search_jobs_tenant", ["tenant_3", *base[1:6], *deep, 51]),
        ("status dead", "search_jobs_status", [None, "dead", *base[2:]]),
        ("status dead, one tenant", "search_jobs_status", ["tenant_7", "dead", *base[2:]]),
        ("status dead, tenant with none", "search_jobs_status", ["tenant_3", "dead", *base[2:]]),
        ("tenant + type", "search_jobs_tenant", ["tenant_3", None, "type_3", *base[3:]]),
        ("tenant + type, no match", "search_jobs_tenant", ["tenant_3", None, "type_2", *base[3:]]),
        (
            "tenant + error text, no match",
            "search_jobs_tenant",
            ["tenant_3", None, None, None, None, "said 42", None, "", 51],
        ),
        (
            "tenant + error text, rare",
            "search_jobs_tenant",
            ["tenant_7", None, None, None, None, "said 42", None, "", 51],
        ),
        (
            "status failed + error text",
            "search_jobs_status",
            [None, "failed", None, None, None, "said 4", None, "", 51],
        ),
        ("tenant + one day", "search_jobs_tenant", ["tenant_3", None, None, *day, *base[5:]]),
        # the same error-text reads through the trigram index (migration 0016), and more
        ("trgm: tenant + error text, no match", "search_jobs_error", [*err("tenant_3", "said 42")]),
        ("trgm: tenant + error text, rare", "search_jobs_error", [*err("tenant_7", "said 42")]),
        ("trgm: status failed + error text", "search_jobs_error", [*err(None, "said 4", "failed")]),
        ("walk: every job, rare error text", "search_jobs_all", [*err(None, "said 42")]),
        ("trgm: every job, rare error text", "search_jobs_error", [*err(None, "said 42")]),
        ("walk: every job, text in no row", "search_jobs_all", [*err(None, "timeout")]),
        ("trgm: every job, text in no row", "search_jobs_error", [*err(None, "timeout")]),
        ("walk: every job, common text (4%)", "search_jobs_all", [*err(None, "upstream")]),
        ("trgm: every job, common text (4%)", "search_jobs_error", [*err(None, "upstream")]),
        ("chart: throughput, last hour", "chart_throughput", [now - timedelta(hours=1), None]),
        ("chart: backlog, last hour", "chart_backlog_edges", [now - timedelta(hours=1), None]),
    ]


async def timed(
    conn: asyncpg.Connection, query: str, args: list[Any], repeat: int, *, custom: bool
) -> list[float]:
    """Milliseconds of each run; ``custom``: as the store runs the error-text search (the
    newest rows of the scope, then the trigram index unless they filled the page, in a
    transaction planned for its own parameters), the round trips counted."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        if custom:  # DashboardStore._search_error's two steps
            async with conn.transaction():
                await conn.execute(QUERIES["custom_plans"].text)
                recent = QUERIES["search_jobs_error_recent"].text
                if len(await conn.fetch(recent, *args, RECENT_ROWS)) < args[-1]:
                    await conn.fetch(query, *args)
        else:
            await conn.fetch(query, *args)
        times.append((time.perf_counter() - started) * 1000)
    return times


async def plan(conn: asyncpg.Connection, query: str, args: list[Any]) -> str:
    """The EXPLAIN ANALYZE lines of ``query`` (asyncpg binds the arguments)."""
    rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {query}", *args)
    return "\n".join("    " + row[0] for row in rows)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--plans", action="store_true", help="print each full plan")
    args = parser.parse_args()
    namespace = f"dashbench_{int(time.time())}"
    from coldbrew.migrate import connect_creating_database

    (await connect_creating_database(DATABASE_URL)).terminate()
    await migrate(DATABASE_URL, namespace)
    conn = await asyncpg.connect(DATABASE_URL, server_settings=connection_settings(namespace))
    try:
        started = time.perf_counter()
        await conn.execute(FILL, args.rows)
        await conn.execute("ANALYZE jobs")
        print(
            f"filled {args.rows:,} jobs in {time.perf_counter() - started:.1f} s "
            "(machine shared with other work: timings are noisy)"
        )
        print(f"{'read':<32} {'median ms':>10} {'min..max ms':>16}  plan")
        for label, name, values in cases(args.rows):
            query = QUERIES[name].text
            custom = name == "search_jobs_error"
            if custom:  # the store's escaping (the bench's texts have no % or _)
                values = [*values[:5], like_escape(values[5]), *values[6:]]
            times = await timed(conn, query, values, args.repeat, custom=custom)
            explained = await plan(conn, query, values)
            nodes = [line.strip() for line in explained.splitlines() if "Index" in line]
            top = nodes[0] if nodes else explained.splitlines()[0].strip()
            print(
                f"{label:<32} {statistics.median(times):>10.2f} "
                f"{min(times):>7.2f}..{max(times):<8.2f} {top[:90]}"
            )
            if args.plans:
                print(explained)
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(namespace)} CASCADE")
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
