"""``ProcessPool``: run a job in a free child, with its timeout and cancel; start and close.

This is the pool's face and its hot path. ``run()`` frames the job, takes a
free child from the roster, arms the timeout, and when the outcome is in
hands the child back (or lets the memory watch or recycling retire it).
Booting, reaping and replacing are the keeper's; sampling memory is the
memory watch's; the frames are the child handle's.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
from collections.abc import Callable, Mapping
from multiprocessing.process import BaseProcess
from multiprocessing.util import Finalize
from types import TracebackType
from typing import Any, Literal

import structlog

from coldbrew.errors import ConfigurationError, JobCancelled, JobTimeout
from coldbrew.procpool.errors import PoolClosed
from coldbrew.procpool.futures import fail
from coldbrew.procpool.handle import ChildHandle
from coldbrew.procpool.job import ContextHost, PoolJob
from coldbrew.procpool.keeper import Keeper
from coldbrew.procpool.memory import MB, MemoryWatch
from coldbrew.procpool.protocol import frame
from coldbrew.procpool.roster import Roster

__all__ = ["ProcessPool"]

log = structlog.get_logger("coldbrew.procpool")

_State = Literal["new", "starting", "running", "closing", "closed"]

RUN_TIME_WEIGHT = 0.1
"""Weight of the newest job in ``mean_run_seconds`` (about the last ten jobs count)."""


class ProcessPool:
    """A fixed number of child processes, each running one job at a time.

    ``start()`` waits until every child has imported the app; ``run()`` hands a
    job to an idle child (FIFO among waiters) and returns its result;
    ``close()`` lets busy children finish within ``grace`` and kills the rest.
    ``max_memory_mb`` (0: no limit) kills and replaces a child whose resident
    memory goes over it; ``max_jobs`` (0: never) replaces a child after that
    many jobs (see ``coldbrew.procpool.memory`` and ``coldbrew.procpool.keeper``).
    ``app_dir`` is where the parent imported the app from (``load_app``): each
    child puts it on its ``sys.path`` before importing ``app_ref``, so a job
    module in the folder coldbrew was started from is found by the children too.
    """

    def __init__(
        self,
        size: int,
        app_ref: str,
        *,
        app_dir: str | None = None,
        start_method: str = "spawn",
        max_memory_mb: int = 0,
        max_jobs: int = 0,
        memory_poll_seconds: float = 0.1,
    ) -> None:
        _check_settings(size, max_memory_mb, max_jobs, memory_poll_seconds)
        self._size = size
        self.app_ref = app_ref
        self.max_memory_mb = max_memory_mb
        self.max_memory_bytes = max_memory_mb * MB
        self.max_jobs = max_jobs
        self._state: _State = "new"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._roster = Roster()
        self._memory = (
            MemoryWatch(max_memory_mb, memory_poll_seconds, self._roster.children)
            if max_memory_mb
            else None
        )
        self._keeper = Keeper(
            self._roster, _process_factory(start_method), app_ref, self._memory, app_dir
        )
        self.replaced: dict[str, int] = self._keeper.replaced
        """Children replaced while running, by reason (``REPLACE_REASONS``); for metrics."""
        self._finalizer = Finalize(self, _kill_all, args=(self._roster.processes,), exitpriority=10)
        self.mean_run_seconds = 0.0
        """How long a job keeps its child, a moving mean over the last jobs (0 before any)."""

    # --- properties ---------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the pool was started on."""
        if self._loop is None:
            raise PoolClosed("process pool is not started; call start() first")
        return self._loop

    @property
    def size(self) -> int:
        return self._size

    @property
    def busy(self) -> int:
        """Children running a job."""
        return self._roster.busy

    @property
    def idle(self) -> int:
        """Children waiting for a job."""
        return self._roster.idle

    @property
    def waiting(self) -> int:
        """``run()`` calls waiting for a free child."""
        return self._roster.waiting

    def queue_seconds(self) -> float:
        """About how long a ``run()`` called now would wait for a child: the calls queued
        ahead of it times the mean job time, over the children; 0 when a child is idle or
        no job has finished yet. The worker lets a claim wait this long at most (less, by
        its own margin) to share a commit: the job would not start sooner anyway."""
        if self._roster.idle:
            return 0.0
        return self._roster.waiting * self.mean_run_seconds / self._size

    @property
    def alive(self) -> int:
        """Children that have loaded the app and can take jobs (idle or busy)."""
        return len(self._roster.pids)

    @property
    def closed(self) -> bool:
        """True once ``close()`` has begun (or a start failed): ``run()`` is refused."""
        return self._state in ("closing", "closed")

    @property
    def pids(self) -> list[int]:
        """Process ids of the children counted by ``alive`` (not one running its last job)."""
        return self._roster.pids

    # --- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> ProcessPool:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Spawn the children and wait until each has imported the app."""
        if self._state == "running":
            return
        if self._state != "new":
            raise PoolClosed(f"process pool is {self._state}; create a new one")
        self._loop = asyncio.get_running_loop()
        self._state = "starting"
        try:
            results = await asyncio.gather(
                *(self._keeper.boot() for _ in range(self._size)), return_exceptions=True
            )
        except BaseException:
            await self._abandon()
            raise
        errors = [result for result in results if isinstance(result, BaseException)]
        if self._state != "starting":  # close() ran meanwhile
            errors.append(PoolClosed("process pool was closed while starting"))
        if errors:
            await self._abandon()
            raise errors[0]
        self._state = "running"
        self._roster.running = True
        for child in results:
            if isinstance(child, ChildHandle):
                self._roster.release(child)
        if self._memory is not None:
            self._memory.start(self._loop)
        log.debug(
            "procpool_started",
            size=self._size,
            app=self.app_ref,
            max_memory_mb=self.max_memory_mb,
            max_jobs=self.max_jobs,
        )

    async def _abandon(self) -> None:
        """A failed start: kill whatever was spawned and reap it."""
        self._state = "closed"
        self._keeper.kill_all("start_failed")
        await self._keeper.reap_all()
        self._finalizer()

    async def close(self, grace: float = 5.0) -> None:
        """Stop: idle children exit now, busy ones may finish within ``grace`` s, then are killed.

        Idempotent. Waiting ``run()`` calls raise ``PoolClosed``, as do jobs killed at the end.
        """
        if self._state in ("new", "closed"):
            self._state = "closed"
            return
        if self._state == "closing":
            await self._keeper.reap_all()
            return
        self._state = "closing"
        self._roster.running = False
        if self._memory is not None:
            await self._memory.stop()
        self._roster.fail_waiters()
        await self._keeper.stop_replacing()
        self._roster.exit_idle()
        exits = [child.exited for child in self._roster.children]
        if exits:
            await asyncio.wait(exits, timeout=grace)
        for child in list(self._roster.children):
            if not child.exited.done():
                error = PoolClosed(f"process pool closed; job killed after {grace:g} s grace")
                child.abort(error, "closed")
        await self._keeper.reap_all()
        self._state = "closed"
        self._finalizer()
        log.debug("procpool_closed", app=self.app_ref)

    # --- jobs ---------------------------------------------------------------

    def _check_running(self) -> None:
        if self._state in ("new", "starting"):
            raise PoolClosed("process pool is not started; call start() first")
        if self._state != "running":
            raise PoolClosed(f"process pool is {self._state}")

    async def run(
        self,
        job_type: str,
        args: dict[str, Any],
        info: Mapping[str, Any],
        host: ContextHost,
        *,
        timeout: float | None,
    ) -> Any:
        """Run one job in an idle child and return its result.

        ``timeout`` counts from when the job reaches a child, not while waiting
        for one. Raises the job's ``Permanent``/``Retry``, ``RemoteJobError`` for
        anything else it raised, ``JobTimeout``, ``JobCancelled``,
        ``WorkerCrashed`` or ``PoolClosed``.
        """
        self._check_running()
        data = frame(("job", job_type, args, dict(info)))
        job = PoolJob(str(info.get("job_id", "")), job_type, host, self.loop.create_future())
        handover = _Handover(self, job, data, timeout)
        job.over = handover.over
        child = self._roster.take_idle()
        if child is not None:
            handover.start(child)
        else:  # the child that frees next begins it, from the callback that freed it
            self._roster.wait(handover)
        try:
            return await job.future
        except asyncio.CancelledError:
            if handover.child is None:
                self._roster.unwait(handover)  # never reached a child
            else:
                handover.child.abort(None, "caller_cancelled")  # nobody waits: stop the work
            raise
        finally:
            handover.over()

    def _begin(self, handover: _Handover, child: ChildHandle) -> None:
        """Hand ``handover``'s job to ``child``: count it, arm its timeout, write its frame."""
        child.jobs_started += 1
        if self.max_jobs and child.jobs_started >= self.max_jobs:
            child.retiring = True  # this is its last job: boot its successor meanwhile
            self._keeper.replace_soon(child)
        loop = self.loop
        job = handover.job
        if handover.timeout is not None:
            handover.timer = loop.call_later(
                handover.timeout, self._expire, child, job, handover.timeout
            )
        handover.began = loop.time()
        child.begin(job, handover.data)

    def _over(self, handover: _Handover) -> None:
        """The job's outcome is in (or it failed, or was given up): take its child back."""
        if handover.timer is not None:
            handover.timer.cancel()
        child = handover.child
        if child is None:
            return
        took = self.loop.time() - handover.began
        mean = self.mean_run_seconds
        self.mean_run_seconds = mean + RUN_TIME_WEIGHT * (took - mean) if mean else took
        self._finish(child, handover.job)

    def _expire(self, child: ChildHandle, job: PoolJob, timeout: float) -> None:
        if not job.future.done():
            what = f"job {job.job_type!r} {job.job_id}"
            child.abort(JobTimeout(f"{what} timed out after {timeout:g} s"), "timeout")

    def _finish(self, child: ChildHandle, job: PoolJob) -> None:
        """After a job's outcome: give the child back, unless it is dying, over memory or done."""
        for task in job.rpcs:
            task.cancel()
        if child.job is job:
            child.job = None
        if child.doomed:
            return
        if self._memory is not None and self._memory.check(child):
            return  # the job left it over the limit: the next job gets a fresh child
        if child.retiring:
            child.retire()
            return
        self._roster.release(child)  # to the oldest waiting job, which begins now

    def cancel(self, job_id: str) -> bool:
        """Kill the child running ``job_id`` (its ``run()`` raises ``JobCancelled``)."""
        found = False
        for child in list(self._roster.children):
            job = child.job
            if job is not None and job.job_id == job_id and not job.future.done():
                child.abort(JobCancelled(f"job {job_id!r} was cancelled"), "cancelled")
                found = True
        return found


