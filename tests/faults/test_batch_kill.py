"""kill -9 around a batch's last member: its callbacks still run, exactly once."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from coldbrew import Job
from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.batch_apps import create_calls_table
from tests.faults.harness import Fleet, WorkerProcess
from tests.helpers import DATABASE_URL, make_settings, wait_until

BATCH_APP = "tests.batch_apps:app"
MEMBERS = 200


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": settings.namespace})
    await create_calls_table(conn)
    yield conn
    await conn.close()


@pytest.fixture
async def fleet(settings: Settings, tmp_path: Path) -> AsyncIterator[Fleet]:
    fleet_settings = make_settings(
        settings.namespace, concurrency=50, processes=1, shutdown_grace_seconds=2.0
    )
    (tmp_path / "effects").mkdir()
    (tmp_path / "logs").mkdir()
    running = Fleet(fleet_settings, tmp_path / "effects", tmp_path / "logs", app=BATCH_APP)
    try:
        yield running
    finally:
        running.stop_all()


async def holder(db: asyncpg.Connection, job_id: str) -> tuple[str, int, str | None]:
    row = await db.fetchrow(
        "SELECT status::text, attempt, worker_id FROM jobs WHERE id = $1", job_id
    )
    assert row is not None
    return row["status"], row["attempt"], row["worker_id"]


def by_worker_id(fleet: Fleet, worker_id: str) -> WorkerProcess:
    pid = int(worker_id.rsplit("-", 1)[-1])
    [worker] = [w for w in fleet.workers if w.pid == pid]
    return worker


async def test_kill_9_the_last_members_workers(fleet: Fleet, db: asyncpg.Connection) -> None:
    """200 members on three worker processes; the worker running the last member is killed
    with kill -9, then the worker that finished it on the next attempt is killed the moment
    its outcome is committed: on_complete and on_success each run exactly once, with every
    member counted."""
    await fleet.start(3)
    last = MEMBERS - 1
    members = [Job("member", {"n": i, "seconds": 0.02}) for i in range(last)]
    members.append(Job("member", {"n": last, "seconds": 2.5}))
    async with Client.connect(fleet.settings, app=load_app(BATCH_APP)) as client:
        batch = await client.batch(members, on_complete=Job("record"), on_success=Job("record"))
        straggler = batch.member_ids[-1]

        async def only_straggler_left() -> bool:
            status, _, worker_id = await holder(db, straggler)
            return (
                status == "running"
                and worker_id is not None
                and ((await client.get_batch(batch.id)).pending == 1)
            )

        await wait_until(only_straggler_left, timeout=60)
        _, first_attempt, worker_id = await holder(db, straggler)
        assert worker_id is not None
        fleet.kill(by_worker_id(fleet, worker_id), signal.SIGKILL)  # mid-run: it runs again
        replacement = fleet.start_one()

        async def rerunning() -> bool:
            status, attempt, worker_id = await holder(db, straggler)
            return status == "running" and attempt > first_attempt and worker_id is not None

        await wait_until(rerunning, timeout=20, interval=0.02)
        _, _, finisher_id = await holder(db, straggler)
        assert finisher_id is not None
        finisher = by_worker_id(fleet, finisher_id)

        async def finished() -> bool:
            return (await holder(db, straggler))[0] == "succeeded"

        await wait_until(finished, timeout=30, interval=0.005)
        fleet.kill(finisher, signal.SIGKILL)  # right after the last member's outcome committed
        await fleet.wait_ready(replacement)

        async def called_back() -> bool:
            return await db.fetchval("SELECT count(*) FROM batch_calls") >= 2

        await wait_until(called_back, timeout=30)
        await asyncio.sleep(1.0)  # any duplicate call would land now
        rows = await db.fetch("SELECT job_id, event, batch FROM batch_calls ORDER BY event")
        assert [r["event"] for r in rows] == ["complete", "success"]
        for row in rows:
            info = json.loads(row["batch"])
            assert (info["total"], info["succeeded"]) == (MEMBERS, MEMBERS)
        callbacks = await db.fetch("SELECT id FROM jobs WHERE id LIKE $1", f"{batch.id}:%")
        assert len(callbacks) == 2
        status = await client.batch_status(batch.id)
        assert (status["status"], status["counts"]["succeeded"]) == ("succeeded", MEMBERS)
