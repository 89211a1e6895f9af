"""Worker liveness and the reaper's outage hold, on the real PostgreSQL and RabbitMQ.

Nothing here stops a service or closes another session's connection: a dead
worker is a ``workers`` row whose lock no session holds (as after kill -9), a
hung one a row whose lock this test holds on a connection of its own, and a
restart of the server a row that carries another server start time. The
kill -9 and the outages themselves are in tests/faults/test_outages.py, on a
private PostgreSQL and RabbitMQ.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from coldbrew.api.auth import KeyRing
from coldbrew.client import Client
from coldbrew.errors import ConfigurationError
from coldbrew.jobstate import InFlight
from coldbrew.metrics import Metrics
from coldbrew.settings import Settings
from coldbrew.store import JobStore
from coldbrew.worker.liveness import Liveness, coldbrew_version
from coldbrew.worker.reaper import Reaper
from tests.e2e.test_cli import cli_env, run_cli
from tests.helpers import DATABASE_URL, WorkerFactory, make_settings, wait_until
from tests.integration.test_api import ACME, api_client

BEFORE_RESTART = datetime(2000, 1, 1, tzinfo=UTC)  # a server start time that is not this one's
RUNNING_JOB = (
    "INSERT INTO jobs (id, type, queue, tenant, args, max_attempts, status, attempt, started_at,"
    " lease_expires_at, worker_id) VALUES ($1, 'echo', 'default', 'default', '{\"value\": 1}',"
    " 5, 'running', 1, now(), now() + make_interval(secs => $3), $2)"
)
WORKER_ROW = (
    "INSERT INTO workers (id, instance, host, pid, version, lanes, concurrency, backend_pid,"
    " server_started, heartbeat_at) VALUES ($1, 'gone', 'elsewhere', 4242, '0.0.0', '{default}',"
    " 10, 0, coalesce($2, pg_postmaster_start_time()), now() - interval '5 seconds')"
)


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": settings.namespace})
    try:
        yield conn
    finally:
        await conn.close()


async def add_running(
    db: asyncpg.Connection, worker_id: str, count: int, *, lease: float = 3600.0
) -> list[str]:
    """Jobs that ``worker_id`` claimed, under leases that will not expire during the test."""
    ids = [f"{worker_id}-job-{n}" for n in range(count)]
    for job_id in ids:
        await db.execute(RUNNING_JOB, job_id, worker_id, lease)
    return ids


async def statuses(db: asyncpg.Connection, ids: list[str]) -> dict[str, tuple[str, int]]:
    rows = await db.fetch("SELECT id, status::text, attempt FROM jobs WHERE id = ANY($1)", ids)
    return {r["id"]: (r["status"], r["attempt"]) for r in rows}


async def registered(db: asyncpg.Connection) -> set[str]:
    return {r["id"] for r in await db.fetch("SELECT id FROM workers")}


async def test_a_worker_registers_and_removes_its_row(
    start_worker: WorkerFactory, client: Client
) -> None:
    """A running worker has a live row (lanes, version, pid); a clean stop removes it."""
    worker = await start_worker(worker_id="reg-1", queues=["default", "slow"])
    (row,) = await client.store.liveness.list_workers()
    assert (row.id, row.alive, row.lanes, row.concurrency) == (
        "reg-1",
        True,
        ["default", "slow"],
        worker.settings.concurrency,
    )
    assert row.version == coldbrew_version() != "unknown"
    assert row.heartbeat_age_seconds < 5
    worker.stop()
    await wait_until(lambda: _no_workers(client))


async def _no_workers(client: Client) -> bool:
    return not await client.store.liveness.list_workers()


async def test_a_dead_workers_jobs_run_again_within_about_a_second(
    start_worker: WorkerFactory, db: asyncpg.Connection
) -> None:
    """A row whose lock no session holds and whose heartbeat is stale is a dead worker: its
    running jobs (leases an hour long) are released at once, run elsewhere, and its row goes."""
    await start_worker(worker_id="alive")
    await db.execute(WORKER_ROW, "ghost", None)
    ids = await add_running(db, "ghost", 3)
    started = time.monotonic()

    async def done() -> bool:
        return all(s == ("succeeded", 2) for s in (await statuses(db, ids)).values())

    await wait_until(done, timeout=10)
    assert time.monotonic() - started < 4.0
    assert await registered(db) == {"alive"}


async def test_a_hung_worker_keeps_its_jobs_while_its_session_lives(
    start_worker: WorkerFactory, db: asyncpg.Connection, settings: Settings
) -> None:
    """A stale heartbeat alone is not death: while a session holds the worker's lock (a
    SIGSTOPped worker keeps its connection), its jobs stay its own until their lease."""
    await start_worker(worker_id="watcher")
    holder = await asyncpg.connect(DATABASE_URL)
    try:
        key = f"{settings.namespace}:worker:hung"
        await holder.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", key)
        await db.execute(WORKER_ROW, "hung", None)
        ids = await add_running(db, "hung", 2)
        await asyncio.sleep(3.0)  # six liveness ticks
        assert set((await statuses(db, ids)).values()) == {("running", 1)}
        assert "hung" in await registered(db)
    finally:
        await holder.close()  # the hung worker dies now: its session ends

    async def released() -> bool:
        return all(s == ("succeeded", 2) for s in (await statuses(db, ids)).values())

    await wait_until(released, timeout=10)


async def test_a_row_from_before_a_server_restart_waits_a_lease(
    start_worker: WorkerFactory, db: asyncpg.Connection
) -> None:
    """After a PostgreSQL restart every lock is gone; a row that still carries the old
    server start time is a worker that may be reconnecting: not dead until a lease after
    the restart (here the lease outlasts the server's uptime), unlike a row of this run."""
    await start_worker(worker_id="patient", lease_seconds=1_000_000.0)
    await db.execute(WORKER_ROW, "before", BEFORE_RESTART)
    await db.execute(WORKER_ROW, "during", None)
    before = await add_running(db, "before", 1)
    during = await add_running(db, "during", 1)

    async def during_ran() -> bool:
        return (await statuses(db, during))[during[0]] == ("succeeded", 2)

    await wait_until(during_ran, timeout=10)
    await asyncio.sleep(1.5)
    assert (await statuses(db, before))[before[0]] == ("running", 1)
    assert await registered(db) == {"patient", "before"}


async def test_a_worker_restarted_under_its_id_releases_its_predecessors_jobs(
    start_worker: WorkerFactory, db: asyncpg.Connection
) -> None:
    """A container restarted in place gets the same id: the running jobs under that id are
    its dead predecessor's, released before it takes any work."""
    await db.execute(WORKER_ROW, "same-id", None)
    ids = await add_running(db, "same-id", 2)
    await start_worker(worker_id="same-id")

    async def done() -> bool:
        return all(s == ("succeeded", 2) for s in (await statuses(db, ids)).values())

    await wait_until(done, timeout=10)
    assert await registered(db) == {"same-id"}


async def test_two_workers_of_one_process_cannot_share_an_id(
    start_worker: WorkerFactory,
) -> None:
    """Each worker holds its id's lock: a second worker with the same id is refused at once."""
    began = time.monotonic()
    await start_worker(worker_id="twin")
    start_up = time.monotonic() - began  # this machine's start-up now (slow under load)
    began = time.monotonic()
    with pytest.raises(ConfigurationError, match="COLDBREW_WORKER_ID 'twin'"):
        await start_worker(worker_id="twin")
    # refused during its start-up: no wait for the lease (4 s here) or for the first to end
    refused = time.monotonic() - began
    assert refused < start_up + 2, (refused, start_up)


async def test_reap_expired_reaps_nothing_after_a_gap_or_a_recent_restart(
    client: Client, db: asyncpg.Connection
) -> None:
    """The reap statement itself refuses when the reaper's last contact is older than its
    longest gap, or when the server started less than a lease ago; otherwise it reaps."""
    ids = await add_running(db, "expired", 1, lease=-1.0)
    store = client.store
    now, _ = await store.liveness.server_clock()
    stale = now.replace(year=now.year - 1)
    assert await store.leases.reap_expired(500, contact=stale, max_gap=5.0, lease_seconds=1.0) == []
    assert await store.leases.reap_expired(500, contact=now, max_gap=60.0, lease_seconds=1e9) == []
    reaped = await store.leases.reap_expired(500, contact=now, max_gap=60.0, lease_seconds=1.0)
    assert [row["id"] for row in reaped] == ids


async def test_the_reaper_holds_a_lease_after_a_gap_in_contact(
    client: Client, db: asyncpg.Connection
) -> None:
    """Two contacts further apart than a few intervals mean the reaper was cut off: it
    reaps nothing for one lease, so live workers can renew their leases first."""
    assert client.broker is not None
    reaper = Reaper(
        client.store, client.broker, Metrics(CollectorRegistry()), interval=0.5, lease_seconds=2.0
    )
    assert await reaper.reap_expired() == 0  # first contact
    await asyncio.sleep(reaper.max_gap + 0.2)
    ids = await add_running(db, "cut-off", 1, lease=-1.0)
    back = time.monotonic()
    while await reaper.reap_expired() == 0:  # contacts 0.2 s apart: no new gap
        assert (await statuses(db, ids))[ids[0]] == ("running", 1)
        assert time.monotonic() - back < 5, "never reaped"
        await asyncio.sleep(0.2)
    assert time.monotonic() - back >= 2.0 - 0.05
    assert (await statuses(db, ids))[ids[0]] == ("retrying", 1)


async def test_workers_cli_lists_the_live_workers(
    start_worker: WorkerFactory, settings: Settings, db: asyncpg.Connection
) -> None:
    """`coldbrew workers` prints a row per live worker; `--json` the same as objects;
    `--all` also shows a row whose worker is gone but not yet removed."""
    # a lease longer than the server's uptime: the row of "stale" below is not removed
    await start_worker(worker_id="cli-1", lease_seconds=1_000_000.0)
    env = cli_env(settings)
    table, as_json = await asyncio.gather(
        run_cli(env, "workers"), run_cli(env, "workers", "--json")
    )
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.strip().splitlines()
    assert header.split()[:3] == ["id", "host", "pid"]
    assert [row.split()[0] for row in rows] == ["cli-1"]
    parsed = json.loads(as_json.stdout)
    assert [(w["id"], w["alive"], w["lanes"]) for w in parsed] == [
        ("cli-1", True, ["default", "slow"])
    ]
    assert set(parsed[0]) >= {"host", "pid", "version", "started_at", "jobs_in_flight"}

    await db.execute(WORKER_ROW, "stale", BEFORE_RESTART)
    live, with_all = await asyncio.gather(run_cli(env, "workers"), run_cli(env, "workers", "--all"))
    assert "stale" not in live.stdout
    (gone,) = [line for line in with_all.stdout.splitlines() if line.startswith("stale ")]
    assert gone.endswith("(gone)"), with_all.stdout


async def test_dashboard_shows_workers_and_their_load_only_to_every_tenant(
    start_worker: WorkerFactory, client: Client
) -> None:
    """/dashboard.json and the page list the live workers; a tenant's key does not see
    how many jobs each runs."""
    await start_worker(worker_id="dash-1")
    async with api_client(client, KeyRing({}, insecure_no_auth=True)) as http:
        everyone = (await http.get("/dashboard.json")).json()
        page = (await http.get("/dashboard")).text
    async with api_client(client) as http:
        acme = (await http.get("/dashboard.json", headers=ACME)).json()
    assert [(w["id"], w["jobs_in_flight"]) for w in everyone["workers"]] == [("dash-1", 0)]
    assert [w["id"] for w in acme["workers"]] == ["dash-1"]
    assert "jobs_in_flight" not in acme["workers"][0]
    assert "<h2>Workers</h2>" in page and "dash-1" in page


async def test_liveness_off_registers_nothing(start_worker: WorkerFactory, client: Client) -> None:
    """COLDBREW_LIVENESS_SECONDS=0: no row, no lock; recovery is the lease's alone."""
    await start_worker(worker_id="quiet", liveness_seconds=0)
    assert await client.store.liveness.list_workers() == []


async def test_store_lists_nothing_without_workers(settings: Settings) -> None:
    """A namespace where no worker ever ran lists no workers."""
    async with JobStore.open(DATABASE_URL, settings.namespace, pool_size=2) as store:
        assert await store.liveness.list_workers() == []


@pytest.fixture
async def liveness(settings: Settings) -> AsyncIterator[Liveness]:
    """A worker's liveness part on its own (no jobs), registered as ``lone``."""
    lone = make_settings(settings.namespace, worker_id="lone")
    async with JobStore.open(DATABASE_URL, settings.namespace, pool_size=2) as store:

        async def publish_due() -> int:
            return 0

        async def on_released(rows: Any, cause: str) -> None:
            return None

        part = Liveness(
            settings=lone,
            store=store,
            lanes=["default"],
            inflight=InFlight(),
            metrics=Metrics(CollectorRegistry()),
            publish_due=publish_due,
            on_released=on_released,
        )
        await part.open()
        try:
            yield part
        finally:
            await part.close()


async def lock_holder(db: asyncpg.Connection, namespace: str, worker_id: str) -> int | None:
    holder: int | None = await db.fetchval(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
        " AND (classid::int8 << 32) | objid::int8 = hashtextextended($1, 0)",
        f"{namespace}:worker:{worker_id}",
    )
    return holder


async def test_a_session_the_server_kept_is_ended_and_the_lock_taken_back(
    liveness: Liveness, db: asyncpg.Connection, settings: Settings
) -> None:
    """The worker gave up on its session (a timeout in a network outage) but the server still
    keeps it, holding the lock: the new session refreshes the row, ends the old one, and holds
    the lock; meanwhile the worker never looked dead (the lock was never free)."""
    old = await lock_holder(db, settings.namespace, "lone")
    assert old is not None
    liveness._session_broke()  # what a timed-out statement does
    assert await lock_holder(db, settings.namespace, "lone") == old  # kept, not closed
    await liveness.tick()
    new = await lock_holder(db, settings.namespace, "lone")
    assert new is not None and new != old
    assert await db.fetchval("SELECT backend_pid FROM workers WHERE id = 'lone'") == new
    await wait_until(lambda: _backend_gone(db, old))


async def _backend_gone(db: asyncpg.Connection, pid: int) -> bool:
    return not await db.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)


async def test_after_its_own_session_broke_a_worker_releases_nobody_for_a_lease(
    liveness: Liveness, db: asyncpg.Connection
) -> None:
    """A worker whose liveness session ended was cut off too, like the others may have been:
    once back, it takes no one for dead for a lease (here 4 s), then it does."""
    assert liveness._conn is not None
    liveness._conn.terminate()  # our own session ends (the server frees our lock)
    await db.execute(WORKER_ROW, "ghost", None)
    back = time.monotonic()
    await liveness.tick()  # reconnects, takes its lock back
    await liveness.tick()
    assert "ghost" in await registered(db)
    while "ghost" in await registered(db):
        assert time.monotonic() - back < 10, "the dead row was never removed"
        await asyncio.sleep(0.2)
        await liveness.tick()
    assert time.monotonic() - back >= liveness.lease - 0.1
