"""Process-pool hygiene: the per-child memory limit and recycling after N jobs.

The memory tests really allocate (touched pages, so the resident size grows)
and measure nothing but what the pool does: which job fails, with what, and
which child serves the next job.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import re
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from coldbrew import retry
from coldbrew.errors import ConfigurationError, MemoryLimitExceeded, WorkerCrashed
from coldbrew.metrics import Metrics
from coldbrew.procpool import PoolClosed, ProcessPool
from tests.unit.test_procpool import (
    APP_REF,
    RecordingHost,
    assert_reaped,
    eventually,
    reported_pid,
    run,
)

# One xdist worker runs the process-pool tests one after another (see test_procpool.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("procpool")]

MB = 1024 * 1024


async def settle(pool: ProcessPool) -> None:
    """Soon nothing is left but the pool's live children: the rest are reaped, none is extra."""
    await eventually(lambda: len(multiprocessing.active_children()) == pool.alive == pool.size)


# --- memory limit -----------------------------------------------------------------------------


async def test_job_over_the_limit_is_killed_and_only_it_fails(tmp_path: Path) -> None:
    """600 MB at a 256 MB limit: killed part way, `memory` error, replaced, others unharmed."""
    marker = tmp_path / "go"
    async with ProcessPool(2, APP_REF, max_memory_mb=256) as pool:
        host = RecordingHost()
        survivor = asyncio.create_task(run(pool, "wait_for_file", {"path": str(marker)}, host=host))
        survivor_pid = await reported_pid(host)
        (victim,) = set(pool.pids) - {survivor_pid}

        with pytest.raises(MemoryLimitExceeded) as caught:
            await run(pool, "allocate", {"mb": 600}, job_id="hog-1")

        error = caught.value
        assert error.limit_bytes == 256 * MB
        assert 256 * MB < error.rss_bytes < 600 * MB  # killed before it had it all
        measured = re.search(r"reached (\d+) MB, over the limit of 256 MB", str(error))
        assert measured is not None, str(error)
        assert int(measured[1]) == round(error.rss_bytes / MB)
        assert f"pool child {victim} running job 'allocate' hog-1" in str(error)
        assert isinstance(error, WorkerCrashed)
        outcome = retry.decide(
            retry.RetryPolicy(max_attempts=3, base=1, cap=1, max_wall_seconds=None),
            error,
            attempt=1,
            first_started_at=None,
            now=datetime.now(UTC),
            rand=lambda: 0.5,
        )
        assert (outcome.status, outcome.error_kind) == ("retrying", "memory")
        assert outcome.error_message == str(error)

        await eventually(lambda: pool.alive == pool.size and victim not in pool.pids)
        assert_reaped(victim)
        assert pool.replaced["memory"] == 1
        marker.touch()
        assert await survivor == survivor_pid  # the other child's job never noticed
        result = await run(pool, "allocate", {"mb": 64})
        assert result["pid"] != victim
        assert result["mb"] == 64
        await settle(pool)


async def test_job_under_the_limit_succeeds_in_the_same_child() -> None:
    """A job that stays under the limit returns its result and its child carries on."""
    async with ProcessPool(1, APP_REF, max_memory_mb=256) as pool:
        (pid,) = pool.pids
        assert await run(pool, "allocate", {"mb": 96}) == {"pid": pid, "mb": 96}
        assert await run(pool, "pid") == pid
        assert pool.replaced["memory"] == 0


async def test_child_left_over_the_limit_by_its_job_is_replaced_after_it() -> None:
    """A job that leaves its child over the limit keeps its result; the next job gets a new child.

    The sampling is slowed to a minute, so only the check after the job can see it.
    """
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    async with ProcessPool(1, APP_REF, max_memory_mb=256, memory_poll_seconds=60) as pool:
        metrics.watch_process_pool(pool)
        (pid,) = pool.pids
        assert await run(pool, "allocate", {"mb": 320, "keep": True}) == {"pid": pid, "mb": 320}
        assert pid not in pool.pids  # retired before anyone could be handed it
        fresh = await run(pool, "pid")
        assert fresh != pid
        assert_reaped(pid)
        assert pool.replaced["memory"] == 1
        text = generate_latest(registry).decode()
        assert 'coldbrew_pool_children_replaced_total{reason="memory"} 1.0' in text
        assert 'coldbrew_pool_children_replaced_total{reason="max_jobs"} 0.0' in text
        assert "coldbrew_pool_children 1.0" in text


