"""`coldbrew submit --at | --delay`, `cancel` of a scheduled job and `stats`, run by a user."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.e2e.test_cli import cli_env, one_line, run_cli
from tests.helpers import WorkerFactory


async def test_submit_at_and_delay_run_on_time_and_cancel(
    settings: Settings, start_worker: WorkerFactory, client: Client
) -> None:
    """--at and --delay print a scheduled job; the delayed one runs on time; `cancel` keeps
    the other from ever running. (--at is an hour ahead: a subprocess may take seconds to
    start on a busy machine, and a time already past would run at once.)"""
    await start_worker(load_app("tests.scheduled_apps:app"), processes=0)
    env = cli_env(settings)
    at = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    by_time, by_delay = await asyncio.gather(
        run_cli(env, "submit", "noop", "--at", at.isoformat().replace("+00:00", "Z")),
        run_cli(env, "submit", "noop", "--delay", "1s"),
    )
    jobs = []
    for done in (by_time, by_delay):
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        assert status["status"] == "scheduled", status
        jobs.append(status)
    assert datetime.fromisoformat(jobs[0]["run_at"]) == at
    cancelled = await run_cli(env, "cancel", jobs[0]["id"])
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["status"] == "cancelled"
    record = await client.wait(jobs[1]["id"], timeout=10, poll=0.05)
    assert record.status == "succeeded"
    assert record.started_at is not None
    late = (record.started_at - datetime.fromisoformat(jobs[1]["run_at"])).total_seconds()
    assert 0 <= late <= 1.5, late
    never = await client.get(jobs[0]["id"])
    assert (never.status, never.attempt, never.started_at) == ("cancelled", 0, None)


async def test_submit_refuses_bad_times(settings: Settings) -> None:
    """A time that is not ISO 8601 or has no offset, a bad or too long duration, or both
    flags: exit 2 with one line saying what is wrong (the parsers' every case is unit-tested
    in tests/unit/test_durations.py)."""
    env = cli_env(settings)
    cases = [
        (["--at", "next tuesday"], "--at"),
        (["--at", "2030-01-01T00:00:00"], "offset"),
        (["--delay", "-5s"], "--delay"),
        (["--delay", "20000d"], "bad_delay"),  # too far: refused by Client.submit
        (["--at", "2030-01-01T00:00:00Z", "--delay", "1s"], "not allowed with"),
    ]
    results = await asyncio.gather(*(run_cli(env, "submit", "echo", *flags) for flags, _ in cases))
    for (flags, says), done in zip(cases, results, strict=True):
        assert done.returncode == 2, (flags, done.stderr)
        assert done.stdout == ""
        if flags.count("--at") + flags.count("--delay") == 1:
            assert says in one_line(done.stderr), (flags, done.stderr)
        else:  # argparse's own usage message
            assert says in done.stderr, (flags, done.stderr)


async def test_stats_shows_scheduled_apart(settings: Settings, client: Client) -> None:
    """`stats` has a scheduled column; a job due in an hour is not queued there."""
    await client.submit("echo", tenant="later", delay=3600)
    table = await run_cli(cli_env(settings), "stats")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    start = next(i for i, text in enumerate(lines) if text.split()[:1] == ["queue"])
    header, line = lines[start : start + 2]
    columns = dict(zip(header.split(), line.split(), strict=False))
    assert (columns["scheduled"], columns["queued"]) == ("1", "0")
