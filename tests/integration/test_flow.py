"""Flow (issue #16, part 1) against the real RabbitMQ and PostgreSQL.

A submission in the caller's transaction commits or rolls back with it and
is published by the relay after the commit; children spawned with
``ctx.submit`` are written with the parent's succeeded outcome, exactly once
across retries, and never by a parent that failed or was fenced (coroutine
and process-pool parents); a chain runs its steps in order, passing results,
across a retry of its middle step, and records the step that stopped it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest

from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.errors import InvalidRequest, JobNotFound
from coldbrew.flow import chain, chain_step_id, child_job_id, step
from coldbrew.migrate import quote_ident
from coldbrew.settings import Settings
from coldbrew.topology import Topology
from tests.helpers import AMQP_URL, DATABASE_URL, WorkerFactory, wait_until


@pytest.fixture
def app() -> Any:
    return load_app("tests.flow_apps:app")


@pytest.fixture
async def fclient(settings: Settings, app: Any) -> AsyncIterator[Client]:
    async with Client.connect(settings, app=app) as connected:
        yield connected


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    """The application's own pool: no search_path to coldbrew's schema, no json codec."""
    async with asyncpg.create_pool(DATABASE_URL, min_size=1, max_size=2) as created:
        async with created.acquire() as conn:
            await conn.execute(
                f"CREATE TABLE {quote_ident(settings.namespace)}.orders (id text PRIMARY KEY)"
            )
        yield created


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLOW_EFFECTS_DIR", str(tmp_path))
    return tmp_path


def runs(effects: Path, job_id: str) -> int:
    path = effects / job_id
    return len(path.read_text().splitlines()) if path.exists() else 0


async def queue_depth(namespace: str, queue: str = "default", tenant: str = "default") -> int:
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(
            Topology(namespace).job_queue(queue, tenant), passive=True
        )
        return int(declared.declaration_result.message_count or 0)
    finally:
        await connection.close()


# --- enqueue in the caller's transaction ---------------------------------------------


async def test_rollback_enqueues_nothing_and_a_commit_runs_without_the_client(
    start_worker: WorkerFactory, settings: Settings, pool: asyncpg.Pool, app: Any
) -> None:
    """A rollback leaves no row and, after a relay pass, no message. A commit whose client
    goes away at once (it never publishes) still runs, woken by NOTIFY well before the
    relay's interval (5 s here)."""
    worker = await start_worker(app, relay_interval_seconds=5.0, processes=1)
    ns = quote_ident(settings.namespace)
    async with Client.connect(settings, app=app, broker=False) as client:
        submitted = []

        async def order_that_fails() -> None:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(f"INSERT INTO {ns}.orders VALUES ('o1')")
                submitted.append(await client.submit("stamp", {"tag": "o1"}, connection=conn))
                raise RuntimeError("the order failed")

        with pytest.raises(RuntimeError, match="the order failed"):
            await order_that_fails()
        assert submitted[0].status == "queued"
        assert await worker.parts.relay.publish_due() == 0  # a relay pass finds nothing
        with pytest.raises(JobNotFound):
            await client.get(submitted[0].id)
        assert await queue_depth(settings.namespace) == 0

        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(f"INSERT INTO {ns}.orders VALUES ('o2')")
            record = await client.submit("stamp", {"tag": "o2"}, connection=conn)
            assert record.status == "queued"
            await asyncio.sleep(0.3)  # uncommitted: invisible to everyone else meanwhile
            with pytest.raises(JobNotFound):
                await client.get(record.id)
        committed = time.time()
    async with Client.connect(settings, app=app) as reader:
        final = await reader.wait(record.id, timeout=10, poll=0.02)
    assert final.status == "succeeded"
    latency = final.result - committed
    assert latency < 1.0, f"started {latency:.3f} s after the commit"
    async with pool.acquire() as conn:
        assert await conn.fetchval(f"SELECT array_agg(id) FROM {ns}.orders") == ["o2"]
        assert await conn.fetchval("SHOW search_path") == '"$user", public'  # left as it was


