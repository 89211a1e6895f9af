"""kill -9 of a worker around a parent's outcome: each child exists exactly once (issue #16).

Before the outcome write (the parent is running, its children collected in
memory): nothing is written; the next attempt, on a new worker, spawns the
children. Right after the outcome's commit (children written, perhaps not
yet published): a new worker's relay publishes them, and each runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.flow import child_job_id
from coldbrew.settings import Settings
from tests.faults.harness import Fleet
from tests.helpers import DATABASE_URL, make_settings, wait_until

APP = "tests.flow_apps:app"
COUNT = 5


@pytest.fixture
async def fleet(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Fleet]:
    effects = tmp_path / "effects"
    effects.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setenv("FLOW_EFFECTS_DIR", str(effects))  # worker_env passes it on
    fast = make_settings(settings.namespace, processes=1, shutdown_grace_seconds=2.0)
    running = Fleet(fast, effects, logs, app=APP)
    try:
        yield running
    finally:
        running.stop_all()


async def job_rows(namespace: str, parent_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": namespace})
    try:
        return await conn.fetch(
            "SELECT id, status, attempt FROM jobs WHERE parent_id = $1 ORDER BY id", parent_id
        )
    finally:
        await conn.close()


async def assert_children_once(fleet: Fleet, client: Client, parent_id: str) -> None:
    expected = sorted(child_job_id(parent_id, f"leaf-{n}") for n in range(COUNT))

    async def all_succeeded() -> bool:
        rows = await job_rows(fleet.settings.namespace, parent_id)
        return len(rows) == COUNT and all(r["status"] == "succeeded" for r in rows)

    await wait_until(all_succeeded, timeout=30)
    rows = await job_rows(fleet.settings.namespace, parent_id)
    assert [r["id"] for r in rows] == expected  # each child exactly once, no stray ids
    for row in rows:  # and each ran (a run cut by the kill runs again: at least once)
        assert (fleet.effects_dir / row["id"]).exists()
    status = await client.status(parent_id)
    assert status["children"] == {"total": COUNT, "by_status": {"succeeded": COUNT}}


async def test_kill_9_before_the_parents_outcome(fleet: Fleet) -> None:
    """The parent spawned (in memory) and is holding: kill -9; nothing was written; the
    retry on a new worker spawns each child once."""
    await fleet.start(count=1)
    async with Client.connect(fleet.settings, app=load_app(APP)) as client:
        parent = await client.submit("spawner", {"count": COUNT, "hold_first": 30})
        await wait_until(lambda: _status_is(client, parent.id, "running"), timeout=15)
        await asyncio.sleep(0.3)  # past its ctx.submit calls, into the hold
        fleet.kill(fleet.workers[0])
        assert await job_rows(fleet.settings.namespace, parent.id) == []
        await fleet.start(count=1)
        final = await client.wait(parent.id, timeout=30)
        assert (final.status, final.attempt) == ("succeeded", 2)
        await assert_children_once(fleet, client, parent.id)


async def test_kill_9_right_after_the_parents_outcome(fleet: Fleet) -> None:
    """kill -9 as soon as the parent's outcome is committed (its children written, maybe
    not published): a new worker's relay publishes them; each exists once."""
    await fleet.start(count=1)
    async with Client.connect(fleet.settings, app=load_app(APP)) as client:
        parent = await client.submit("spawner", {"count": COUNT})
        await wait_until(
            lambda: _status_is(client, parent.id, "succeeded"), timeout=15, interval=0.005
        )
        fleet.kill(fleet.workers[0])
        assert len(await job_rows(fleet.settings.namespace, parent.id)) == COUNT
        await fleet.start(count=1)
        await assert_children_once(fleet, client, parent.id)
        assert (await client.get(parent.id)).attempt == 1  # the parent ran once


async def _status_is(client: Client, job_id: str, status: str) -> bool:
    return (await client.get(job_id)).status == status
