"""The group-commit statements probe ``jobs`` by key, whatever the table's statistics say.

A generic plan costed while the table looked empty hash-joins a sequential
scan of ``jobs``; on a table of thousands of rows each batch then reads all
of them (bench/throughput.py saw 4× the PostgreSQL CPU per job). The
dedicated batch connections rule that shape out (``KEYED_BATCH_PLANS``).
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from coldbrew.settings import Settings
from coldbrew.sql import QUERIES
from coldbrew.store import KEYED_BATCH_PLANS, connection_settings

BATCH = 20


def claim_args(ids: list[str]) -> list[Any]:
    n = len(ids)
    return [ids, ["noop"] * n, ["default"] * n, ["default"] * n, ["{}"] * n, [0] * n,
            [3] * n, [None] * n, [None] * n, 300.0, "w1", [None] * n, [None] * n]  # fmt: skip


def complete_args(ids: list[str]) -> list[Any]:
    n = len(ids)
    return [ids, [1] * n, ["succeeded"] * n, [None] * n, [None] * n, [None] * n, [0.0] * n,
            [None] * n, [None] * n, [None] * n]  # fmt: skip


async def generic_plan(conn: asyncpg.Connection, name: str, args: list[Any]) -> str:
    rows = await conn.fetch(f"EXPLAIN (FORMAT JSON) {QUERIES[name].text}", *args)
    return json.dumps(json.loads(rows[0][0]))


async def plans(settings: Settings, extra: dict[str, str]) -> dict[str, str]:
    """Generic plans costed on an empty table, then used on a grown one (as a cached plan is)."""
    conn = await asyncpg.connect(
        settings.database_url,
        server_settings={
            **connection_settings(settings.namespace),
            **extra,
            "plan_cache_mode": "force_generic_plan",
        },
    )
    try:
        ids = [f"plan-{i}" for i in range(BATCH)]
        await conn.execute("ANALYZE jobs")  # statistics of the empty table
        found = {
            "claim_batch": await generic_plan(conn, "claim_batch", claim_args(ids)),
            "complete_batch": await generic_plan(conn, "complete_batch", complete_args(ids)),
        }
        await conn.execute(
            "INSERT INTO jobs (id, type, queue, tenant, max_attempts, status, attempt)"
            " SELECT 'old-' || g, 'noop', 'default', 'default', 3, 'succeeded', 1"
            " FROM generate_series(1, 5000) AS g"
        )
        await conn.fetch(QUERIES["claim_batch"].text, *claim_args(ids))  # the plan still works
        done = await conn.fetch(QUERIES["complete_batch"].text, *complete_args(ids))
        assert len(done) == BATCH
        return found
    finally:
        await conn.close()


async def test_batch_connections_probe_jobs_by_key(settings: Settings) -> None:
    found = await plans(settings, dict(KEYED_BATCH_PLANS))
    for name, plan in found.items():
        assert '"Seq Scan"' not in plan, f"{name} scans jobs: {plan}"
        assert "jobs_pkey" in plan, f"{name} does not probe the primary key: {plan}"


async def test_without_the_settings_the_plan_scans(settings: Settings) -> None:
    """The test above can fail: PostgreSQL's own choice on an empty table is the scan."""
    found = await plans(settings, {})
    assert any('"Seq Scan"' in plan for plan in found.values())


async def planned_per_statement(settings: Settings, extra: dict[str, str]) -> tuple[int, int]:
    """(generic, custom) plans of eight one-job claim batches on one connection, as the
    statement's prepared-statement counters tell (pg_prepared_statements, PostgreSQL 14+)."""
    conn = await asyncpg.connect(
        settings.database_url,
        server_settings={**connection_settings(settings.namespace), **extra},
    )
    try:
        for n in range(8):
            rows = await conn.fetch(QUERIES["claim_batch"].text, *claim_args([f"one-{n}"]))
            assert [r["claimed"] for r in rows] == [True]
        row = await conn.fetchrow(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
            QUERIES["claim_batch"].text,
        )
        assert row is not None
        return row["generic_plans"], row["custom_plans"]
    finally:
        await conn.close()


