"""The per-child memory limit (``COLDBREW_PROCESS_MAX_MEMORY_MB``): sample RSS, kill over it.

The parent samples each child's resident set size (``ChildHandle.resident_bytes``)
every ``poll_seconds`` (0.1 s) and after each job. A busy child over the limit
is SIGKILLed and its job fails with ``MemoryLimitExceeded`` (error kind
``memory``, retryable); an idle one, or one left over the limit by the job
that just finished (whose result stands), is killed without failing
anything. Either way the keeper boots a fresh child in its place.

Why RSS sampled by the parent rather than ``RLIMIT_AS`` in the child: the
address-space limit counts *virtual* memory, which real CPU jobs reserve far
beyond what they touch (glibc gives each thread a 64 MB malloc arena,
numpy/OpenBLAS and codec libraries start a thread pool with its stacks, files
are mmapped), so a transcode using 300 MB of RAM can map 2 GB and would fail
at a limit sized for RAM; and it fails the job with a ``MemoryError`` in
whatever library allocated, or a segfault in C code that does not check
``malloc``. RSS is what the machine runs out of, it is what the kernel's OOM
killer and container limits judge, and a kill from the parent works whatever
the job is doing (also inside C code holding the GIL). The cost: a job can
overshoot by what it allocates within one sampling interval before it is
killed (fresh pages are written at ~0.4 GB/s on the 2-vCPU test machine and
a few GB/s on a fast one: tens to a few hundred MB in 0.1 s). Memory of
processes the job starts itself (``subprocess``) is not counted, and they are
not killed with it: limit those where they are started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import structlog

from coldbrew.errors import ConfigurationError, MemoryLimitExceeded
from coldbrew.procpool.handle import ChildHandle

__all__ = ["MB", "MemoryWatch"]

MB = 1024 * 1024

log = structlog.get_logger("coldbrew.procpool")


class MemoryWatch:
    """Kills the children of one pool whose resident memory is over ``limit_mb``.

    ``children`` is the pool's live set of children (read at each sample, never
    copied at start), so children booted later are watched too.
    """

    def __init__(
        self, limit_mb: int, poll_seconds: float, children: Collection[ChildHandle]
    ) -> None:
        self.limit_mb = limit_mb
        self.limit_bytes = limit_mb * MB
        self._poll_seconds = poll_seconds
        self._children = children
        self._task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin sampling every ``poll_seconds``, until ``stop()``."""
        self._task = loop.create_task(self._watch(), name="coldbrew-pool-memory-watch")
        self._task.add_done_callback(_report_watch_end)

    async def stop(self) -> None:
        """Stop sampling and wait until the watcher has ended; idempotent."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            for child in list(self._children):
                if child.ready and not child.doomed:
                    self.check(child)

    def check_boot(self, child: ChildHandle) -> None:
        """Refuse a child that is over the limit as soon as it has loaded the app.

        Why at boot: no job could ever run in it, and replacing it would only
        boot the same app again; the operator must raise the limit.
        """
        rss = child.resident_bytes()
        if rss > self.limit_bytes:
            child.kill("boot_failed")
            raise ConfigurationError(
                f"a pool child uses {rss / MB:.0f} MB of memory once it has loaded "
                f"{child.app_ref!r}, over COLDBREW_PROCESS_MAX_MEMORY_MB={self.limit_mb}: "
                "no job could run; raise the limit"
            )

    def check(self, child: ChildHandle) -> bool:
        """Kill ``child`` if it is over the memory limit; True when it was killed.

        A busy child's job fails with ``MemoryLimitExceeded``; a job whose
        result has already arrived keeps it (the child is killed all the same).
        """
        rss = child.resident_bytes()
        if rss <= self.limit_bytes:
            return False
        child.wire.drain()  # a result already written wins over the kill
        job = child.job
        running = job is not None and not job.future.done()
        log.warning(
            "procpool_child_over_memory",
            pid=child.pid,
            rss_mb=round(rss / MB),
            limit_mb=self.limit_mb,
            job_id=job.job_id if running and job is not None else None,
        )
        if running and job is not None:
            message = (
                f"pool child {child.pid} running job {job.job_type!r} {job.job_id} was killed: "
                f"its resident memory reached {rss / MB:.0f} MB, over the limit of "
                f"{self.limit_mb} MB (COLDBREW_PROCESS_MAX_MEMORY_MB)"
            )
            error = MemoryLimitExceeded(message, limit_bytes=self.limit_bytes, rss_bytes=rss)
            child.abort(error, "memory")
        else:
            child.kill("memory")
        return True


def _report_watch_end(task: asyncio.Task[None]) -> None:
    """The memory watcher only ends when the pool closes; anything else is a bug to see."""
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("procpool_memory_watch_failed", exc_info=error)
