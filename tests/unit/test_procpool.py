"""Tests of the process pool: results, context RPCs, timeouts, crashes, cancel, shutdown."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop

from coldbrew.errors import (
    ConfigurationError,
    JobCancelled,
    JobTimeout,
    Permanent,
    Retry,
    StaleWrite,
    WorkerCrashed,
)
from coldbrew.procpool import PoolClosed, ProcessPool, RemoteJobError

# The process-pool tests spawn child interpreters (CPU-heavy) and bound how soon a death
# is noticed: make test runs them one after another on one xdist worker, not against
# each other (tests/README.md).
pytestmark = pytest.mark.xdist_group("procpool")

APP_REF = "tests.unit.procpool_jobs:app"


class RecordingHost:
    """A ContextHost that records calls; refuses the checkpoint state ``"refuse me"``."""

    def __init__(self) -> None:
        self.progress_calls: list[tuple[float | None, str | None]] = []
        self.checkpoints: list[Any] = []
        self.claimed: set[str] = set()

    def progress(self, fraction: float | None, message: str | None) -> None:
        self.progress_calls.append((fraction, message))

    async def checkpoint(self, state: Any) -> None:
        await asyncio.sleep(0)
        if state == "refuse me":
            raise StaleWrite("lease lost")
        self.checkpoints.append(state)

    async def once(self, name: str) -> bool:
        first = name not in self.claimed
        self.claimed.add(name)
        return first


def job_info(job_id: str = "job-1", job_type: str = "add", **overrides: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "job_id": job_id,
        "type": job_type,
        "attempt": 1,
        "tenant": "acme",
        "queue": "default",
        "max_attempts": 5,
        "checkpoint": None,
    }
    info.update(overrides)
    return info


async def run(
    pool: ProcessPool,
    job_type: str,
    args: dict[str, Any] | None = None,
    *,
    host: RecordingHost | None = None,
    job_id: str = "job-1",
    job_timeout: float | None = 20.0,
) -> Any:
    return await pool.run(
        job_type,
        args or {},
        job_info(job_id, job_type),
        host or RecordingHost(),
        timeout=job_timeout,
    )


async def eventually(condition: Callable[[], bool], limit: float = 10.0) -> None:
    """Poll ``condition`` until it holds, failing after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


async def reported_pid(host: RecordingHost) -> int:
    """The pid a ``wait_for_file`` job reports as its first progress message."""
    await eventually(lambda: bool(host.progress_calls))
    message = host.progress_calls[0][1]
    assert message is not None
    return int(message)


def assert_reaped(pid: int) -> None:
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


@pytest.fixture
async def pool() -> AsyncIterator[ProcessPool]:
    async with ProcessPool(2, APP_REF) as started:
        yield started


async def test_result_round_trips(pool: ProcessPool) -> None:
    """A plain function's return value comes back from the child."""
    assert await run(pool, "add", {"a": 2, "b": 3}) == 5


async def test_kwargs_and_info_reach_the_job(pool: ProcessPool) -> None:
    """Keyword arguments are passed and the info dict shows up as context attributes."""
    info = job_info("job-7", "describe", attempt=2, checkpoint={"page": 4})
    result = await pool.run("describe", {"x": [1, 2], "y": "z"}, info, RecordingHost(), timeout=20)
    assert result["kwargs"] == {"x": [1, 2], "y": "z"}
    assert result["ctx"] == {
        "job_id": "job-7",
        "type": "describe",
        "attempt": 2,
        "tenant": "acme",
        "queue": "default",
        "max_attempts": 5,
        "checkpoint_state": {"page": 4},
    }


async def test_progress_reaches_host_in_order(pool: ProcessPool) -> None:
    """Every progress notification reaches the host, in the order it was sent."""
    host = RecordingHost()
    assert await run(pool, "report_progress", {"steps": 50}, host=host) == "done"
    assert host.progress_calls == [(step / 50, f"step {step}") for step in range(1, 51)]