class _Handover:
    """One ``run()``'s job on its way to a child and back: the roster starts it in the child
    that frees (``start``, a ``Waiter``), the child's handle ends it (``over``) as soon as
    the result is read, and ``run()`` ends it too on every other way out (idempotent)."""

    __slots__ = ("_done", "_pool", "began", "child", "data", "job", "timeout", "timer")

    def __init__(self, pool: ProcessPool, job: PoolJob, data: bytes, timeout: float | None):
        self._pool = pool
        self.job = job
        self.data = data
        self.timeout = timeout
        self.child: ChildHandle | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.began = 0.0
        self._done = False

    def start(self, child: ChildHandle) -> None:
        if self._done:  # given up meanwhile (it left the queue then): pass the child on
            self._pool._finish(child, self.job)
            return
        self.child = child
        self._pool._begin(self, child)

    def fail(self, error: BaseException) -> None:
        fail(self.job.future, error)

    def over(self) -> None:
        if self._done:
            return
        self._done = True
        self._pool._over(self)


def _check_settings(
    size: int, max_memory_mb: int, max_jobs: int, memory_poll_seconds: float
) -> None:
    """Refuse a pool that could not work, naming the setting to change."""
    if size < 1:
        raise ConfigurationError(f"process pool size must be at least 1, got {size}")
    if max_memory_mb < 0:
        raise ConfigurationError(
            f"COLDBREW_PROCESS_MAX_MEMORY_MB must be 0 (no limit) or more, got {max_memory_mb}"
        )
    if max_jobs < 0:
        raise ConfigurationError(
            f"COLDBREW_PROCESS_MAX_JOBS must be 0 (never recycle) or more, got {max_jobs}"
        )
    if not memory_poll_seconds > 0:
        raise ConfigurationError(f"memory_poll_seconds must be > 0, got {memory_poll_seconds}")
    if max_memory_mb and not os.path.exists("/proc/self/statm"):
        raise ConfigurationError(
            "COLDBREW_PROCESS_MAX_MEMORY_MB needs Linux's /proc/<pid>/statm, "
            "which this system does not have; set it to 0"
        )


def _process_factory(start_method: str) -> Callable[..., BaseProcess]:
    """``Process`` of the multiprocessing context ``start_method`` (``spawn`` by default)."""
    try:
        context = multiprocessing.get_context(start_method)
    except ValueError as exc:
        raise ConfigurationError(f"unknown process start method {start_method!r}") from exc
    # typeshed types get_context(str) as BaseContext, which lacks the Process attribute
    new_process: Callable[..., BaseProcess] = context.Process  # type: ignore[attr-defined]
    return new_process


def _kill_all(processes: dict[int, BaseProcess]) -> None:
    """Finalizer: SIGKILL children left behind by a pool that was never closed."""
    for process in list(processes.values()):
        with contextlib.suppress(OSError, ValueError):
            process.kill()
