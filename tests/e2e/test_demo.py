"""`coldbrew demo` as a newcomer runs it: in the namespace of the environment, each job
printed with its id, once in the results, and a summary of every tenant and lane."""

from __future__ import annotations

import re

import asyncpg

from coldbrew.settings import Settings
from tests.e2e.test_cli import cli_env, run_cli
from tests.helpers import DATABASE_URL, make_settings

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TOUCHED = {("default", "acme"), ("default", "globex"), ("default", "initech"), ("slow", "globex")}


async def test_demo_in_the_environments_namespace(namespace: str) -> None:
    """COLDBREW_NAMESPACE decides the demo's namespace; off a terminal every progress line
    starts with its job's id and none repeats; the results name each of the 8 jobs once;
    the summary has a row for every lane and tenant touched; the namespace is dropped."""
    settings: Settings = make_settings(namespace)
    done = await run_cli(cli_env(settings), "demo", limit=60)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert f"namespace {namespace!r}" in out.splitlines()[0]
    progress = [line for line in out.splitlines() if UUID.match(line)]
    ids = {UUID.match(line).group(0) for line in progress}  # type: ignore[union-attr]
    assert len(ids) == 8, progress
    assert len(progress) == len(set(progress)), "a progress line printed twice"
    results = out.split("all 8 jobs finished", 1)[1].split("from the job table", 1)[0]
    for job_id in ids:
        assert results.count(job_id[:8]) == 1, (job_id, results)
    assert results.count("succeeded") == 6 and "cancelled" in results and "failed" in results
    summary = out.split("from the job table", 1)[1]
    rows = {
        tuple(cells[:2])
        for line in summary.splitlines()
        if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) > 2
    }
    assert rows >= TOUCHED, summary
    assert "1 rejected message(s), reason 'not_json'" in summary
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        schema = await conn.fetchval(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = $1", namespace
        )
    finally:
        await conn.close()
    assert schema is None, "the demo left its schema behind"
