"""Bounded history: the prune service deletes finished rows past their retention while a
drain runs, never an unfinished or due row; the dead/failed tallies stay exact; failures
of the service are logged and retried."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from coldbrew.client import Client
from coldbrew.metrics import Metrics
from coldbrew.migrate import quote_ident
from coldbrew.settings import Settings
from coldbrew.stats import StatsSnapshot
from coldbrew.store import JobStore
from coldbrew.worker.prune import Pruner, PruneService, Retention
from tests.helpers import DATABASE_URL, metric, wait_until

pytestmark = pytest.mark.asyncio

FINAL = ("succeeded", "failed", "dead", "cancelled")
OLD_PER_STATUS = 120

# Old rows of every status that must survive any prune: unfinished ones (some with an
# old finished_at, as a replayed job could carry), and finished ones with a publish mark.
SURVIVORS = """
INSERT INTO jobs (id, type, queue, tenant, status, max_attempts, attempt, created_at,
                  started_at, finished_at, run_at, publish_after, lease_expires_at, worker_id)
VALUES
 ('keep-queued', 'noop', 'default', 'default', 'queued', 3, 0, now() - interval '30 days',
  NULL, NULL, now() - interval '30 days', NULL, NULL, NULL),
 ('keep-queued-finished-at', 'noop', 'default', 'default', 'queued', 3, 1,
  now() - interval '30 days', now() - interval '30 days', now() - interval '20 days',
  now() - interval '30 days', NULL, NULL, NULL),
 ('keep-retrying', 'noop', 'default', 'default', 'retrying', 3, 1, now() - interval '30 days',
  now() - interval '30 days', now() - interval '20 days', now() + interval '1 hour',
  now() + interval '1 hour', NULL, NULL),
 ('keep-scheduled', 'noop', 'default', 'default', 'scheduled', 3, 0,
  now() - interval '30 days', NULL, NULL, now() + interval '1 hour', now() + interval '1 hour',
  NULL, NULL),
 ('keep-running', 'noop', 'default', 'default', 'running', 3, 1, now() - interval '30 days',
  now() - interval '30 days', NULL, now() - interval '30 days', NULL,
  now() + interval '1 hour', 'elsewhere'),
 ('keep-dead-due', 'noop', 'default', 'default', 'dead', 3, 3, now() - interval '30 days',
  now() - interval '30 days', now() - interval '20 days', now() - interval '30 days',
  now() + interval '1 hour', NULL, NULL),
 ('keep-succeeded-due', 'noop', 'default', 'default', 'succeeded', 3, 1,
  now() - interval '30 days', now() - interval '30 days', now() - interval '20 days',
  now() - interval '30 days', now() + interval '1 hour', NULL, NULL)
"""

# $1 rows per final status, finished $2 seconds ago
FINISHED = """
INSERT INTO jobs (id, type, queue, tenant, status, max_attempts, attempt, created_at,
                  started_at, finished_at, run_at)
SELECT st || '-' || $3 || '-' || s, 'noop', 'default', 'acme', st::job_status, 3, 1,
       now() - make_interval(secs => $2 + 60), now() - make_interval(secs => $2 + 30),
       now() - make_interval(secs => $2), now() - make_interval(secs => $2 + 60)
FROM unnest(ARRAY['succeeded', 'failed', 'dead', 'cancelled']) AS st,
     generate_series(1, $1) AS s