async def test_once_round_trips(pool: ProcessPool) -> None:
    """``ctx.once`` asks the host and returns its answer to the job."""
    host = RecordingHost()
    assert await run(pool, "use_once", {"name": "email"}, host=host) == [True, False, True]
    assert host.claimed == {"email", "email-other"}


async def test_checkpoint_round_trips_and_host_errors_reach_the_child(pool: ProcessPool) -> None:
    """A stored checkpoint updates the context; a host exception is raised in the job."""
    host = RecordingHost()
    result = await run(pool, "use_checkpoint", {"state": {"offset": 10}}, host=host)
    assert result == {"saved": {"offset": 10}, "refused": "StaleWrite: lease lost"}
    assert host.checkpoints == [{"offset": 10}]


async def test_large_frames_round_trip(pool: ProcessPool) -> None:
    """Arguments and results far larger than a socket buffer pass intact both ways."""
    payload = os.urandom(8 * 1024 * 1024)
    results = await asyncio.gather(*(run(pool, "echo", {"payload": payload}) for _ in range(3)))
    assert all(result == payload for result in results)


async def test_children_ignore_sigint_and_sigterm(pool: ProcessPool) -> None:
    """SIGINT and SIGTERM to a child do nothing: the parent owns shutdown."""
    before = sorted(pool.pids)
    for pid in before:
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGINT)
    results = await asyncio.gather(*(run(pool, "add", {"a": n, "b": 1}) for n in range(10)))
    assert results == [n + 1 for n in range(10)]
    assert sorted(pool.pids) == before


async def test_timeout_kills_and_replaces_the_child(pool: ProcessPool, tmp_path: Path) -> None:
    """A job past its timeout has its child killed and replaced, and the pool keeps working."""
    host = RecordingHost()
    never = {"path": str(tmp_path / "never")}
    started = time.monotonic()
    with pytest.raises(JobTimeout, match=r"after 0\.3 s"):
        await run(pool, "wait_for_file", never, host=host, job_timeout=0.3)
    assert time.monotonic() - started < 5
    victim = await reported_pid(host)
    await eventually(lambda: pool.alive == pool.size and victim not in pool.pids)
    assert_reaped(victim)
    assert await run(pool, "add", {"a": 1, "b": 1}) == 2


async def test_crash_fails_only_its_own_job(pool: ProcessPool, tmp_path: Path) -> None:
    """A child that exits mid-job raises WorkerCrashed while another child's job completes."""
    marker = tmp_path / "go"
    host = RecordingHost()
    survivor = asyncio.create_task(run(pool, "wait_for_file", {"path": str(marker)}, host=host))
    survivor_pid = await reported_pid(host)
    with pytest.raises(WorkerCrashed, match="exited with code 3"):
        await run(pool, "crash", {"code": 3}, job_id="job-2")
    marker.touch()
    assert await survivor == survivor_pid
    await eventually(lambda: pool.alive == pool.size)


async def test_sigkill_from_outside_is_noticed(pool: ProcessPool, tmp_path: Path) -> None:
    """A child killed by someone else fails its job with WorkerCrashed naming SIGKILL."""
    host = RecordingHost()
    job = asyncio.create_task(
        run(pool, "wait_for_file", {"path": str(tmp_path / "never")}, host=host)
    )
    victim = await reported_pid(host)
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerCrashed, match="SIGKILL"):
        await job
    await eventually(lambda: pool.alive == pool.size and victim not in pool.pids)


async def test_idle_child_death_is_noticed_at_once(pool: ProcessPool) -> None:
    """An idle child that dies is replaced without waiting for a job to find out."""
    victim = pool.pids[0]
    os.kill(victim, signal.SIGKILL)
    await eventually(lambda: victim not in pool.pids and pool.alive == pool.size)
    assert await run(pool, "add", {"a": 4, "b": 4}) == 8