async def test_batch_connections_never_plan_per_statement(settings: Settings) -> None:
    """A batch of one job is the low-load case; planning it anew each time cost
    PostgreSQL about as much CPU as running it (bench/pg_cost.py, batches of 2)."""
    generic, custom = await planned_per_statement(settings, dict(KEYED_BATCH_PLANS))
    assert (generic, custom) == (8, 0)


async def test_without_forcing_small_batches_are_planned_each_time(settings: Settings) -> None:
    """The test above can fail: under plan_cache_mode auto, a one-job batch's custom plan
    looks cheaper than the generic one (costed for 10 rows), so it is kept re-planning."""
    keyed = {k: v for k, v in KEYED_BATCH_PLANS.items() if k != "plan_cache_mode"}
    generic, custom = await planned_per_statement(settings, {**keyed, "plan_cache_mode": "auto"})
    assert custom == 8 and generic == 0


def scans_of_jobs(plan: Any) -> list[dict[str, Any]]:
    """Every node of a JSON plan that scans the ``jobs`` table (not the update itself)."""
    reads = plan.get("Relation Name") == "jobs" and "Scan" in plan["Node Type"]
    found = [plan] if reads else []
    for child in plan.get("Plans", []):
        found += scans_of_jobs(child)
    return found


FENCE = "j.status::text = 'running'"


async def unanalyzed_plans(settings: Settings, complete_text: str) -> list[dict[str, Any]]:
    """The generic plan of ``complete_batch`` on a jobs table never analyzed (a new
    namespace's, until autoanalyze comes), with jobs in flight: what reads ``jobs``."""
    conn = await asyncpg.connect(
        settings.database_url,
        server_settings={**connection_settings(settings.namespace), **KEYED_BATCH_PLANS},
    )
    try:
        await conn.execute(
            "INSERT INTO jobs (id, type, queue, tenant, max_attempts, status, attempt)"
            " SELECT 'fl-' || g, 'noop', 'default', 'default', 3,"
            " CASE WHEN g % 10 = 0 THEN 'running' ELSE 'succeeded' END::job_status, 1"
            " FROM generate_series(1, 3000) AS g"
        )
        assert await conn.fetchval(
            "SELECT reltuples < 0 FROM pg_class WHERE oid = 'jobs'::regclass"
        ), "jobs was analyzed: the case is not the one meant"
        rows = await conn.fetch(
            f"EXPLAIN (FORMAT JSON) {complete_text}",
            *complete_args([f"fl-{n}" for n in range(1, 21)]),
        )
        return scans_of_jobs(json.loads(rows[0][0])[0]["Plan"])
    finally:
        await conn.close()


async def test_outcomes_probe_by_key_before_jobs_is_analyzed(settings: Settings) -> None:
    """With 300 jobs running, the walk of the running rows cost 157 µs of PostgreSQL CPU
    per outcome instead of 50 (bench/pg_cost.py --in-flight 300)."""
    text = QUERIES["complete_batch"].text
    assert FENCE in text
    nodes = await unanalyzed_plans(settings, text)
    assert nodes
    for node in nodes:
        assert node.get("Index Name") == "jobs_pkey", node
        assert "(id = u.id)" in node.get("Index Cond", ""), node


async def test_with_a_plain_status_fence_the_outcome_walks_running_rows(settings: Settings) -> None:
    """The test above can fail: the same statement fenced by a plain 'status = running'
    (as it was) plans a walk of a partial index of running rows, joined to every outcome."""
    text = QUERIES["complete_batch"].text.replace(FENCE, "j.status = 'running'")
    nodes = await unanalyzed_plans(settings, text)
    assert any("(id = u.id)" not in node.get("Index Cond", "") for node in nodes), nodes
