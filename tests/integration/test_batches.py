"""Batches against the real services: callbacks exactly once, counts, cancel, ctx.batch.add."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from coldbrew import Job
from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.errors import BatchNotFound, InvalidArguments, InvalidRequest
from coldbrew.settings import Settings
from tests.batch_apps import create_calls_table
from tests.helpers import DATABASE_URL, WorkerFactory, wait_until

RECORD = Job("record", {"tag": "t"})


@pytest.fixture
def test_app() -> Any:
    return load_app("tests.batch_apps:app")


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": settings.namespace})
    await create_calls_table(conn)
    yield conn
    await conn.close()


async def calls(db: asyncpg.Connection) -> list[tuple[str, str, dict[str, Any]]]:
    rows = await db.fetch("SELECT job_id, event, batch FROM batch_calls ORDER BY at")
    return [(r["job_id"], r["event"], json.loads(r["batch"])) for r in rows]


async def callback_done(client: Client, job_id: str) -> bool:
    rows = await client.store.jobs.get_jobs([job_id])
    return bool(rows) and rows[0].status.terminal


async def test_200_members_on_three_workers_call_back_once(
    client: Client, start_worker: WorkerFactory, db: asyncpg.Connection
) -> None:
    """200 members finishing on three workers at once: on_complete and on_success each run
    exactly once, after the last member, with the final counts; on_death never."""
    for _ in range(3):
        await start_worker(concurrency=20)
    members = [Job("member", {"n": i, "seconds": 0.01 * (i % 5)}) for i in range(200)]
    batch = await client.batch(
        members, on_complete=RECORD, on_success=RECORD, on_death=RECORD, description="render"
    )
    assert len(batch.member_ids) == 200 and batch.total == 200
    await wait_until(lambda: callback_done(client, f"{batch.id}:on_success"), timeout=60)
    await wait_until(lambda: callback_done(client, f"{batch.id}:on_complete"), timeout=10)
    got = await calls(db)
    assert sorted(event for _, event, _ in got) == ["complete", "success"]
    for _, _, info in got:  # fired by the last member's transaction: every member counted
        assert (info["total"], info["succeeded"], info["failed"], info["dead"]) == (200, 200, 0, 0)
    status = await client.batch_status(batch.id)
    assert status["status"] == "succeeded" and status["counts"]["succeeded"] == 200
    assert status["progress"] == 1.0 and status["pending"] == 0
    assert status["callbacks"]["on_success"]["status"] == "succeeded"
    assert status["callbacks"]["on_death"]["status"] is None
    member = await client.status(batch.member_ids[0])
    assert member["batch_id"] == batch.id


async def test_concurrent_finishers_fire_once(client: Client, db: asyncpg.Connection) -> None:
    """Members finished by 40 transactions at the same moment (no worker: the trigger alone):
    one on_complete job, inserted by whichever transaction ended the last member."""
    batch = await client.batch([Job("member", {"n": i}) for i in range(40)], on_complete=RECORD)
    await db.execute("UPDATE jobs SET status = 'running' WHERE batch_id = $1", batch.id)
    conns = [
        await asyncpg.connect(DATABASE_URL, server_settings={"search_path": client.store.namespace})
        for _ in batch.member_ids
    ]
    try:
        start = asyncio.Event()

        async def finish(conn: asyncpg.Connection, job_id: str) -> None:
            async with conn.transaction():
                await start.wait()
                await conn.execute("UPDATE jobs SET status = 'succeeded' WHERE id = $1", job_id)

        tasks = [
            asyncio.create_task(finish(c, j)) for c, j in zip(conns, batch.member_ids, strict=True)
        ]
        await asyncio.sleep(0.1)
        start.set()
        await asyncio.gather(*tasks)
    finally:
        for conn in conns:
            await conn.close()
    rows = await db.fetch("SELECT id, args FROM jobs WHERE id LIKE $1", f"{batch.id}:%")
    assert [r["id"] for r in rows] == [f"{batch.id}:on_complete"]
    assert json.loads(rows[0]["args"])["batch"]["succeeded"] == 40
    record = await client.get_batch(batch.id)
    assert (record.pending, record.counts["succeeded"]) == (0, 40)


async def test_death_fires_on_death_and_complete_not_success(
    client: Client, start_worker: WorkerFactory, db: asyncpg.Connection
) -> None:
    """A dead member and a failed one: on_death (once) and on_complete run, on_success does not.
    Beside it a group's ``then`` gets every member's result by id, once all succeeded."""
    await start_worker()
    group = await client.group([Job("member", {"n": n}) for n in range(1, 6)], then=Job("total"))
    batch = await client.batch(
        [Job("member", {"n": 1}), Job("crash"), Job("reject")],
        on_success=RECORD,
        on_complete=RECORD,
        on_death=RECORD,
    )
    await wait_until(lambda: callback_done(client, f"{batch.id}:on_complete"), timeout=30)
    await wait_until(lambda: callback_done(client, f"{batch.id}:on_death"), timeout=10)
    events = sorted(event for _, event, _ in await calls(db))
    assert events == ["complete", "death"]
    status = await client.batch_status(batch.id)
    assert status["status"] == "completed"
    assert (
        status["counts"]["succeeded"],
        status["counts"]["dead"],
        status["counts"]["failed"],
    ) == (
        1,
        1,
        1,
    )
    assert status["callbacks"]["on_success"]["status"] is None
    await wait_until(lambda: callback_done(client, f"{group.id}:on_success"), timeout=30)
    fan_in = await client.get(f"{group.id}:on_success")
    assert fan_in.result == 1 + 4 + 9 + 16 + 25
    assert set(fan_in.args["batch"]["results"]) == set(group.member_ids)


async def test_dlq_replay_reopens_and_success_fires_later(
    client: Client, db: asyncpg.Connection
) -> None:
    """A dead member replayed reopens its finished batch; when it succeeds on_success fires,
    and on_complete (already run) is not enqueued a second time."""
    batch = await client.batch([Job("member", {"n": 1})], on_complete=RECORD, on_success=RECORD)
    [only] = batch.member_ids
    await db.execute("UPDATE jobs SET status = 'running', attempt = 1 WHERE id = $1", only)
    await db.execute("UPDATE jobs SET status = 'dead' WHERE id = $1", only)
    assert (await client.get_batch(batch.id)).status == "completed"
    assert await client.store.dead.dlq_replay(None, only, 10, 3)
    assert (await client.get_batch(batch.id)).pending == 1  # reopened
    await db.execute("UPDATE jobs SET status = 'running' WHERE id = $1", only)
    await db.execute("UPDATE jobs SET status = 'succeeded' WHERE id = $1", only)
    ids = [r["id"] for r in await db.fetch("SELECT id FROM jobs WHERE id LIKE $1", f"{batch.id}:%")]
    assert sorted(ids) == [f"{batch.id}:on_complete", f"{batch.id}:on_success"]
    assert (await client.get_batch(batch.id)).status == "succeeded"


async def test_cancel_batch_cancels_waiting_and_running(
    client: Client, start_worker: WorkerFactory, db: asyncpg.Connection
) -> None:
    """Cancelling a batch cancels its running members (within a heartbeat) and its waiting
    ones (at once); on_complete then runs with every member cancelled."""
    await start_worker(concurrency=2)
    batch = await client.batch(
        [Job("member", {"n": i, "seconds": 30}) for i in range(6)], on_complete=RECORD
    )

    async def two_running() -> bool:
        return (await client.get_batch(batch.id)).counts["running"] == 2

    await wait_until(two_running, timeout=20)
    record = await client.cancel_batch(batch.id, "stop the render")
    assert record.cancel_requested
    await wait_until(lambda: callback_done(client, f"{batch.id}:on_complete"), timeout=20)
    status = await client.batch_status(batch.id)
    assert (status["status"], status["counts"]["cancelled"]) == ("cancelled", 6)
    [(_, event, info)] = await calls(db)
    assert (event, info["cancelled"]) == ("complete", 6)


async def test_ctx_batch_add_counts_once_across_retries(
    client: Client, start_worker: WorkerFactory, db: asyncpg.Connection
) -> None:
    """A member adds three members, then retries and adds them again: four members in all,
    each added once, and on_complete runs once after the added ones finished. A pool member
    adds through the pool's relay; a job in no batch that adds fails at once, clearly."""
    await start_worker()
    batch = await client.batch([Job("spawner", {"children": 3})], on_complete=RECORD)
    pooled = await client.batch([Job("pool_spawner", {"children": 2})], on_complete=RECORD)
    alone = await client.submit("spawner", {"children": 1})
    await wait_until(lambda: callback_done(client, f"{batch.id}:on_complete"), timeout=30)
    await wait_until(lambda: callback_done(client, f"{pooled.id}:on_complete"), timeout=30)
    totals = {info["id"]: (info["total"], info["succeeded"]) for _, _, info in await calls(db)}
    assert totals == {batch.id: (4, 4), pooled.id: (3, 3)}
    spawner = await client.get(batch.member_ids[0])
    assert spawner.attempt == 2
    added = await db.fetch("SELECT id, batch_id FROM jobs WHERE id LIKE $1", f"{spawner.id}+%")
    assert sorted(r["id"] for r in added) == [f"{spawner.id}+child-{i}" for i in range(3)]
    assert {r["batch_id"] for r in added} == {batch.id}
    done = await client.wait(alone.id, timeout=20)
    assert (done.status.value, done.attempt) == ("failed", 1)
    assert "is not a batch member" in (done.error_message or "")