async def test_cancel_kills_the_running_job(pool: ProcessPool, tmp_path: Path) -> None:
    """``cancel`` makes the job's run() raise JobCancelled; unknown ids return False."""
    host = RecordingHost()
    job = asyncio.create_task(
        run(pool, "wait_for_file", {"path": str(tmp_path / "never")}, host=host, job_id="c-1")
    )
    victim = await reported_pid(host)
    assert pool.busy == 1
    assert pool.cancel("c-1") is True
    with pytest.raises(JobCancelled):
        await job
    assert pool.cancel("c-1") is False
    assert pool.cancel("nobody") is False
    await eventually(lambda: pool.alive == pool.size and victim not in pool.pids)


async def test_caller_cancellation_stops_the_child(pool: ProcessPool, tmp_path: Path) -> None:
    """Cancelling the task awaiting run() kills the child doing the work."""
    host = RecordingHost()
    job = asyncio.create_task(
        run(pool, "wait_for_file", {"path": str(tmp_path / "never")}, host=host)
    )
    victim = await reported_pid(host)
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    await eventually(lambda: pool.alive == pool.size and victim not in pool.pids)
    assert_reaped(victim)


async def test_job_exceptions_are_mapped(pool: ProcessPool) -> None:
    """Permanent and Retry come back as themselves; anything else as RemoteJobError."""
    with pytest.raises(Permanent, match="bad input"):
        await run(pool, "fail_permanent", {"message": "bad input"})
    with pytest.raises(Retry, match="later") as retry:
        await run(pool, "fail_retry", {"message": "later", "delay": 7.5})
    assert retry.value.delay == 7.5
    with pytest.raises(RemoteJobError) as other:
        await run(pool, "fail_other", {"message": "boom"})
    assert other.value.kind == "builtins.ValueError"
    assert other.value.message == "boom"
    assert "ValueError: boom" in other.value.traceback_text
    assert pool.alive == pool.size


async def test_unpicklable_result_keeps_the_child() -> None:
    """An unpicklable result raises RemoteJobError(UnpicklableResult) and the child lives on."""
    async with ProcessPool(1, APP_REF) as pool:
        before = pool.pids
        with pytest.raises(RemoteJobError) as error:
            await run(pool, "unpicklable")
        assert error.value.kind == "UnpicklableResult"
        assert await run(pool, "pid") == before[0]
        assert pool.pids == before


async def test_waiters_are_served_first_come_first_served(tmp_path: Path) -> None:
    """With every child busy, queued runs get a child in the order they asked."""
    marker = tmp_path / "go"
    async with ProcessPool(1, APP_REF) as pool:
        host = RecordingHost()
        blocker = asyncio.create_task(run(pool, "wait_for_file", {"path": str(marker)}, host=host))
        await reported_pid(host)
        queued = [asyncio.create_task(run(pool, "stamp", {"label": str(n)})) for n in range(5)]
        await asyncio.sleep(0)
        assert (pool.busy, pool.idle) == (1, 0)
        marker.touch()
        await blocker
        stamps = [await task for task in queued]
        assert [label for label, _ in sorted(stamps, key=lambda s: s[1])] == list("01234")


async def test_queue_seconds_is_the_queued_runs_times_the_mean_job_time(tmp_path: Path) -> None:
    """What the worker's linger is bounded by: 0 with an idle child or before any job has
    finished; with every child busy, the queued runs x the mean job time / children."""
    marker = tmp_path / "go"
    async with ProcessPool(1, APP_REF) as pool:
        assert pool.queue_seconds() == 0.0  # idle child
        with pytest.raises(RemoteJobError):  # a job of ~0.2 s (a failure counts too)
            await run(pool, "wait_for_file", {"path": str(tmp_path / "absent"), "limit": 0.2})
        mean = pool.mean_run_seconds
        assert 0.15 < mean < 5
        host = RecordingHost()
        blocker = asyncio.create_task(run(pool, "wait_for_file", {"path": str(marker)}, host=host))
        await reported_pid(host)
        assert pool.queue_seconds() == 0.0  # busy, but nothing queued behind it
        queued = [asyncio.create_task(run(pool, "add", {"a": n, "b": 1})) for n in range(3)]
        await eventually(lambda: pool.waiting == 3)
        assert pool.queue_seconds() == pytest.approx(3 * mean)
        marker.touch()
        await blocker
        assert [await task for task in queued] == [1, 2, 3]
        assert pool.waiting == 0
        assert pool.queue_seconds() == 0.0
        assert pool.mean_run_seconds < mean  # the quick jobs pulled the mean down


