"""Fleet-wide caps: ``max_running`` per tenant and per job type, across workers.

The overlap is measured from the jobs' own start and end times, which lie
inside each job's ``running`` interval in PostgreSQL, so more overlap than
the cap means the cap was broken.
"""

from __future__ import annotations

import asyncio
from typing import Any

from coldbrew.client import Client
from coldbrew.settings import Settings
from coldbrew.topology import Topology
from tests.conftest import WorkerFactory, wait_until


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


def test_max_overlap_counts_open_intervals() -> None:
    assert max_overlap([(0, 2), (1, 3), (2, 4)]) == 2
    assert max_overlap([(0, 1), (1, 2)]) == 1
    assert max_overlap([(0, 10), (1, 2), (1, 3), (2.5, 4)]) == 3


async def test_tenant_cap_holds_across_two_workers_and_others_run(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """At most 2 of tenant "capped"'s jobs run at once fleet-wide; tenant "free" is not slowed."""
    channel = Topology(settings.namespace).tenant_channel
    await client.store.set_tenant("capped", max_running=2, channel=channel)
    workers = [await start_worker(worker_id="w1"), await start_worker(worker_id="w2")]
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
    await client.store.set_job_type("transcode", max_running=1, channel=channel)
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
    await client.store.set_tenant("frozen", max_running=0, channel=channel)
    worker = await start_worker(concurrency=1)
    held = await client.submit("echo", {"value": 1}, tenant="frozen")

    async def parked() -> bool:
        return ("tenant", "frozen") in worker._parked

    await wait_until(parked, timeout=10)
    assert (await client.get(held.id)).status == "queued"
    # the only slot is free for another tenant meanwhile
    other = await client.submit("echo", {"value": 2}, tenant="warm")
    assert (await client.wait(other.id, timeout=10)).status == "succeeded"
    assert (await client.get(held.id)).status == "queued"
    await client.store.set_tenant("frozen", uncap=True, channel=channel)
    final = await client.wait(held.id, timeout=10)
    assert final.status == "succeeded" and final.attempt == 1


async def test_deliveries_held_too_long_are_handed_back_not_lost(
    start_worker: WorkerFactory, client: Client, settings: Settings
) -> None:
    """A paused tenant's delivery held past the consumer_timeout margin goes back to
    RabbitMQ (and comes back to be held again); on resume the job runs once."""
    channel = Topology(settings.namespace).tenant_channel
    await client.store.set_tenant("waiting", paused=True, channel=channel)
    worker = await start_worker(
        broker_consumer_timeout_seconds=3.0, heartbeat_seconds=0.5, lease_seconds=5.0
    )
    assert worker.hold_limit == 1.5
    job = await client.submit("echo", {"value": 1}, tenant="waiting")

    async def requeued_twice() -> bool:
        value = worker.metrics.registry.get_sample_value("coldbrew_held_requeued_total")
        return (value or 0) >= 2

    await wait_until(requeued_twice, timeout=15)
    assert (await client.get(job.id)).status == "queued"
    await client.store.set_tenant("waiting", paused=False, channel=channel)
    final = await client.wait(job.id, timeout=10)
    assert final.status == "succeeded" and final.attempt == 1
