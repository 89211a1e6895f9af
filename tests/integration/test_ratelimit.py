"""Fleet-wide rate limits: per tenant, per job type, per key of a job's arguments.

Rates are checked from the rows' ``started_at`` (the claim's transaction time,
the very time GCRA judged), so a count above the bound means the limit broke.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika
import asyncpg
import pytest

from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.settings import Settings
from coldbrew.topology import Topology
from coldbrew.worker import Worker
from coldbrew.worker.lifecycle import Phase
from tests.helpers import DATABASE_URL, WorkerFactory, metric, wait_until


@pytest.fixture
def rl_app() -> Any:
    return load_app("tests.ratelimit_apps:app")


@pytest.fixture
async def rl_client(settings: Settings, rl_app: Any) -> Any:
    async with Client.connect(settings, app=rl_app) as connected:
        yield connected


async def started_at(namespace: str, ids: list[str]) -> list[float]:
    """The jobs' ``started_at`` (epoch seconds), sorted."""
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        rows = await conn.fetch(
            f'SELECT extract(epoch FROM started_at)::float8 AS t FROM "{namespace}".jobs'
            " WHERE id = ANY($1::text[])",
            ids,
        )
    finally:
        await conn.close()
    assert len(rows) == len(ids) and all(r["t"] is not None for r in rows)
    return sorted(r["t"] for r in rows)


def most_in_a_window(starts: list[float], window: float) -> int:
    """The most starts in any half-open window ``[t, t + window)``."""
    return max(sum(1 for s in starts[i:] if s < t + window) for i, t in enumerate(starts))


async def submit_all(
    client: Client, job_type: str, args: dict[str, Any], tenant: str, count: int
) -> list[str]:
    jobs = await asyncio.gather(
        *(client.submit(job_type, args, tenant=tenant) for _ in range(count))
    )
    return [job.id for job in jobs]


async def finish(client: Client, ids: list[str], timeout: float = 30) -> None:
    finals = await asyncio.gather(*(client.wait(i, timeout=timeout) for i in ids))
    assert {f.status for f in finals} == {"succeeded"}


async def both_consume(workers: list[Worker], queue: str) -> None:
    async def consuming() -> bool:
        return all(queue in w.parts.broker.consumers for w in workers)

    await wait_until(consuming)


def test_most_in_a_window_counts_half_open_windows() -> None:
    assert most_in_a_window([0, 0.5, 1.0, 1.2], 1.0) == 3
    assert most_in_a_window([0, 1, 2], 1.0) == 1


# exclusive: it measures a rate over two workers in wall time; beside other test processes
# the measured span drifted (failed once in the parallel phase, passes alone)
@pytest.mark.exclusive
async def test_tenant_rate_holds_across_two_workers_without_holding_slots(
    start_worker: WorkerFactory, rl_client: Client, settings: Settings, rl_app: Any
) -> None:
    """20/s burst 2 over two workers: ~20 starts a second, never more than 22 in any second,
    while a free tenant's jobs run at full speed beside the 60-job limited backlog."""
    channel = Topology(settings.namespace).tenant_channel
    await rl_client.store.tenants.set_tenant_rate(
        "limited", per_second=20, burst=2, clear=False, channel=channel
    )
    workers = [
        await start_worker(app=rl_app, worker_id="w1", concurrency=6),
        await start_worker(app=rl_app, worker_id="w2", concurrency=6),
    ]
    # provision both tenants' queues and let both workers consume them first
    await finish(rl_client, [(await rl_client.submit("quick", {}, tenant="free")).id])
    first = (await rl_client.submit("quick", {}, tenant="limited")).id
    await finish(rl_client, [first])
    topo = Topology(settings.namespace)
    for tenant in ("limited", "free"):
        await both_consume(workers, topo.job_queue("default", tenant))
    await asyncio.sleep(0.2)  # the first limited job's token is back

    # submitted at once: one by one, the submissions (not the limit) could set the pace
    limited = await submit_all(rl_client, "quick", {}, "limited", 60)
    began = time.monotonic()
    free = await submit_all(rl_client, "nap", {"seconds": 0.05}, "free", 40)
    await finish(rl_client, free)
    free_took = time.monotonic() - began
    await finish(rl_client, limited)

    starts = await started_at(settings.namespace, limited)
    rate = (len(starts) - 1) / (starts[-1] - starts[0])
    # within 15% below (a busy machine delays claims; slots are shared with "free") and
    # never above what the bucket allows
    assert 17 <= rate <= 21, rate
    # GCRA's bound for a 1 s window: floor((1 + tau) / T) + 1 = 22 (T = 0.05, tau = 0.05)
    assert most_in_a_window(starts, 1.0) <= 22
    # 40 naps of 0.05 s on 12 slots take ~0.2 s; behind the limited backlog they'd take 3 s
    assert free_took < 1.5, free_took
    refused = sum(metric(w, "coldbrew_rate_limited_total", scope="tenant") for w in workers)
    assert refused > 0  # the two workers raced for tokens: the fleet-wide path ran