async def test_bad_app_ref_fails_start() -> None:
    """A child that cannot import the app makes start() raise ConfigurationError naming it."""
    for ref, detail in [
        ("tests.unit.procpool_jobs:missing", "not a coldbrew App"),
        ("tests.unit.no_such_module:app", "no module named .* searched"),
    ]:
        pool = ProcessPool(2, ref)
        with pytest.raises(ConfigurationError, match=detail) as error:
            await pool.start()
        assert ref in str(error.value)
        assert pool.alive == 0
        assert multiprocessing.active_children() == []
        with pytest.raises(PoolClosed):
            await run(pool, "add", {"a": 1, "b": 2})


async def test_run_before_start_and_after_close_raise_pool_closed() -> None:
    """run() outside start()..close() raises PoolClosed rather than hanging."""
    pool = ProcessPool(1, APP_REF)
    with pytest.raises(PoolClosed, match="not started"):
        await run(pool, "add", {"a": 1, "b": 2})
    await pool.start()
    await pool.close()
    with pytest.raises(PoolClosed, match="closed"):
        await run(pool, "add", {"a": 1, "b": 2})


async def test_close_leaves_no_children(tmp_path: Path) -> None:
    """close() reaps every child: idle ones exit, a busy one is killed after the grace."""
    pool = ProcessPool(2, APP_REF)
    await pool.start()
    pids = pool.pids
    assert len(pids) == 2
    host = RecordingHost()
    stuck = asyncio.create_task(
        run(pool, "wait_for_file", {"path": str(tmp_path / "never")}, host=host)
    )
    await reported_pid(host)
    await pool.close(grace=0.2)
    with pytest.raises(PoolClosed):
        await stuck
    for pid in pids:
        assert_reaped(pid)
    assert multiprocessing.active_children() == []
    assert (pool.alive, pool.busy, pool.idle) == (0, 0, 0)


async def test_close_lets_a_busy_child_finish_within_grace(tmp_path: Path) -> None:
    """A job that finishes during close()'s grace period still returns its result."""
    marker = tmp_path / "go"
    pool = ProcessPool(1, APP_REF)
    await pool.start()
    host = RecordingHost()
    job = asyncio.create_task(run(pool, "wait_for_file", {"path": str(marker)}, host=host))
    pid = await reported_pid(host)
    closing = asyncio.create_task(pool.close(grace=10))
    await eventually(lambda: pool.closed)
    assert pool.busy == 1
    marker.touch()
    assert await job == pid
    await closing
    assert_reaped(pid)


def test_pool_works_on_uvloop(tmp_path: Path) -> None:
    """On uvloop (the worker's loop) results, progress and crash detection all work."""

    async def scenario() -> None:
        async with ProcessPool(2, APP_REF) as pool:
            host = RecordingHost()
            assert await run(pool, "report_progress", {"steps": 3}, host=host) == "done"
            assert [message for _, message in host.progress_calls] == ["step 1", "step 2", "step 3"]
            with pytest.raises(WorkerCrashed, match="exited with code 3"):
                await run(pool, "crash", {"code": 3})
            with pytest.raises(JobTimeout):
                await run(pool, "wait_for_file", {"path": str(tmp_path / "never")}, job_timeout=0.2)
            await eventually(lambda: pool.alive == pool.size)
            assert await run(pool, "use_once", {"name": "n"}) == [True, False, True]

    uvloop.run(scenario())
