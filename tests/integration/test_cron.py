"""Cron on the real services: once per tick across workers and restarts, catch-up after
an outage, edits, the CLI, start-up errors.

Every schedule ticks each second (six fields, seconds last), so an "outage"
is a few seconds and the whole file runs in about half a minute.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import datetime, timedelta

import asyncpg
import pytest

from coldbrew.app import load_app
from coldbrew.cli import HANDLERS, build_parser, exit_code
from coldbrew.crontab import parse_tick_id
from coldbrew.errors import ColdbrewError, ConfigurationError
from coldbrew.settings import Settings
from coldbrew.worker import Worker
from coldbrew.worker.lifecycle import Phase
from tests.e2e.test_cli import cli_env, run_cli
from tests.helpers import DATABASE_URL, WorkerFactory, make_settings, metric, wait_until

SECOND = timedelta(seconds=1)
GRACE = 1.0


async def tick_jobs(namespace: str, schedule: str) -> list[tuple[datetime, datetime, str]]:
    """``(tick, created_at, status)`` of every tick job of ``schedule``, in tick order."""
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": namespace})
    try:
        rows = await conn.fetch(
            "SELECT id, created_at, status::text FROM jobs WHERE id LIKE $1",
            f"cron:{schedule}:%",
        )
    finally:
        await conn.close()
    found = []
    for row in rows:
        parsed = parse_tick_id(row["id"])
        if parsed is not None:  # manual runs are not ticks
            found.append((parsed[1], row["created_at"], row["status"]))
    return sorted(found)


async def stop(worker: Worker) -> None:
    worker.stop()
    await wait_until(lambda: _stopped(worker), timeout=30)


async def _stopped(worker: Worker) -> bool:
    return worker.lifecycle.phase is Phase.STOPPED


async def until_just_after_a_tick(offset: float = 0.02) -> None:
    """Sleep to ``offset`` seconds past the next whole second (a tick boundary)."""
    now = time.time()
    await asyncio.sleep(1 - (now % 1) + offset)


def assert_every_tick_once(ticks: list[datetime]) -> None:
    assert len(ticks) == len(set(ticks)), "a tick has two jobs"
    expected = [
        ticks[0] + n * SECOND for n in range(int((ticks[-1] - ticks[0]).total_seconds()) + 1)
    ]
    missing = sorted(set(expected) - set(ticks))
    assert not missing, f"ticks without a job: {missing}"


def fleet_sum(workers: list[Worker], name: str, **labels: str) -> float:
    return sum(metric(worker, name, **labels) for worker in workers)


async def test_three_workers_fire_each_tick_once_through_restarts(
    start_worker: WorkerFactory, settings: Settings
) -> None:
    app = load_app("tests.cron_apps:app")
    workers = [await start_worker(app) for _ in range(3)]
    await asyncio.sleep(2.0)
    # stop the worker that decided the latest tick, just after a tick boundary
    await until_just_after_a_tick(0.005)
    last = max(
        workers,
        key=lambda w: metric(
            w, "coldbrew_cron_last_tick_timestamp_seconds", schedule="every-second"
        ),
    )
    await stop(last)
    await asyncio.sleep(1.0)
    workers.append(await start_worker(app))
    await asyncio.sleep(2.0)
    jobs = await tick_jobs(settings.namespace, "every-second")
    ticks = [tick for tick, _, _ in jobs]
    assert len(ticks) >= 6
    assert_every_tick_once(ticks)
    decided = fleet_sum(
        workers, "coldbrew_cron_ticks_total", schedule="every-second", outcome="fired"
    ) + fleet_sum(
        workers, "coldbrew_cron_ticks_total", schedule="every-second", outcome="caught_up"
    )
    assert decided == len(ticks), "each tick is decided (and counted) by one worker"
    assert (
        fleet_sum(workers, "coldbrew_cron_start_lag_seconds_count", schedule="every-second")
        >= len(ticks) - 2
    )
    lag = fleet_sum(workers, "coldbrew_cron_start_lag_seconds_sum", schedule="every-second")
    assert 0 < lag / max(1, len(ticks)) < 2.0, "ticks start within seconds, on average"


async def test_catch_up_policies_after_a_fleet_outage(
    start_worker: WorkerFactory, settings: Settings
) -> None:
    """Stop every worker for ~7 ticks; two new ones decide the outage once, per policy."""
    app = load_app("tests.cron_apps:policies")
    first = [await start_worker(app, cron_grace_seconds=GRACE) for _ in range(2)]
    for name in ("latest", "all", "none"):
        await wait_until(lambda n=name: _has_jobs(settings.namespace, n, 1), timeout=10)
    for worker in first:
        await stop(worker)
    before = {name: await tick_jobs(settings.namespace, name) for name in ("latest", "all", "none")}
    # 6.5 s: "all" catches up 3 of the missed ticks and must still see 2 skipped, with a
    # margin for a loaded machine (4.5 s left exactly 1 beside other test processes)
    await asyncio.sleep(6.5)
    second = [await start_worker(app, cron_grace_seconds=GRACE) for _ in range(2)]
    await asyncio.sleep(2.5)
    for name in ("latest", "all", "none"):
        jobs = await tick_jobs(settings.namespace, name)
        last_before = before[name][-1][0]
        after = [(tick, created) for tick, created, _ in jobs if tick > last_before]
        assert after, f"{name}: nothing fired after the outage"
        span = int((after[-1][0] - last_before).total_seconds())
        absent = span - len(after)  # ticks in the outage with no job
        counts = {
            outcome: fleet_sum(second, "coldbrew_cron_ticks_total", schedule=name, outcome=outcome)
            for outcome in ("fired", "caught_up", "skipped")
        }
        # decided once for the fleet: the two workers' counts add up to the table's
        assert counts["skipped"] == absent, (name, counts, absent, after)
        assert counts["fired"] + counts["caught_up"] == len(after), (name, counts, after)
        assert absent >= 2, f"{name}: the outage missed too few ticks to tell ({absent})"
        assert_every_tick_once([tick for tick, _ in after])  # contiguous after the gap
        first_late = (after[0][1] - after[0][0]).total_seconds() >= GRACE
        if name == "all":  # max_catch_up=3: the latest three missed ticks
            assert counts["caught_up"] == 3
            assert first_late
        elif name == "latest":  # the most recent missed tick once (or none: one was on time)
            assert counts["caught_up"] <= 1
            assert first_late or counts["caught_up"] == 0
        else:
            assert counts["caught_up"] == 0


async def _has_jobs(namespace: str, schedule: str, count: int) -> bool:
    return len(await tick_jobs(namespace, schedule)) >= count


async def test_editing_an_expression_reruns_no_tick(
    start_worker: WorkerFactory, settings: Settings
) -> None:
    old = await start_worker(load_app("tests.cron_apps:before_edit"))
    await wait_until(lambda: _has_jobs(settings.namespace, "edited", 2), timeout=10)
    await stop(old)
    decided = (await tick_jobs(settings.namespace, "edited"))[-1][0]
    await asyncio.sleep(2.2)  # ticks missed under the old expression (catch_up="all")
    new = await start_worker(load_app("tests.cron_apps:after_edit"))
    await asyncio.sleep(2.5)
    jobs = await tick_jobs(settings.namespace, "edited")
    after = [tick for tick, _, _ in jobs if tick > decided]
    assert after, "the edited schedule fires"
    assert all(tick.second % 2 == 0 for tick in after), "only the new expression's ticks"
    assert len(jobs) == len({tick for tick, _, _ in jobs})
    # the edit starts from the deploy: the old expression's missed ticks are not caught up
    assert metric(new, "coldbrew_cron_ticks_total", schedule="edited", outcome="caught_up") == 0
    assert min(after) - decided >= timedelta(seconds=2)


async def cli(
    capsys: pytest.CaptureFixture[str], settings: Settings, *argv: str
) -> tuple[int, str, str]:
    """``coldbrew ARGV`` in this process (a subprocess costs seconds on a loaded machine):
    the handler, and the exit code and one-line error ``cli.main`` makes of its errors."""
    capsys.readouterr()
    args = build_parser().parse_args(argv)
    try:
        code = await HANDLERS[args.command](args, settings)
    except ColdbrewError as exc:
        code = exit_code(exc)
        print(f"coldbrew: {exc}", file=sys.stderr)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_pause_resume_trigger_and_list_from_the_cli(
    start_worker: WorkerFactory, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    await start_worker(load_app("tests.cron_apps:app"))
    await wait_until(lambda: _has_jobs(settings.namespace, "every-second", 1), timeout=10)
    code, out, _ = await cli(capsys, settings, "cron", "pause", "every-second")
    assert (code, out.strip()) == (0, "coldbrew: cron schedule 'every-second' is paused")
    held = len(await tick_jobs(settings.namespace, "every-second"))
    await asyncio.sleep(2.2)
    assert len(await tick_jobs(settings.namespace, "every-second")) <= held + 1  # one in flight
    code, out, _ = await cli(capsys, settings, "cron", "list", "--json")
    (entry,) = json.loads(out)
    assert (entry["name"], entry["state"], entry["next_tick"]) == ("every-second", "paused", None)
    stopped_at = (await tick_jobs(settings.namespace, "every-second"))[-1][0]
    code, out, _ = await cli(capsys, settings, "cron", "resume", "every-second")
    assert (code, out.strip()) == (0, "coldbrew: cron schedule 'every-second' is active")
    await wait_until(lambda: _has_jobs(settings.namespace, "every-second", held + 2), timeout=10)
    resumed = [t for t, _, _ in await tick_jobs(settings.namespace, "every-second")]
    assert resumed[-1] - stopped_at >= timedelta(seconds=2), "paused ticks are not run"

    code, out, _ = await cli(capsys, settings, "cron", "trigger", "every-second")
    assert code == 0
    job = json.loads(out)
    assert job["id"].startswith("cron:every-second:manual:")
    assert job["type"] == "tick"
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": settings.namespace})
    try:
        await wait_until(lambda: _status(conn, job["id"], "succeeded"), timeout=10)
    finally:
        await conn.close()

    code, out, _ = await cli(capsys, settings, "cron", "list")
    (line,) = [row for row in out.splitlines() if row.startswith("every-second")]
    assert "active" in line
    assert "(succeeded)" in line  # the last tick's job and its status
    for verb in ("pause", "resume", "trigger"):
        code, _, err = await cli(capsys, settings, "cron", verb, "nope")
        assert code == 1
        assert "no cron schedule named 'nope'" in err
    code, _, err = await cli(capsys, settings, "cron", "pause", "no spaces")
    assert code == 2
    assert "must match" in err


async def _status(conn: asyncpg.Connection, job_id: str, status: str) -> bool:
    found = await conn.fetchval("SELECT status::text FROM jobs WHERE id = $1", job_id)
    return bool(found == status)


async def test_an_empty_table_lists_clearly(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = await cli(capsys, settings, "cron", "list")
    assert code == 0
    assert "no cron schedules" in out
    code, out, _ = await cli(capsys, settings, "cron", "list", "--json")
    assert json.loads(out) == []


async def test_a_removed_schedule_stops_firing_and_shows_orphaned(
    start_worker: WorkerFactory, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    old = await start_worker(load_app("tests.cron_apps:app"))
    await wait_until(lambda: _has_jobs(settings.namespace, "every-second", 1), timeout=10)
    await stop(old)
    fired = len(await tick_jobs(settings.namespace, "every-second"))
    await start_worker(load_app("tests.cron_apps:daily"))  # the release without it
    await asyncio.sleep(2.0)
    assert len(await tick_jobs(settings.namespace, "every-second")) == fired
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": settings.namespace})
    try:  # as if no worker had declared it for an hour
        await conn.execute(
            "UPDATE cron_schedules SET seen_at = now() - interval '1 hour'"
            " WHERE name = 'every-second'"
        )
    finally:
        await conn.close()
    code, out, _ = await cli(capsys, settings, "cron", "list", "--json")
    states = {entry["name"]: (entry["state"], entry["next_tick"]) for entry in json.loads(out)}
    assert states["every-second"] == ("orphaned", None)
    assert states["morning"][0] == "active"
    assert states["morning"][1] is not None
    code, out, _ = await cli(capsys, settings, "cron", "remove", "every-second")
    assert code == 0
    assert "removed" in out
    code, out, _ = await cli(capsys, settings, "cron", "list", "--json")
    assert [entry["name"] for entry in json.loads(out)] == ["morning"]
    code, _, err = await cli(capsys, settings, "cron", "remove", "every-second")
    assert code == 1
    assert "no cron schedule named 'every-second'" in err


def test_bad_configured_schedules_fail_at_start_up(settings: Settings) -> None:
    app = load_app("tests.cron_apps:daily")
    for cron, message in [
        (
            '[{"type": "missing", "expression": "* * * * *"}]',
            "job type 'missing' is not registered",
        ),
        (
            '[{"type": "greet", "name": "morning", "expression": "* * * * *",'
            ' "args": {"label": "x"}}]',
            "also declared with @app.cron",
        ),
        ('[{"type": "greet", "name": "x", "expression": "* * * * *"}]', "args do not fit"),
    ]:
        with pytest.raises(ConfigurationError, match="COLDBREW_CRON: schedule") as caught:
            Worker(app, make_settings(settings.namespace, cron=cron))
        assert message in str(caught.value)


async def test_a_bad_expression_stops_the_worker_naming_the_schedule(settings: Settings) -> None:
    env = cli_env(
        settings,
        COLDBREW_CRON='[{"type": "greet", "name": "evening", '
        '"expression": "0 25 * * *", "args": {"label": "pm"}}]',
    )
    result = await run_cli(env, "worker", "tests.cron_apps:daily", limit=30)
    assert result.returncode == 2
    assert "COLDBREW_CRON" in result.stderr
    assert "cron schedule 'evening'" in result.stderr
    assert "invalid cron expression '0 25 * * *'" in result.stderr


async def test_racing_firings_of_one_tick_make_one_job(settings: Settings) -> None:
    """Ten concurrent compare-and-swaps of one watermark: one commits its job, nine nothing."""
    from coldbrew.client import Client
    from coldbrew.crontab import tick_job_id
    from coldbrew.store import CronDefinition

    app = load_app("tests.cron_apps:app")
    async with Client.connect(settings, app=app, broker=False) as client:
        store = client.store
        definition = CronDefinition(
            "race", "* * * * * *", "UTC", "tick", {}, "default", "default", 0, 3, None, "all", 10
        )
        await store.cron.declare(definition)
        await asyncio.sleep(1.1)  # a tick is due
        (mark,) = await store.cron.watermarks(["race"])
        tick = mark.now.replace(microsecond=0)
        request = client.prepare("tick", {}, job_id=tick_job_id("race", tick))
        results = await asyncio.gather(
            *(store.cron.fire(mark, tick, [request], relay_grace=60) for _ in range(10))
        )
        won = [result for result in results if result is not None]
        assert len(won) == 1
        assert [r.id for r, _ in won[0]] == [request.id]
        (after,) = await store.cron.watermarks(["race"])
        assert after.last_tick == tick
        # a stale watermark (read before the swap) decides nothing, ever
        assert await store.cron.fire(mark, tick, [request], relay_grace=60) is None