# exclusive: the refusals counted depend on claim latency; beside other test processes
# the two workers' claims slow down and race differently
@pytest.mark.exclusive
async def test_two_workers_racing_for_tokens_are_refused_about_once_per_start(
    start_worker: WorkerFactory, rl_client: Client, settings: Settings, rl_app: Any
) -> None:
    """50/s burst 5 over two workers with a backlog: each refused claim held a job slot,
    and four claims per worker sent at each due token made ~4 refusals per start
    (bench/ratelimit.py). A contested bucket sends one claim per interval and refuses a
    lost race without a claim or a lock wait: about one refusal per start, at most, and
    the rate still held (one claim at a time had bound it by the round trips)."""
    channel = Topology(settings.namespace).tenant_channel
    await rl_client.store.tenants.set_tenant_rate(
        "limited", per_second=50, burst=5, clear=False, channel=channel
    )
    workers = [
        await start_worker(app=rl_app, worker_id="w1", concurrency=8),
        await start_worker(app=rl_app, worker_id="w2", concurrency=8),
    ]
    first = (await rl_client.submit("quick", {}, tenant="limited")).id
    await finish(rl_client, [first])
    await both_consume(workers, Topology(settings.namespace).job_queue("default", "limited"))
    await asyncio.sleep(0.2)

    limited = await submit_all(rl_client, "quick", {}, "limited", 150)
    await finish(rl_client, limited)
    starts = await started_at(settings.namespace, limited)
    refused = sum(metric(w, "coldbrew_rate_limited_total", scope="tenant") for w in workers)
    ran = [metric(w, "coldbrew_jobs_started_total", queue="default", type="quick") for w in workers]
    assert min(ran) > 10, ran  # both workers took tokens: they raced for them
    rate = (len(starts) - 1) / (starts[-1] - starts[0])
    assert most_in_a_window(starts, 1.0) <= 55
    # at the rate: fewer refusals must not mean fewer claims than tokens. The burst lets 5
    # start ahead of the rate, so n starts may span (n - 1 - 5) / 50 s: at most 50 x 149/144
    # = 51.7/s over 150 (51.3 seen in CI), never more
    assert 45 <= rate <= 50 * (len(starts) - 1) / (len(starts) - 1 - 5), rate
    assert refused <= 1.5 * len(limited), refused


async def test_type_rate_applies_to_every_tenant(
    start_worker: WorkerFactory, rl_client: Client, settings: Settings, rl_app: Any
) -> None:
    """``types set nap --rate 10/s --burst 1``: ten starts a second over all tenants."""
    channel = Topology(settings.namespace).tenant_channel
    await rl_client.store.tenants.set_job_type_rate(
        "nap", per_second=10, burst=1, clear=False, channel=channel
    )
    await start_worker(app=rl_app, concurrency=8)
    ids = [
        i for t in range(3) for i in await submit_all(rl_client, "nap", {"seconds": 0}, f"t{t}", 4)
    ]
    await finish(rl_client, ids)
    starts = await started_at(settings.namespace, ids)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= 0.1 - 0.002, gaps  # burst 1: one start per interval, never closer
    # not slower than half the rate: a burst of 1 has no slack for a late claim on a busy
    # machine, but a stall (a lost wake) would take far longer
    assert starts[-1] - starts[0] < 11 * 0.1 * 2