async def test_idle_child_over_the_limit_is_replaced_without_failing_anything() -> None:
    """Memory a finished job's thread grabs later makes the idle child go, no job fails."""
    async with ProcessPool(1, APP_REF, max_memory_mb=256) as pool:
        pid = await run(pool, "allocate_later", {"mb": 400, "delay": 0.2})
        await eventually(lambda: pool.alive == 1 and pid not in pool.pids)
        assert pool.replaced["memory"] == 1
        assert await run(pool, "add", {"a": 1, "b": 2}) == 3


async def test_app_that_alone_is_over_the_limit_fails_start() -> None:
    """A limit below what a child needs to load the app is a clear configuration error."""
    pool = ProcessPool(1, APP_REF, max_memory_mb=1)
    with pytest.raises(ConfigurationError, match=r"COLDBREW_PROCESS_MAX_MEMORY_MB=1\b"):
        await pool.start()
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize(
    ("kwargs", "detail"),
    [
        ({"max_memory_mb": -1}, "COLDBREW_PROCESS_MAX_MEMORY_MB must be 0"),
        ({"max_jobs": -5}, "COLDBREW_PROCESS_MAX_JOBS must be 0"),
        ({"memory_poll_seconds": 0.0}, "memory_poll_seconds must be > 0"),
    ],
)
def test_bad_limits_are_refused(kwargs: dict[str, float], detail: str) -> None:
    with pytest.raises(ConfigurationError, match=detail):
        ProcessPool(1, APP_REF, **kwargs)  # type: ignore[arg-type]


def test_memory_error_pickles_with_its_sizes() -> None:
    error = MemoryLimitExceeded("over", limit_bytes=5, rss_bytes=7)
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.limit_bytes, copy.rss_bytes) == ("over", 5, 7)


# --- recycling --------------------------------------------------------------------------------


async def test_max_jobs_recycles_each_child_after_n_jobs() -> None:
    """MAX_JOBS=2: every two jobs come from a new process, and every job succeeds."""
    async with ProcessPool(1, APP_REF, max_jobs=2) as pool:
        pids = [await run(pool, "pid", job_id=f"j{n}") for n in range(6)]
        assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4] == pids[5]
        assert len(set(pids)) == 3
        await eventually(lambda: pool.replaced["max_jobs"] == 3)
        for pid in set(pids):
            assert_reaped(pid)
        await settle(pool)


async def test_successor_boots_during_the_last_job_and_waits_for_it(tmp_path: Path) -> None:
    """The replacement is ready before the last job ends, but never runs a job beside it."""
    marker = tmp_path / "go"
    async with ProcessPool(1, APP_REF, max_jobs=2) as pool:
        first = await run(pool, "pid")
        host = RecordingHost()
        last = asyncio.create_task(run(pool, "wait_for_file", {"path": str(marker)}, host=host))
        assert await reported_pid(host) == first
        await eventually(lambda: len(pool.pids) == 1 and pool.pids[0] != first)
        (successor,) = pool.pids
        queued = asyncio.create_task(run(pool, "pid", job_id="queued"))
        await asyncio.sleep(0.3)
        assert not queued.done()  # size 1: one job at a time, even while two processes live
        assert (pool.busy, pool.idle) == (1, 0)
        marker.touch()
        assert await last == first
        assert await queued == successor
        await eventually(lambda: pool.replaced["max_jobs"] == 1)
        assert_reaped(first)


async def test_max_jobs_under_concurrent_load() -> None:
    """Twenty jobs at once on two children with MAX_JOBS=3: no process runs more than three."""
    async with ProcessPool(2, APP_REF, max_jobs=3) as pool:
        pids = await asyncio.gather(*(run(pool, "pid", job_id=f"c{n}") for n in range(20)))
        per_process = Counter(pids)
        assert max(per_process.values()) <= 3
        assert len(per_process) >= 7
        await settle(pool)


async def test_close_while_a_successor_waits(tmp_path: Path) -> None:
    """close() during a last job stops the waiting successor too; nothing is left behind."""
    pool = ProcessPool(1, APP_REF, max_jobs=1)
    await pool.start()
    host = RecordingHost()
    stuck = asyncio.create_task(
        run(pool, "wait_for_file", {"path": str(tmp_path / "never")}, host=host)
    )
    old = await reported_pid(host)
    await eventually(lambda: len(pool.pids) == 1 and pool.pids[0] != old)
    (successor,) = pool.pids
    await pool.close(grace=0.2)
    with pytest.raises(PoolClosed):
        await stuck
    assert_reaped(old)
    assert_reaped(successor)
    assert multiprocessing.active_children() == []
