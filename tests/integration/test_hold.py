"""Hold only what will start soon: long jobs are not hoarded by the first worker up.

Issue #19's case, with the job length scaled down: two workers of
``COLDBREW_CONCURRENCY=2``, eight jobs published while only worker A runs,
worker B started 2 s later. A worker that held every delivery its prefetch
allows ran 5-6 of the eight and left B idle (three rounds: 90 s for 30 s jobs).
Holding no more than will start soon leaves the rest in the queue for B: two
rounds of two plus the start gap.
"""

from __future__ import annotations

import asyncio
import time

from coldbrew.client import Client
from tests.helpers import WorkerFactory

JOB_SECONDS = 4.0
START_GAP = 2.0
JOBS = 8
CONCURRENCY = 2


async def test_long_jobs_spread_over_a_worker_started_later(
    start_worker: WorkerFactory, client: Client
) -> None:
    """Eight 4 s jobs on two workers of two slots finish in about two rounds, not three."""
    await start_worker(worker_id="a", concurrency=CONCURRENCY)
    began = time.time()
    ids = [(await client.submit("timed_sleep", {"seconds": JOB_SECONDS})).id for _ in range(JOBS)]
    await asyncio.sleep(START_GAP)
    await start_worker(worker_id="b", concurrency=CONCURRENCY)
    b_ready = time.time() - began
    finals = await asyncio.gather(*(client.wait(job_id, timeout=60) for job_id in ids))
    assert [f.status for f in finals] == ["succeeded"] * JOBS
    makespan = max(float(f.result["end"]) for f in finals) - began
    # ideal: B's start gap plus two rounds (30 s jobs: ~62 s, the bound 65 s);
    # a hoarding worker needs a third round (3 x 4 = 12 s)
    # (B's start-up counted: the ideal begins when B can consume)
    ideal = b_ready + 2 * JOB_SECONDS
    assert makespan < ideal + 1.0, f"makespan {makespan:.1f}s, ideal {ideal:.1f}s"
