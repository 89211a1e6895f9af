"""Fleet-wide caps: ``max_running`` per tenant and per job type, across workers.

The overlap is measured from the jobs' own start and end times, which lie
inside each job's ``running`` interval in PostgreSQL, so more overlap than
the cap means the cap was broken.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg
import pytest

from coldbrew.caps import Capped, claim_capped
from coldbrew.client import Client
from coldbrew.settings import Settings
from coldbrew.store import ClaimRequest, ClaimResult, JobStore
from coldbrew.topology import Topology
from coldbrew.worker import Worker
from tests.helpers import DATABASE_URL, WorkerFactory, wait_until


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end before a start at a tie)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


async def results(client: Client, ids: list[str], timeout: float = 60) -> list[Any]:
    finals = await asyncio.gather(*(client.wait(job_id, timeout=timeout) for job_id in ids))
    assert [f.status for f in finals] == ["succeeded"] * len(ids)
    return [f.result for f in finals]


def full_here(worker: Worker, scope: tuple[str, str]) -> bool:
    """Whether ``worker`` holds deliveries of ``scope`` because its cap was found full."""
    cap = worker.caps._scopes.get(scope)
    return cap is not None and cap.full


def request(tenant: str, job_type: str = "echo") -> ClaimRequest:
    return ClaimRequest(uuid.uuid4().hex, job_type, "default", tenant, {}, 0, 3, None, None)


def test_max_overlap_counts_open_intervals() -> None:
    assert max_overlap([(0, 2), (1, 3), (2, 4)]) == 2
    assert max_overlap([(0, 1), (1, 2)]) == 1
    assert max_overlap([(0, 10), (1, 2), (1, 3), (2.5, 4)]) == 3


async def test_tenant_cap_holds_across_two_workers_and_others_run(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """At most 2 of tenant "capped"'s jobs run at once fleet-wide; tenant "free" is not slowed."""
    channel = Topology(settings.namespace).tenant_channel
    await client.store.tenants.set_tenant("capped", max_running=2, channel=channel)
    workers = [await start_worker(worker_id="w1"), await start_worker(worker_id="w2")]
    # the tenant's queue is provisioned by its first job; until both workers consume
    # it, one may take every delivery and, seeing its own two running, never claim
    # past the cap: the fleet-wide path (a claim that finds no room) would go untested
    await results(client, [(await client.submit("echo", {}, tenant="capped")).id])

    queue = Topology(settings.namespace).job_queue("default", "capped")

    async def both_consume() -> bool:  # basic.consume answered, on both
        return all(queue in w.parts.broker.consumers for w in workers)

    await wait_until(both_consume)
    capped = [
        (await client.submit("timed_sleep", {"seconds": 0.3}, tenant="capped")).id
        for _ in range(10)
    ]
    free = [
        (await client.submit("timed_sleep", {"seconds": 0.3}, tenant="free")).id for _ in range(10)
    ]
    free_done = await results(client, free)
    capped_done = await results(client, capped)
    assert max_overlap([(r["start"], r["end"]) for r in capped_done]) <= 2
    # the free tenant's ten jobs ran side by side, not behind the capped ones
    assert max_overlap([(r["start"], r["end"]) for r in free_done]) >= 5
    assert max(r["end"] for r in free_done) < max(r["end"] for r in capped_done)
    waits = sum(
        w.metrics.registry.get_sample_value("coldbrew_cap_waits_total", {"scope": "tenant"}) or 0
        for w in workers
    )
    assert waits > 0


