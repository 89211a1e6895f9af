"""Keeping a pool at its size: boot children, reap the dead, boot their replacements.

A child that dies (it crashed, or the pool killed it for a timeout, a cancel
or its memory) is reaped: its exit status collected, its job failed with
``WorkerCrashed`` unless something settled it first, and a replacement booted,
retrying with backoff while the pool runs. Why reaping is a task per child:
the exit status may lag the EOF by a moment, and waiting for it must never
hold up the loop callback that saw the death.

Recycling (``max_jobs``, ``COLDBREW_PROCESS_MAX_JOBS``): a child retires after
that many jobs, once its last result is returned. Its replacement boots as
soon as the last job starts and takes work only when the old child is done,
so no job waits for a boot and the pool never runs more than ``size`` jobs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from multiprocessing.process import BaseProcess

import structlog

from coldbrew.errors import ConfigurationError, WorkerCrashed
from coldbrew.procpool.futures import fail, ignore_outcome, resolve
from coldbrew.procpool.handle import ChildHandle, describe_exit, spawn, wait_exit
from coldbrew.procpool.job import PoolJob
from coldbrew.procpool.memory import MemoryWatch
from coldbrew.procpool.roster import Roster

__all__ = ["REPLACE_REASONS", "Keeper"]

REPLACE_REASONS = ("crashed", "timeout", "cancelled", "memory", "max_jobs", "other")
"""Why a child was replaced: the label values of ``ProcessPool.replaced``."""

_REASON_OF_KILL = {
    "timeout": "timeout",
    "cancelled": "cancelled",
    "caller_cancelled": "cancelled",
    "memory": "memory",
    "max_jobs": "max_jobs",
}

log = structlog.get_logger("coldbrew.procpool")


class Keeper:
    """Boots, reaps and replaces the children in ``roster``; counts why in ``replaced``."""

    def __init__(
        self,
        roster: Roster,
        new_process: Callable[..., BaseProcess],
        app_ref: str,
        memory: MemoryWatch | None,
        app_dir: str | None = None,
    ) -> None:
        self._roster = roster
        self._new_process = new_process
        self._app_ref = app_ref
        self._app_dir = app_dir
        self._memory = memory
        self.replaced: dict[str, int] = dict.fromkeys(REPLACE_REASONS, 0)
        self._replacing: set[asyncio.Task[None]] = set()
        self._reaping: set[asyncio.Task[None]] = set()

    async def boot(self) -> ChildHandle:
        """Spawn a child and wait until it has loaded the app (and fits the memory limit)."""
        child = spawn(
            self._new_process,
            asyncio.get_running_loop(),
            self._app_ref,
            app_dir=self._app_dir,
            measure_memory=self._memory is not None,
            on_gone=self._on_gone,
        )
        self._roster.add(child)
        try:
            await asyncio.shield(child.booted)
        except BaseException:
            # Nobody awaits the boot future any more: mark its outcome as seen.
            child.booted.add_done_callback(ignore_outcome)
            child.kill("boot_failed")
            raise
        if self._memory is not None:
            self._memory.check_boot(child)
        child.ready = True
        return child

    def _on_gone(self, child: ChildHandle) -> None:
        self._roster.forget(child)
        task = asyncio.get_running_loop().create_task(
            self._reap(child), name=f"coldbrew-pool-reap-{child.pid}"
        )
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def _reap(self, child: ChildHandle) -> None:
        """Collect a dead child's exit status, fail what it was doing, and replace it."""
        code = await wait_exit(child.process)
        if code is not None:
            child.process.close()
        child.close_statm()
        self._roster.discard(child)
        how = describe_exit(code)
        fail(
            child.booted,
            ConfigurationError(f"pool child for {self._app_ref!r} {how} before loading the app"),
        )
        job = child.job
        if job is not None:
            error = f"pool child {child.pid} running job {job.job_type!r} {job.job_id} {how}"
            fail(job.future, WorkerCrashed(error))
        resolve(child.exited, code)
        resolve(child.last_job_done, None)
        if child.ready and self._roster.running:
            self._record(child, job, how)
            if not child.retiring:  # a retiring child's successor is already booting
                self.replace_soon()

    def _record(self, child: ChildHandle, job: PoolJob | None, how: str) -> None:
        """Count and log why a running pool lost ``child``."""
        reason = child.kill_reason
        self.replaced[_REASON_OF_KILL.get(reason or "crashed", "other")] += 1
        if reason is None:
            job_id = None if job is None else job.job_id
            log.warning("procpool_child_died", pid=child.pid, how=how, job_id=job_id)
        elif reason == "max_jobs":
            log.debug("procpool_child_recycled", pid=child.pid, jobs=child.jobs_started)
        else:
            log.info("procpool_child_replaced", pid=child.pid, reason=reason)

    def replace_soon(self, predecessor: ChildHandle | None = None) -> None:
        """Boot a replacement in the background (for ``predecessor``'s last job, if given)."""
        task = asyncio.get_running_loop().create_task(
            self._replace(predecessor), name="coldbrew-pool-replace"
        )
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self, predecessor: ChildHandle | None) -> None:
        """Boot a replacement child, retrying with backoff while the pool is running.

        With ``predecessor`` (a child running its last job), the new child
        boots now but takes work only once that job is over, so the pool
        never runs more than ``size`` jobs at a time.
        """
        delay = 0.5
        while self._roster.running:
            try:
                child = await self.boot()
            except (ConfigurationError, OSError) as exc:
                log.warning("procpool_replace_failed", error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            if predecessor is not None:
                try:
                    await asyncio.shield(predecessor.last_job_done)
                except asyncio.CancelledError:
                    child.request_exit()  # close() is stopping the pool: nobody will use it
                    raise
            self._roster.release(child)
            return

    async def stop_replacing(self) -> None:
        """Cancel the replacements still booting and wait until they are over."""
        for task in self._replacing:
            task.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)

    def kill_all(self, reason: str) -> None:
        """SIGKILL every child (a failed start); ``reap_all()`` then collects them."""
        for child in list(self._roster.children):
            child.kill(reason)

    async def reap_all(self) -> None:
        """Wait until every child has exited and been reaped, including ones dying meanwhile."""
        while self._roster.children or self._reaping:
            await asyncio.gather(
                *(child.exited for child in self._roster.children),
                *self._reaping,
                return_exceptions=True,
            )
