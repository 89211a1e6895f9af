"""Probe: do a worker's pool children idle while jobs wait for them, and how many commits?

Not a benchmark (it asserts nothing and times nothing against a peer): a
light, lock-free look at the worker's pool path with *sleeping* pool jobs
(``tests.apps:cpu_sleep``, 20 ms), so the machine's load barely matters and
it can run beside other engineers' benchmarks. 600 jobs are submitted, then
an in-process worker (``COLDBREW_PROCESSES=2``, ``COLDBREW_CONCURRENCY=100``,
``COLDBREW_POOL_LINGER_SECONDS`` from ``$PROBE_LINGER``, 0.05) drains them
while a sampler reads, every 3 ms, how many children run a job and how many
``run()`` calls wait for one. Printed: the busy-children histogram of the
middle 80% of the samples (a child idle while jobs wait is lost time), the
span from the first ``started_at`` to the last ``finished_at`` (ideal:
600 x 20 ms / 2 = 6.0 s), and the claim and completion batches (items /
batches: each batch is one commit) and how the async claims' acks were made
durable (``barrier`` items cost a commit of their own)::

    python -m pytest -q -s -p tests.conftest -p no:cacheprovider bench/pool_handoff_probe.py

(bench/README.md, "`bench/procpool.py`", 4 Dec 2026.)
"""

from __future__ import annotations

import asyncio
import collections
import os

import asyncpg
from tests.helpers import DATABASE_URL, WorkerFactory

from coldbrew.client import Client

JOBS = 600
JOB_SECONDS = 0.02
SAMPLE_SECONDS = 0.003


async def test_pool_handoff_probe(start_worker: WorkerFactory, client: Client) -> None:
    linger = float(os.environ.get("PROBE_LINGER", "0.05"))
    jobs = [client.submit("cpu_sleep", {"seconds": JOB_SECONDS}) for _ in range(JOBS)]
    await asyncio.gather(*jobs)
    worker = await start_worker(processes=2, concurrency=100, pool_linger_seconds=linger)
    pool = worker.parts.runner.pool
    assert pool is not None
    samples: list[tuple[int, int]] = []

    async def sample() -> None:
        while True:
            samples.append((pool.busy, pool.waiting))
            await asyncio.sleep(SAMPLE_SECONDS)

    sampler = asyncio.create_task(sample())
    table = f"{worker.settings.namespace}.jobs"
    db = await asyncpg.connect(DATABASE_URL)
    try:
        done = f"SELECT count(*) FROM {table} WHERE status = 'succeeded'"
        while await db.fetchval(done) < JOBS:  # noqa: ASYNC110 - polling the table
            await asyncio.sleep(0.5)
        sampler.cancel()
        span = await db.fetchval(
            f"SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM {table}"
        )
    finally:
        sampler.cancel()
        await db.close()
    middle = samples[len(samples) // 10 : -len(samples) // 10]
    busy = collections.Counter(b for b, _ in middle)
    waiting = [w for _, w in middle]
    claims = worker.parts.store.claims
    acks = {
        sample.labels["how"]: int(sample.value)
        for metric in worker.parts.runner.metrics.claim_acks.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }
    print(
        f"\nlinger {linger}: busy children {dict(busy)} with {min(waiting)}-{max(waiting)} "
        f"jobs waiting; span {span:.2f} s (ideal {JOBS * JOB_SECONDS / 2:.1f}); claims "
        f"{claims.claim_batches.items}/{claims.claim_batches.batches} batches, completions "
        f"{claims.completion_batches.items}/{claims.completion_batches.batches}; "
        f"claim acks {acks}"
    )