async def test_type_cap_holds_across_two_workers(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """``coldbrew types set transcode --max-running 1``: one transcode at a time, fleet-wide."""
    channel = Topology(settings.namespace).tenant_channel
    await client.store.tenants.set_job_type("transcode", max_running=1, channel=channel)
    await start_worker(worker_id="w1")
    await start_worker(worker_id="w2")
    ids = [
        (await client.submit("transcode", {"seconds": 0.2}, tenant=f"t{i % 3}")).id
        for i in range(6)
    ]
    others = [(await client.submit("timed_sleep", {"seconds": 0.2})).id for _ in range(4)]
    done = await results(client, ids)
    assert max_overlap([(r["start"], r["end"]) for r in done]) == 1
    await results(client, others)


async def test_capped_job_waits_as_queued_and_runs_when_the_cap_rises(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """With max_running 0 the job is recorded and shown queued, holds no slot, and runs later."""
    channel = Topology(settings.namespace).tenant_channel
    await client.store.tenants.set_tenant("frozen", max_running=0, channel=channel)
    worker = await start_worker(concurrency=1)
    held = await client.submit("echo", {"value": 1}, tenant="frozen")

    async def parked() -> bool:
        return full_here(worker, ("tenant", "frozen"))

    await wait_until(parked, timeout=10)
    assert (await client.get(held.id)).status == "queued"
    # the only slot is free for another tenant meanwhile
    other = await client.submit("echo", {"value": 2}, tenant="warm")
    assert (await client.wait(other.id, timeout=10)).status == "succeeded"
    assert (await client.get(held.id)).status == "queued"
    await client.store.tenants.set_tenant("frozen", uncap=True, channel=channel)
    final = await client.wait(held.id, timeout=10)
    assert final.status == "succeeded" and final.attempt == 1


@pytest.mark.parametrize("held_by", ["paused tenant", "full type cap"])
async def test_deliveries_held_too_long_are_handed_back_not_lost(
    start_worker: WorkerFactory, client: Client, settings: Settings, held_by: str
) -> None:
    """A delivery held past the consumer_timeout margin (its tenant paused, or its type
    at a cap of 0) goes back to RabbitMQ and comes back to be held again; released, the
    job runs once."""
    channel = Topology(settings.namespace).tenant_channel
    paused = held_by == "paused tenant"

    async def hold(on: bool) -> None:
        if paused:
            await client.store.tenants.set_tenant("waiting", paused=on, channel=channel)
        else:
            cap = 0 if on else None
            await client.store.tenants.set_job_type("transcode", max_running=cap, channel=channel)

    await hold(True)
    worker = await start_worker(
        broker_consumer_timeout_seconds=3.0, heartbeat_seconds=0.5, lease_seconds=5.0
    )
    assert worker.hold_limit == 1.5
    if paused:
        job = await client.submit("echo", {"value": 1}, tenant="waiting")
    else:
        job = await client.submit("transcode", {"seconds": 0.01}, tenant="t1")

    async def requeued_twice() -> bool:
        value = worker.metrics.registry.get_sample_value("coldbrew_held_requeued_total")
        return (value or 0) >= 2

    await wait_until(requeued_twice, timeout=15)
    assert (await client.get(job.id)).status == "queued"
    await hold(False)
    final = await client.wait(job.id, timeout=10)
    assert final.status == "succeeded" and final.attempt == 1


# --- the capped claim itself (coldbrew.caps.claim_capped) -----------------------------


async def hold_advisory_lock(namespace: str, key: str) -> asyncpg.Connection:
    """Another session takes ``<namespace>:cap:<key>``'s advisory lock, in an open transaction,
    as a capped claim of another worker does; close the connection to let it go."""
    conn = await asyncpg.connect(DATABASE_URL)
    await conn.execute("BEGIN")
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"{namespace}:cap:{key}"
    )
    return conn


async def timed_claim(store: JobStore, req: ClaimRequest) -> tuple[ClaimResult | Capped, float]:
    began = time.perf_counter()
    result = await asyncio.wait_for(claim_capped(store.caps, req), timeout=5)
    return result, time.perf_counter() - began


@pytest.mark.parametrize(
    ("key", "tenant_cap", "type_cap", "expected"),
    [
        ("tenant:locked", 5, None, Capped("tenant", busy=True)),
        ("type:echo", None, 5, Capped("type", busy=True)),
        ("type:echo", 5, 5, Capped("type", busy=True)),  # the tenant's was free: then the type's
    ],
)
async def test_a_claim_whose_scope_lock_is_held_answers_busy_at_once(
    client: Client,
    settings: Settings,
    key: str,
    tenant_cap: int | None,
    type_cap: int | None,
    expected: Capped,
) -> None:
    """Another worker's capped claim holds the scope's lock: the claim does not wait for it
    (a pooled connection never queues on a lock), it answers busy and records the job."""
    channel = Topology(settings.namespace).tenant_channel
    store = client.store
    if tenant_cap is not None:
        await store.tenants.set_tenant("locked", max_running=tenant_cap, channel=channel)
    if type_cap is not None:
        await store.tenants.set_job_type("echo", max_running=type_cap, channel=channel)
    holder = await hold_advisory_lock(settings.namespace, key)
    try:
        req = request("locked")
        result, seconds = await timed_claim(store, req)
        assert result == expected
        assert seconds < 1.0
        assert (await store.jobs.get_job(req.id)).status == "queued"  # recorded, waiting
    finally:
        await holder.close()
    # the lock gone, the same delivery's claim goes through
    result, _ = await timed_claim(store, req)
    assert isinstance(result, ClaimResult) and result.claimed and result.attempt == 1


async def test_an_uncapped_scope_takes_no_lock(client: Client, settings: Settings) -> None:
    """Only capped scopes are locked: a tenant-capped job does not wait for, nor get "busy"
    from, another tenant's claim that holds its (uncapped) type's lock."""
    channel = Topology(settings.namespace).tenant_channel
    await client.store.tenants.set_tenant("locked", max_running=5, channel=channel)
    holder = await hold_advisory_lock(settings.namespace, "type:echo")
    try:
        result, seconds = await timed_claim(client.store, request("locked"))
        assert isinstance(result, ClaimResult) and result.claimed and seconds < 1.0
    finally:
        await holder.close()


async def test_concurrent_claims_from_two_stores_never_pass_the_cap(
    client: Client, settings: Settings
) -> None:
    """Two workers' stores race for 3 places with 40 claims: exactly 3 are claimed, however
    the try-locks interleave; the others are told the cap is full or busy."""
    channel = Topology(settings.namespace).tenant_channel
    await client.store.tenants.set_tenant("racing", max_running=3, channel=channel)
    async with JobStore.open(DATABASE_URL, settings.namespace, pool_size=10) as other:
        stores = [client.store, other]
        requests = [request("racing") for _ in range(40)]
        results = await asyncio.gather(
            *(claim_capped(stores[i % 2].caps, r) for i, r in enumerate(requests))
        )
        waits = {r for r in results if isinstance(r, Capped)}
        assert waits <= {Capped("tenant"), Capped("tenant", busy=True)}
        assert all(isinstance(r, Capped) or r.claimed for r in results)
        # whatever was busy tries again, one at a time, until every claim had its answer
        for _ in range(3):
            for i, r in enumerate(requests):
                if results[i] == Capped("tenant", busy=True):
                    results[i] = await claim_capped(stores[i % 2].caps, r)
        assert sum(isinstance(r, ClaimResult) and r.claimed for r in results) == 3
        conn = await asyncpg.connect(DATABASE_URL)
        try:
            running = await conn.fetchval(
                f"SELECT count(*) FROM {settings.namespace}.jobs "
                "WHERE tenant = 'racing' AND status = 'running'"
            )
        finally:
            await conn.close()
        assert running == 3


# --- waiting workers: woken by the fleet, one claim at a time, in order ----------------


@pytest.mark.parametrize("kind", ["tenant", "type"])
async def test_a_place_freed_on_one_worker_wakes_the_other_at_once(
    start_worker: WorkerFactory, client: Client, settings: Settings, kind: str
) -> None:
    """Cap 1, two workers on different lanes: the job waiting on worker 2 starts right after
    worker 1's job ends (its completion's NOTIFY), not after worker 2's re-check backoff.

    The backoff is made 5 s here so that only the NOTIFY can wake worker 2 in time."""
    channel = Topology(settings.namespace).tenant_channel
    if kind == "tenant":
        await client.store.tenants.set_tenant("capped", max_running=1, channel=channel)
        tenants, job_type = ("capped", "capped"), "timed_sleep"
        scope = ("tenant", "capped")
    else:
        await client.store.tenants.set_job_type("transcode", max_running=1, channel=channel)
        tenants, job_type = ("t1", "t2"), "transcode"
        scope = ("type", "transcode")
    await start_worker(worker_id="w1", queues=["default"])
    w2 = await start_worker(worker_id="w2", queues=["lane2"])
    w2.caps.retry_first = w2.caps.retry_max = 5.0
    first = await client.submit(job_type, {"seconds": 1.5}, tenant=tenants[0])

    async def running() -> bool:
        return (await client.get(first.id)).status == "running"

    await wait_until(running, timeout=10)
    second = await client.submit(job_type, {"seconds": 0.01}, tenant=tenants[1], queue="lane2")
    await wait_until(lambda: asyncio.sleep(0, full_here(w2, scope)), timeout=10)
    done = await results(client, [first.id, second.id], timeout=20)
    delay = done[1]["start"] - done[0]["end"]
    assert 0 <= delay < 0.3, f"worker 2 started {delay:.3f} s after the place freed"


@pytest.mark.parametrize("kind", ["tenant", "type"])
async def test_waiting_deliveries_run_by_priority_then_age_one_at_a_time(
    start_worker: WorkerFactory, client: Client, settings: Settings, kind: str
) -> None:
    """Deliveries held behind a full cap start in the scheduler's order (priority first,
    then oldest) when places free, whether the cap is the tenant's or the type's."""
    channel = Topology(settings.namespace).tenant_channel
    if kind == "tenant":
        await client.store.tenants.set_tenant("ordered", max_running=1, channel=channel)
        job_type = "timed_sleep"
    else:
        await client.store.tenants.set_job_type("transcode", max_running=1, channel=channel)
        job_type = "transcode"
    worker = await start_worker()
    first = await client.submit(job_type, {"seconds": 1.0}, tenant="ordered")

    async def running() -> bool:
        return (await client.get(first.id)).status == "running"

    await wait_until(running, timeout=10)
    # the type's waiters come from two tenants: the order holds across them too
    tenant_of = {0: "ordered", 1: "ordered", 5: "other", 9: "ordered"} if kind == "type" else {}
    waiting = []
    for priority in (0, 5, 1, 9):
        tenant = tenant_of.get(priority, "ordered")
        job = await client.submit(job_type, {"seconds": 0.05}, tenant=tenant, priority=priority)
        waiting.append((priority, job.id))

    async def all_held() -> bool:
        caps = worker.caps._scopes.values()
        held = sum(len(cap.held or ()) for cap in caps)
        return len(worker.scheduler) + held >= 4 - sum(cap.claiming for cap in caps)

    await wait_until(all_held, timeout=10)
    done = await results(client, [job_id for _, job_id in waiting], timeout=30)
    starts = sorted((r["start"], priority) for r, (priority, _) in zip(done, waiting, strict=True))
    assert [priority for _, priority in starts] == [9, 5, 1, 0]
    spans = sorted((r["start"], r["end"]) for r in done)
    assert max_overlap(spans) == 1


async def test_a_place_freed_without_a_notify_is_found_by_the_safety_timer(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """A place that frees with no NOTIFY (a dead worker's job moved by hand here, like the
    reaper does) is still found: the waiting worker re-checks a full cap every 0.5 s."""
    channel = Topology(settings.namespace).tenant_channel
    await client.store.tenants.set_tenant("capped", max_running=1, channel=channel)
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        jobs = f"{settings.namespace}.jobs"
        await conn.execute(
            f"INSERT INTO {jobs} (id, type, queue, tenant, max_attempts, status, attempt, "
            "lease_expires_at, worker_id) VALUES ('ghost', 'timed_sleep', 'default', 'capped', "
            "3, 'running', 1, now() + interval '1 hour', 'gone')"
        )
        worker = await start_worker()
        waiting = await client.submit("timed_sleep", {"seconds": 0.01}, tenant="capped")
        await wait_until(lambda: asyncio.sleep(0, full_here(worker, ("tenant", "capped"))))
        await asyncio.sleep(1.2)  # a few safety re-checks find it still full
        assert (await client.get(waiting.id)).status == "queued"
        freed = time.time()
        await conn.execute(f"UPDATE {jobs} SET status = 'succeeded' WHERE id = 'ghost'")
    finally:
        await conn.close()
    (done,) = await results(client, [waiting.id], timeout=10)
    assert done["start"] - freed < 1.5


async def test_the_reaper_notifies_the_capped_scopes_it_frees(
    client: Client, settings: Settings
) -> None:
    """A dead worker's expired job of a capped tenant and type, moved on by the reaper, frees
    a place: the fleet hears it on ``<ns>.caps`` at once, not at its next re-check. An
    uncapped tenant's reaped job sends nothing."""
    channel = Topology(settings.namespace).tenant_channel
    await client.store.tenants.set_tenant("capped", max_running=1, channel=channel)
    await client.store.tenants.set_job_type("timed_sleep", max_running=2, channel=channel)
    jobs = f"{settings.namespace}.jobs"
    heard: asyncio.Queue[str] = asyncio.Queue()
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        for job_id, job_type, tenant in [
            ("ghost-capped", "echo", "capped"),
            ("ghost-free", "echo", "free"),
            ("ghost-type", "timed_sleep", "free"),
        ]:
            await conn.execute(
                f"INSERT INTO {jobs} (id, type, queue, tenant, max_attempts, status, attempt, "
                "lease_expires_at, worker_id) VALUES ($1, $2, 'default', $3, 3, 'running', 1, "
                "now() - interval '1 second', 'gone')",
                job_id,
                job_type,
                tenant,
            )
        async with client.store.listen(client.store.caps.cap_channel(), heard.put_nowait):
            reaped = await client.store.leases.reap_expired()
            ids = sorted(row["id"] for row in reaped)
            assert ids == ["ghost-capped", "ghost-free", "ghost-type"]
            payloads = {await asyncio.wait_for(heard.get(), timeout=5) for _ in range(2)}
            await asyncio.sleep(0.3)  # nothing else follows
            assert heard.empty()
    finally:
        await conn.close()
    assert payloads == {"tenant:capped", "type:timed_sleep"}