"""

GUARDS = """
INSERT INTO job_once (job_id, name, attempt)
SELECT 'succeeded-old-' || s, 'email', 1 FROM generate_series(1, 10) AS s;
INSERT INTO job_unique (key, job_id)
SELECT 'k' || s, 'dead-old-' || s FROM generate_series(1, 5) AS s;
INSERT INTO job_aliases (id, job_id)
SELECT 'a' || s, 'failed-old-' || s FROM generate_series(1, 7) AS s;
INSERT INTO job_once (job_id, name, attempt) VALUES ('keep-running', 'email', 1);
"""


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(DATABASE_URL)
    await conn.execute(f"SET search_path = {quote_ident(settings.namespace)}")
    yield conn
    await conn.close()


async def seed_history(db: asyncpg.Connection) -> None:
    await db.execute(SURVIVORS)
    await db.execute(FINISHED, OLD_PER_STATUS, 2 * 86400.0, "old")
    await db.execute(FINISHED, 5, 60.0, "new")
    await db.execute(GUARDS)


async def count(db: asyncpg.Connection, where: str = "true") -> int:
    return int(await db.fetchval(f"SELECT count(*) FROM jobs WHERE {where}"))


async def true_dead_failed(db: asyncpg.Connection) -> dict[tuple[str, str], tuple[int, int]]:
    rows = await db.fetch(
        "SELECT queue, tenant, count(*) FILTER (WHERE status = 'dead') AS dead,"
        " count(*) FILTER (WHERE status = 'failed') AS failed FROM jobs"
        " WHERE status IN ('dead', 'failed') GROUP BY queue, tenant"
    )
    return {(r["queue"], r["tenant"]): (r["dead"], r["failed"]) for r in rows}


async def stats_dead_failed(store: JobStore) -> dict[tuple[str, str], tuple[int, int]]:
    rows = await store.stats.queue_stats()
    return {(r.queue, r.tenant): (r.dead, r.failed) for r in rows if r.dead or r.failed}


async def test_retention_deletes_during_a_drain_and_keeps_every_unfinished_row(
    db: asyncpg.Connection, start_worker: Any, client: Client
) -> None:
    """Given old rows of every status, when a worker with 1 h retention drains 150 jobs,
    then every finished row past 1 h goes (with its guards, keys and aliases), and every
    unfinished or due row, and every recent one, stays."""
    await seed_history(db)
    worker = await start_worker(
        retention_succeeded="1h",
        retention_failed="1h",
        retention_dead="1h",
        retention_cancelled="1h",
        prune_interval_seconds=0.2,
        prune_batch=25,
    )
    jobs = [await client.submit("noop", {}) for _ in range(150)]

    async def pruned() -> bool:
        return await count(db, "id LIKE '%-old-%'") == 0

    await wait_until(pruned, timeout=30)
    for job in jobs:
        await client.wait(job.id, timeout=30)
    assert await count(db, "id LIKE 'keep-%'") == 7
    assert await count(db, "id LIKE '%-new-%'") == 20
    assert (
        await count(db, "status = 'succeeded' AND id NOT LIKE '%-new-%' AND id NOT LIKE 'keep-%'")
        == 150
    )
    assert await db.fetchval("SELECT count(*) FROM job_once") == 1  # keep-running's
    assert await db.fetchval("SELECT count(*) FROM job_unique") == 0
    assert await db.fetchval("SELECT count(*) FROM job_aliases") == 0
    for status in FINAL:
        assert (
            metric(worker, "coldbrew_pruned_rows_total", table="jobs", status=status)
            == OLD_PER_STATUS
        )
    assert metric(worker, "coldbrew_pruned_rows_total", table="job_once", status="succeeded") == 10
    assert metric(worker, "coldbrew_pruned_rows_total", table="job_unique", status="dead") == 5
    assert metric(worker, "coldbrew_pruned_rows_total", table="job_aliases", status="failed") == 7
    assert metric(worker, "coldbrew_prune_last_success_timestamp_seconds") > 0
    assert await stats_dead_failed(worker.parts.store) == await true_dead_failed(db)


async def test_dry_run_counts_equal_what_a_prune_deletes(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """The dry run's counts, by table and status, are exactly a prune's, then zero."""
    await seed_history(db)
    await db.execute(
        "INSERT INTO rejected_messages (reason, detail, routing_key, body, received_at)"
        " SELECT 'not_json', 'x', 'default.acme', '\\x00', now() - interval '40 days'"
        " FROM generate_series(1, 30)"
    )
    await db.execute(
        "INSERT INTO rate_buckets (key, tat) SELECT 'b' || s, now() - interval '2 hours'"
        " FROM generate_series(1, 12) AS s"
    )
    retention = Retention(jobs={"succeeded": 3600.0, "dead": 3600.0}, rejected=30 * 86400.0)
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        dry = await store.history.count_prunable(
            retention.jobs, retention.rejected, retention.idle_buckets
        )
        result = await Pruner(store, retention, batch=7).run_pass()
        again = await store.history.count_prunable(
            retention.jobs, retention.rejected, retention.idle_buckets
        )
    assert result.complete
    assert {k: v for k, v in dry.items() if v} == result.counts
    assert result.counts == {
        ("jobs", "succeeded"): OLD_PER_STATUS,
        ("jobs", "dead"): OLD_PER_STATUS,
        ("job_once", "succeeded"): 10,
        ("job_unique", "dead"): 5,
        ("rejected_messages", "any"): 30,
        ("rate_buckets", "any"): 12,
    }
    assert not any(again.values())
    assert await count(db, "status = 'failed'") == OLD_PER_STATUS + 5  # failed: retention off


async def test_tallies_follow_every_transition(settings: Settings, db: asyncpg.Connection) -> None:
    """queue_stats' dead and failed counts equal the rows' through inserts, updates, replays,
    deletes and compaction."""
    await db.execute(FINISHED, 20, 60.0, "t")
    await db.execute("UPDATE jobs SET status = 'failed' WHERE id LIKE 'dead-t-1%'")
    await db.execute(
        "UPDATE jobs SET status = 'queued', finished_at = NULL WHERE id LIKE 'failed-t-2%'"
    )
    await db.execute("UPDATE jobs SET tenant = tenant, status = status WHERE status = 'dead'")
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        assert await stats_dead_failed(store) == await true_dead_failed(db)
        await store.history.compact_tallies()
        assert await db.fetchval("SELECT count(*) FROM job_tallies") == 2
        await db.execute("DELETE FROM jobs WHERE id LIKE 'failed-t-1%'")
        assert await stats_dead_failed(store) == await true_dead_failed(db)
        replayed = await store.dead.dlq_replay(None, None, 1000, 3)
        assert len(replayed) == await count(db, "id LIKE 'dead-t-%' AND status = 'queued'") > 0
        await store.history.compact_tallies()
        assert await stats_dead_failed(store) == await true_dead_failed(db)
        waiting = {(r.queue, r.tenant): r.queued for r in await store.stats.queue_stats()}
        assert waiting == {("default", "acme"): await count(db, "status = 'queued'")}


async def test_a_failing_prune_is_logged_counted_and_retried(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """A PostgreSQL error in a pass is logged as prune_failed and counted, never fatal, and
    the next pass after it is fixed succeeds."""
    await db.execute(FINISHED, 3, 2 * 86400.0, "old")
    await db.execute("ALTER FUNCTION job_prunable(jobs) RENAME TO job_prunable_away")
    metrics = Metrics(CollectorRegistry())
    stop = asyncio.Event()
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        service = PruneService(
            store,
            metrics,
            Retention(jobs={"succeeded": 60.0}, rejected=None),
            interval=0.1,
            batch=10,
        )
        with capture_logs() as logs:
            task = asyncio.create_task(service.run(stop))

            async def failed() -> bool:
                return any(e["event"] == "prune_failed" for e in logs)

            await wait_until(failed, timeout=10)
            assert not task.done()
            await db.execute("ALTER FUNCTION job_prunable_away(jobs) RENAME TO job_prunable")

            async def recovered() -> bool:
                return await count(db, "status = 'succeeded'") == 0

            await wait_until(recovered, timeout=15)
            stop.set()
            await asyncio.wait_for(task, timeout=5)
    failure = next(e for e in logs if e["event"] == "prune_failed")
    assert "job_prunable" in failure["error"] and failure["retry_in"] > 0
    assert metrics.registry.get_sample_value("coldbrew_prune_failures_total") >= 1
    assert metrics.registry.get_sample_value("coldbrew_prune_last_success_timestamp_seconds") > 0


async def test_the_fleet_gauges_are_computed_once_per_interval(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """Two workers' snapshots: the first refresh computes and stores the counts, the other
    worker's refresh within the interval reads them (the stored time does not move), and
    a refresh after the interval counts again and sees new rows."""
    await db.execute(SURVIVORS)
    taken = "SELECT taken_at FROM fleet_stats_taken"
    async with (
        JobStore.open(settings.database_url, settings.namespace, pool_size=2) as one,
        JobStore.open(settings.database_url, settings.namespace, pool_size=2) as two,
    ):
        first = StatsSnapshot(one, max_tenants=10, max_age=1.0)
        second = StatsSnapshot(two, max_tenants=10, max_age=1.0)
        await first.refresh()
        stored = await db.fetchval(taken)
        await db.execute(FINISHED, 2, 60.0, "later")  # dead and failed: counted next time
        await second.refresh()
        assert await db.fetchval(taken) == stored
        # the same counts; a waiting job's age read from the store is as of now
        assert [replace(r, oldest_waiting_seconds=0) for r in second.rows] == [
            replace(r, oldest_waiting_seconds=0) for r in first.rows
        ]
        assert second.rows[0].oldest_waiting_seconds >= first.rows[0].oldest_waiting_seconds
        assert [(r.queued, r.running, r.retrying, r.scheduled, r.dead) for r in first.rows] == [
            (2, 1, 1, 1, 1)
        ]
        await asyncio.sleep(1.1)
        await second.refresh()
        assert await db.fetchval(taken) > stored
        assert {(r.tenant, r.dead, r.failed) for r in second.rows} == {
            ("default", 1, 0),
            ("acme", 2, 2),
        }


async def test_members_of_an_open_batch_are_kept_until_it_is_done(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """A group's callback reads its members' results when the last one ends: an old
    finished member of an open batch survives a prune; once the batch is done it goes."""
    await db.execute(
        "INSERT INTO batches (id, tenant, total, pending) VALUES ('open', 'acme', 2, 1),"
        " ('done', 'acme', 1, 0)"
    )
    await db.execute(
        """
        INSERT INTO jobs (id, type, queue, tenant, status, max_attempts, attempt, created_at,
                          started_at, finished_at, run_at, batch_id)
        VALUES ('open.0', 'noop', 'default', 'acme', 'succeeded', 3, 1, now() - interval '3 days',
                now() - interval '3 days', now() - interval '2 days', now() - interval '3 days',
                'open'),
               ('done.0', 'noop', 'default', 'acme', 'succeeded', 3, 1, now() - interval '3 days',
                now() - interval '3 days', now() - interval '2 days', now() - interval '3 days',
                'done')
        """
    )
    retention = Retention(jobs={"succeeded": 3600.0}, rejected=30 * 86400.0)
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        dry = await store.history.count_prunable(
            retention.jobs, retention.rejected, retention.idle_buckets
        )
        result = await Pruner(store, retention, batch=10).run_pass()
    assert dry[("jobs", "succeeded")] == 1
    assert result.counts[("jobs", "succeeded")] == 1
    assert [r["id"] for r in await db.fetch("SELECT id FROM jobs ORDER BY id")] == ["open.0"]


async def test_expired_sessions_and_old_audit_entries_are_pruned(
    settings: Settings, db: asyncpg.Connection
) -> None:
    """Given sessions expired two days ago, one an hour ago and a live one, and audit entries
    100 and 10 days old, a pass with a 90-day audit retention deletes exactly the sessions
    expired over a day ago and the 100-day-old entries, and its dry run said so first."""
    await db.execute(
        "INSERT INTO dashboard_sessions (token_hash, actor, expires_at)"
        " SELECT sha256(('old' || s)::bytea), 'a', now() - interval '2 days'"
        " FROM generate_series(1, 9) AS s;"
        "INSERT INTO dashboard_sessions (token_hash, actor, expires_at) VALUES"
        " (sha256('recent'::bytea), 'a', now() - interval '1 hour'),"
        " (sha256('live'::bytea), 'a', now() + interval '1 hour');"
        "INSERT INTO audit_log (at, actor, action, target, outcome)"
        " SELECT now() - interval '100 days', 'a', 'pause', 'tenant t', 'paused'"
        " FROM generate_series(1, 11);"
        "INSERT INTO audit_log (at, actor, action, target, outcome)"
        " SELECT now() - interval '10 days', 'a', 'pause', 'tenant t', 'paused'"
        " FROM generate_series(1, 4)"
    )
    retention = Retention(jobs={}, rejected=None, audit=90 * 86400.0)
    async with JobStore.open(settings.database_url, settings.namespace, pool_size=2) as store:
        dry = await store.history.count_prunable({}, None, retention.idle_buckets, retention.audit)
        result = await Pruner(store, retention, batch=4).run_pass()
    assert result.complete
    assert result.counts == {("dashboard_sessions", "any"): 9, ("audit_log", "any"): 11}
    assert {k: v for k, v in dry.items() if v} == result.counts
    assert await db.fetchval("SELECT count(*) FROM dashboard_sessions") == 2
    assert await db.fetchval("SELECT count(*) FROM audit_log") == 4
    assert Retention.of(Settings(namespace="x", retention_audit="off")).audit is None  # type: ignore[call-arg]
