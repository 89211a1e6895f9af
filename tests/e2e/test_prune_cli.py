"""`coldbrew prune` as a user runs it: the dry run's counts are what the prune then deletes."""

from __future__ import annotations

import json

import asyncpg
import pytest

from coldbrew.migrate import quote_ident
from coldbrew.settings import Settings
from tests.e2e.test_cli import cli_env, run_cli
from tests.helpers import DATABASE_URL

pytestmark = pytest.mark.asyncio

# 40 succeeded and 8 dead jobs finished 3 days ago, 5 succeeded an hour ago, one old
# queued job; 6 once-guards on old succeeded jobs
SEED = """
INSERT INTO jobs (id, type, queue, tenant, status, max_attempts, attempt, created_at,
                  finished_at)
SELECT st || '-' || s, 'noop', 'default', 'default', st::job_status, 3, 1,
       now() - interval '4 days', now() - interval '3 days'
FROM unnest(ARRAY['succeeded', 'dead']) AS st, generate_series(1, 40) AS s
WHERE st = 'succeeded' OR s <= 8;
INSERT INTO jobs (id, type, queue, tenant, status, max_attempts, attempt, finished_at)
SELECT 'recent-' || s, 'noop', 'default', 'default', 'succeeded', 3, 1,
       now() - interval '1 hour' FROM generate_series(1, 5) AS s;
INSERT INTO jobs (id, type, queue, tenant, status, max_attempts, created_at)
VALUES ('old-queued', 'noop', 'default', 'default', 'queued', 3, now() - interval '90 days');
INSERT INTO job_once (job_id, name, attempt)
SELECT 'succeeded-' || s, 'mail', 1 FROM generate_series(1, 6) AS s;
"""


async def test_dry_run_counts_what_prune_then_deletes(settings: Settings) -> None:
    """Given old rows, `prune --dry-run --json` lists per table and status exactly what
    `prune --json` then deletes, a second dry run finds nothing, and unfinished and
    recent rows stay."""
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        await conn.execute(f"SET search_path = {quote_ident(settings.namespace)}")
        await conn.execute(SEED)
        env = cli_env(settings, COLDBREW_RETENTION_SUCCEEDED="2d", COLDBREW_RETENTION_DEAD="2d")
        dry = await run_cli(env, "prune", "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        real = await run_cli(env, "prune", "--json")
        assert real.returncode == 0, real.stderr
        again = await run_cli(env, "prune", "--dry-run")
        remaining = await conn.fetchval("SELECT count(*) FROM jobs")
    finally:
        await conn.close()
    dry_out, real_out = json.loads(dry.stdout), json.loads(real.stdout)
    assert dry_out["dry_run"] and not real_out["dry_run"]
    assert (
        dry_out["rows"]
        == real_out["rows"]
        == [
            {"table": "job_once", "status": "succeeded", "rows": 6},
            {"table": "jobs", "status": "dead", "rows": 8},
            {"table": "jobs", "status": "succeeded", "rows": 40},
        ]
    )
    assert real_out["jobs"] == 48
    assert "would delete 0 rows" in again.stdout
    assert remaining == 6  # the recent ones and the old queued one


async def test_a_bad_retention_is_a_usage_error(settings: Settings) -> None:
    """A retention that is not a duration names the variable and exits 2."""
    env = cli_env(settings, COLDBREW_RETENTION_FAILED="a week")
    result = await run_cli(env, "prune", "--dry-run")
    assert result.returncode == 2
    assert "COLDBREW_RETENTION_FAILED" in result.stderr and "'off'" in result.stderr