async def test_per_key_limits_are_independent(
    start_worker: WorkerFactory, rl_client: Client, settings: Settings, rl_app: Any
) -> None:
    """``fetch`` is limited to 4/s per domain: two domains run side by side, each at 4/s."""
    await start_worker(app=rl_app, concurrency=4)
    by_domain = {d: [] for d in ("a.example", "b.example")}  # type: dict[str, list[str]]
    for _ in range(5):
        for domain, ids in by_domain.items():
            ids.append((await rl_client.submit("fetch", {"domain": domain})).id)
    await finish(rl_client, [i for ids in by_domain.values() for i in ids])
    firsts = []
    for ids in by_domain.values():
        starts = await started_at(settings.namespace, ids)
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        assert min(gaps) >= 0.25 - 0.002, gaps
        # one bucket for both would spread each domain's five over ~8 intervals (2 s)
        assert starts[-1] - starts[0] < 4 * 0.25 * 1.6  # not slowed by the other domain
        firsts.append(starts[0])
    assert abs(firsts[0] - firsts[1]) < 0.2  # b's first did not wait behind a's bucket


async def test_several_limits_and_a_cap_apply_together(
    start_worker: WorkerFactory, rl_client: Client, settings: Settings, rl_app: Any
) -> None:
    """A tenant's 8/s and fetch's 4/s per domain both hold (all buckets or none); a tenant
    with a cap and a rate keeps both (the tokens are taken under the cap's locks)."""
    channel = Topology(settings.namespace).tenant_channel
    await rl_client.store.tenants.set_tenant_rate(
        "multi", per_second=8, burst=1, clear=False, channel=channel
    )
    await rl_client.store.tenants.set_tenant("both", max_running=1, channel=channel)
    await rl_client.store.tenants.set_tenant_rate(
        "both", per_second=10, burst=1, clear=False, channel=channel
    )
    await start_worker(app=rl_app, concurrency=8)
    by_domain: dict[str, list[str]] = {"a": [], "b": []}
    for domain, ids in by_domain.items():
        jobs = await asyncio.gather(
            *(rl_client.submit("fetch", {"domain": domain}, tenant="multi") for _ in range(4))
        )
        ids.extend(job.id for job in jobs)
    both = await submit_all(rl_client, "nap", {"seconds": 0.02}, "both", 6)
    await finish(rl_client, [*by_domain["a"], *by_domain["b"], *both])
    every = await started_at(settings.namespace, [*by_domain["a"], *by_domain["b"]])
    assert min(b - a for a, b in zip(every, every[1:], strict=False)) >= 0.125 - 0.002
    for ids in by_domain.values():
        starts = await started_at(settings.namespace, ids)
        assert min(b - a for a, b in zip(starts, starts[1:], strict=False)) >= 0.25 - 0.002
    starts = await started_at(settings.namespace, both)
    assert min(b - a for a, b in zip(starts, starts[1:], strict=False)) >= 0.1 - 0.002


async def test_drain_requeues_held_limited_deliveries(
    start_worker: WorkerFactory,
    rl_client: Client,
    settings: Settings,
    rl_app: Any,
    amqp: aio_pika.abc.AbstractChannel,
) -> None:
    """Deliveries waiting for a token (a tenant's, a key's) go back on SIGTERM; their jobs
    stay queued and nothing is lost."""
    channel = Topology(settings.namespace).tenant_channel
    await rl_client.store.tenants.set_tenant_rate(
        "slow", per_second=1 / 3600, burst=1, clear=False, channel=channel
    )
    worker = await start_worker(app=rl_app)
    slow = [(await rl_client.submit("quick", {}, tenant="slow")).id for _ in range(3)]
    crawls = [
        (await rl_client.submit("crawl", {"url": f"https://h.example/{i}"})).id for i in range(2)
    ]

    async def held() -> bool:
        statuses = sorted([(await rl_client.get(i)).status.value for i in slow + crawls])
        done = statuses == ["queued"] * 3 + ["succeeded"] * 2
        return done and metric(worker, "coldbrew_rate_waiting") == 3

    await wait_until(held)
    worker.stop()
    await wait_until(lambda: _stopped(worker))
    topo = Topology(settings.namespace)
    ready = {}
    for tenant in ("slow", "default"):
        queue = await amqp.declare_queue(topo.job_queue("default", tenant), passive=True)
        ready[tenant] = queue.declaration_result.message_count
    assert ready == {"slow": 2, "default": 1}


async def _stopped(worker: Worker) -> bool:
    return worker.lifecycle.phase is Phase.STOPPED