async def test_transactional_submit_refusals(
    fclient: Client, pool: asyncpg.Pool, settings: Settings
) -> None:
    """Outside a transaction, with unique options, or with a non-asyncpg connection: a clear
    refusal; an idempotency key seen before returns the existing job."""
    async with pool.acquire() as conn:
        with pytest.raises(InvalidRequest, match="inside a transaction"):
            await fclient.submit("stamp", {"tag": "x"}, connection=conn)
        async with conn.transaction():
            with pytest.raises(InvalidRequest, match="unique job"):
                await fclient.submit("stamp", {"tag": "x"}, connection=conn, unique_for=60)
            with pytest.raises(InvalidRequest, match="asyncpg connection"):
                await fclient.submit("stamp", {"tag": "x"}, connection=object())  # type: ignore[arg-type]
            first = await fclient.submit(
                "stamp", {"tag": "k"}, connection=conn, idempotency_key="order-9"
            )
            again = await fclient.submit(
                "stamp", {"tag": "k"}, connection=conn, idempotency_key="order-9"
            )
            assert again.id == first.id
            assert again.args == {"tag": "k"}
        assert (await fclient.get(first.id)).status in ("queued", "running", "succeeded")


# --- children -------------------------------------------------------------------------


async def children_done(client: Client, parent_id: str, count: int) -> bool:
    record = await client.get(parent_id)
    return (record.children or {}).get("succeeded", 0) == count


async def test_children_are_spawned_once_by_the_attempt_that_succeeds(
    start_worker: WorkerFactory, fclient: Client, app: Any, effects: Path, settings: Settings
) -> None:
    """One worker, four parents at once: a plain one (children in its status JSON), one whose
    first attempt spawns and fails (the second spawns the same ids, each once), one that
    fails for good and one whose child's args are bad (both spawn nothing), and a
    process-pool parent (ctx.submit relayed from the pool child)."""
    await start_worker(app, processes=1)
    plain = await fclient.submit("spawner", {"count": 3})
    retried = await fclient.submit("spawner", {"count": 4, "fail_first": True})
    failed = await fclient.submit("spawner", {"count": 3, "permanent": True})
    bad = await fclient.submit("bad_parent", {})
    pooled = await fclient.submit("pool_spawner", {"count": 3})
    finals = {p.id: await fclient.wait(p.id, timeout=20) for p in (plain, retried, failed, bad)}
    assert finals[plain.id].status == "succeeded"
    assert (finals[retried.id].status, finals[retried.id].attempt) == ("succeeded", 2)
    assert finals[failed.id].status == "failed"
    assert finals[bad.id].status in ("failed", "dead")
    assert "n" in (finals[bad.id].error_message or "")
    pool_final = await fclient.wait(pooled.id, timeout=20)
    assert (pool_final.status, pool_final.result) == ("succeeded", 3)
    for parent, count in ((plain, 3), (retried, 4), (pooled, 3)):
        await wait_until(lambda p=parent, c=count: children_done(fclient, p.id, c), timeout=10)

    status = await fclient.status(plain.id)
    assert status["children"] == {"total": 3, "by_status": {"succeeded": 3}}
    assert status["parent_id"] is None
    for n in range(3):
        child = await fclient.status(child_job_id(plain.id, f"leaf-{n}"))
        assert (child["parent_id"], child["result"]) == (plain.id, {"n": n})
        assert runs(effects, child["id"]) == 1
    children = await fclient.store.flow.children_of(retried.id)
    assert sorted(c.id for c in children) == sorted(
        child_job_id(retried.id, f"leaf-{n}") for n in range(4)
    )
    assert all(runs(effects, c.id) == 1 for c in children)
    await asyncio.sleep(settings.relay_interval_seconds * 2)
    for nothing in (failed, bad):
        assert await fclient.store.flow.children_of(nothing.id) == []
        assert (await fclient.status(nothing.id))["children"] == {"total": 0, "by_status": {}}