async def test_bad_input_is_refused_before_any_write(
    client: Client, db: asyncpg.Connection
) -> None:
    """Unknown ids, bad ids, empty batches, callbacks without ``batch`` and taken member ids
    are refused with specific errors, and nothing is written."""
    with pytest.raises(BatchNotFound, match="no batch with id 'nope'"):
        await client.get_batch("nope")
    with pytest.raises(InvalidRequest, match="invalid_batch_id"):
        await client.get_batch("has space")
    with pytest.raises(InvalidRequest, match="1-10000 members"):
        await client.batch([])
    with pytest.raises(InvalidRequest, match="must take a `batch` argument"):
        await client.batch([Job("member", {"n": 1})], on_complete=Job("member", {"n": 2}))
    with pytest.raises(InvalidArguments):
        await client.batch([Job("member", {"wrong": 1})])
    taken = await client.submit("member", {"n": 1}, job_id="b1.1")
    with pytest.raises(InvalidRequest, match="exist already"):
        await client.batch([Job("member", {"n": 0}), Job("member", {"n": 1})], batch_id="b1")
    assert await db.fetchval("SELECT count(*) FROM batches") == 0
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE id <> $1", taken.id) == 0
    again = await client.batch([Job("member", {"n": 0})], batch_id="b2")
    same = await client.batch([Job("member", {"n": 0})], batch_id="b2")
    assert same.id == again.id and same.member_ids == again.member_ids