async def test_fenced_parent_spawns_nothing(
    start_worker: WorkerFactory, fclient: Client, app: Any, settings: Settings
) -> None:
    """Another attempt takes the row while the parent runs: its outcome, children included,
    is fenced away."""
    await start_worker(app, processes=1)
    parent = await fclient.submit("spawner", {"count": 3, "hold": 1.5})
    await wait_until(lambda: _running(fclient, parent.id), timeout=10)
    conn = await asyncpg.connect(DATABASE_URL)
    try:  # what a reaper and a second claim would leave: a newer attempt holds the row
        await conn.execute(
            f"UPDATE {quote_ident(settings.namespace)}.jobs SET attempt = attempt + 1 "
            "WHERE id = $1",
            parent.id,
        )
    finally:
        await conn.close()
    await asyncio.sleep(2.5)  # the hold ends; the outcome write (or the heartbeat) is fenced
    record = await fclient.get(parent.id)
    assert record.status == "running"  # nobody wrote an outcome for it
    assert await fclient.store.flow.children_of(parent.id) == []


async def _running(client: Client, job_id: str) -> bool:
    return (await client.get(job_id)).status == "running"


# --- chains ---------------------------------------------------------------------------


async def test_chains_across_a_retry_and_a_failed_step(
    start_worker: WorkerFactory, fclient: Client, app: Any, effects: Path, settings: Settings
) -> None:
    """A chain whose middle step retries runs each step once more than it failed and passes
    each result on; a chain whose middle step fails stops there and says why."""
    await start_worker(app, processes=1)
    retrying = await fclient.submit_chain(
        chain(step("add", {"x": 1}), step("flaky_add", {"x": 10}), step("add", {"x": 100}))
    )
    stopping = await fclient.submit_chain(
        chain(step("add", {"x": 1}), step("refuse"), step("add", {"x": 5}), chain_id="c-stop")
    )
    assert retrying["status"] == stopping["status"] == "running"

    async def chains_over() -> bool:
        records = [await fclient.chain_status(c["id"]) for c in (retrying, stopping)]
        return all(r["status"] != "running" for r in records)

    await wait_until(chains_over, timeout=15)
    record = await fclient.chain_status(retrying["id"])
    assert (record["status"], record["current_step"]) == ("succeeded", 2), record
    ids = [chain_step_id(retrying["id"], i) for i in range(3)]
    assert [j["id"] for j in record["jobs"]] == ids  # one job per step, no more
    assert (await fclient.get(ids[2])).result == 111
    middle = await fclient.get(ids[1])
    assert (middle.attempt, middle.chain_id, middle.chain_step) == (2, retrying["id"], 1)
    assert [runs(effects, i) for i in ids] == [1, 2, 1]

    record = await fclient.chain_status("c-stop")
    assert (record["status"], record["current_step"]) == ("failed", 1)
    assert "step 1 (refuse" in record["stopped_reason"]
    assert "this step refuses" in record["stopped_reason"]
    await asyncio.sleep(settings.relay_interval_seconds * 2)
    assert len((await fclient.chain_status("c-stop"))["jobs"]) == 2  # step 2 never made
    again = await fclient.submit_chain(chain(step("add", {"x": 1}), chain_id="c-stop"))
    assert again["id"] == "c-stop" and again["step_count"] == 3  # idempotent


async def test_chain_refuses_a_step_that_cannot_take_the_result(fclient: Client) -> None:
    with pytest.raises(InvalidRequest, match="not one of its parameters"):
        await fclient.submit_chain(chain(step("add", {"x": 1}), step("leaf", {"n": 1})))
    with pytest.raises(ValueError, match="at least one step"):
        chain()


async def test_cancelling_a_waiting_step_stops_the_chain(fclient: Client) -> None:
    """The trigger also covers the cancel path (no worker here: the first step waits)."""
    submitted = await fclient.submit_chain(chain(step("add", {"x": 1}), step("add", {"x": 2})))
    first = chain_step_id(submitted["id"], 0)
    await fclient.cancel(first, "not today")
    record = await fclient.chain_status(submitted["id"])
    assert (record["status"], record["current_step"]) == ("cancelled", 0)
    assert "not today" in record["stopped_reason"]
    assert [j["id"] for j in record["jobs"]] == [first]
