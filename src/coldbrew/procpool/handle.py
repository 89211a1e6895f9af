"""The parent's view of one child: spawning it, its pipe, its memory, and its end.

A ``ChildHandle`` is everything the parent knows about one child process:
whether it has loaded the app, the job it runs (settled from the child's
frames, whose RPCs it answers), how many jobs it started and whether it is
running its last one (``retiring``), its resident memory, and how to stop it
(``kill``, ``abort`` with an error for its job, or ``request_exit`` after its
current frame). It does not decide when any of that happens: the pool, the
keeper and the memory watch do.

Why the parent watches the process sentinel as well as the pipe: a death is
seen at once, not at the next job, and a child whose pipe is held open by a
grandchild is still seen to die.

Why RSS comes from ``/proc/<pid>/statm`` through a file descriptor opened once
per child: one ``pread`` of a few bytes (~2 µs), and the descriptor is bound
to that process, so a reused pid is never measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import socket
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

import structlog

from coldbrew.errors import ConfigurationError
from coldbrew.procpool.child import child_main
from coldbrew.procpool.errors import RemoteJobError
from coldbrew.procpool.futures import fail, resolve
from coldbrew.procpool.job import PoolJob
from coldbrew.procpool.protocol import EXIT_FRAME, error_kind, frame, outcome_error, portable
from coldbrew.procpool.wire import Wire

__all__ = ["ChildHandle", "describe_exit", "spawn", "wait_exit"]

_EXIT_STATUS_WAIT_SECONDS = 2.0  # after EOF/sentinel, how long before we SIGKILL and give up
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

log = structlog.get_logger("coldbrew.procpool")


class ChildHandle:
    """The parent's handle on one child process and the job it is running."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        process: BaseProcess,
        sock: socket.socket,
        *,
        app_ref: str,
        measure_memory: bool,
        on_gone: Callable[[ChildHandle], None],
    ) -> None:
        self._loop = loop
        self._on_gone = on_gone
        self.app_ref = app_ref
        self.process = process
        self.pid: int = process.pid or 0
        self.sentinel = process.sentinel
        self.booted: asyncio.Future[None] = loop.create_future()
        self.exited: asyncio.Future[int | None] = loop.create_future()
        self.job: PoolJob | None = None
        self.ready = False  # has loaded the app
        self.doomed = False  # killed, dying or told to exit: never handed a job again
        self.gone = False  # pipe or process closed
        self.kill_reason: str | None = None  # set when the parent killed it on purpose
        self.jobs_started = 0
        self.retiring = False  # running its last job (max_jobs); its successor is booting
        # resolved when its last job (max_jobs) is over or it is gone: its successor may start
        self.last_job_done: asyncio.Future[None] = loop.create_future()
        self.statm: int | None = None  # fd of /proc/<pid>/statm when memory is limited
        if measure_memory:
            with contextlib.suppress(OSError):  # it died at once: the sentinel reports that
                self.statm = os.open(f"/proc/{self.pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
        self.wire = Wire(loop, sock, self._on_message, self.on_lost)
        loop.add_reader(self.sentinel, self.on_lost)

    # --- memory -------------------------------------------------------------

    def resident_bytes(self) -> int:
        """The child's resident set size now; 0 when it cannot be read (it is gone)."""
        if self.statm is None:
            return 0
        try:
            return int(os.pread(self.statm, 128, 0).split()[1]) * _PAGE_SIZE
        except (OSError, IndexError, ValueError):
            return 0

    def close_statm(self) -> None:
        """Close the statm descriptor once the child is reaped (its pid may be reused)."""
        if self.statm is not None:
            os.close(self.statm)
            self.statm = None

    # --- jobs and ends ------------------------------------------------------

    def begin(self, job: PoolJob, data: bytes) -> None:
        """Hand ``job`` (already framed as ``data``) to the child."""
        self.job = job
        self.wire.write(data)

    def kill(self, reason: str) -> None:
        """SIGKILL the child on purpose; ``reason`` is logged when it is reaped."""
        self.doomed = True
        self.kill_reason = self.kill_reason or reason
        if not self.exited.done():
            self.process.kill()

    def abort(self, error: BaseException | None, reason: str) -> None:
        """Fail the current job with ``error`` (when given), then kill the child."""
        job = self.job
        if error is not None and job is not None and not job.future.done():
            job.future.set_exception(error)
        self.kill(reason)

    def request_exit(self, reason: str | None = None) -> None:
        """Ask the child to exit after its current frame; ``reason`` as for ``kill``."""
        self.doomed = True
        if reason is not None:
            self.kill_reason = self.kill_reason or reason
        self.wire.write(EXIT_FRAME)

    def retire(self) -> None:
        """Its last job is over (``max_jobs``): let it exit, and let its successor take work."""
        self.request_exit("max_jobs")
        resolve(self.last_job_done, None)

    def on_lost(self) -> None:
        """EOF on the pipe or the sentinel fired: the child is dead or dying."""
        if self.gone:
            return
        self.gone = self.doomed = True
        self._loop.remove_reader(self.sentinel)
        self.wire.drain()
        self.wire.close()
        self._on_gone(self)

    # --- the child's frames -------------------------------------------------

    def _on_message(self, payload: bytes) -> None:
        try:
            message = pickle.loads(payload)  # noqa: S301 - our own child, private socketpair
        except Exception as exc:  # noqa: BLE001 - any unpickling failure
            detail = (
                f"cannot unpickle a message from pool child {self.pid}: {error_kind(exc)}: {exc}"
            )
            self.abort(RemoteJobError("UnpicklableResult", detail), "bad_message")
            return
        tag = message[0]
        if tag == "progress":
            self._on_progress(message[1], message[2])
        elif tag == "rpc":
            self._on_rpc(message[1], message[2])
        elif tag == "ready":
            resolve(self.booted, None)
        elif tag == "boot_error":
            error = f"pool child cannot load app {self.app_ref!r}: {message[1]}"
            fail(self.booted, ConfigurationError(error))
        elif (job := self.job) is not None and not job.future.done():
            if tag == "ok":
                job.future.set_result(message[1])
            else:
                job.future.set_exception(outcome_error(message))
            if job.over is not None:  # the child is free: the pool hands it the next job now
                job.over()

    def _on_progress(self, fraction: float | None, message: str | None) -> None:
        job = self.job
        if job is None or job.future.done():
            return
        try:
            job.host.progress(fraction, message)
        except Exception:  # a reporting failure must not fail the job
            log.exception("procpool_progress_failed", job_id=job.job_id, pid=self.pid)

    def _on_rpc(self, method: str, argument: Any) -> None:
        job = self.job
        if job is None or job.future.done():
            return
        # in the job's context, not the protocol callback's (tracing: the run span)
        task = self._loop.create_task(self._answer(job, method, argument), context=job.context)
        job.rpcs.add(task)
        task.add_done_callback(job.rpcs.discard)

    async def _answer(self, job: PoolJob, method: str, argument: Any) -> None:
        reply: tuple[Any, ...]
        try:
            if method == "checkpoint":
                await job.host.checkpoint(argument)
                reply = ("reply", True, None)
            elif method == "batch_add":
                reply = ("reply", True, await job.host.add_to_batch(argument))
            elif method == "submit":
                type_, args, name, options = argument
                child_id = await job.host.submit(type_, args, name=name, **options)
                reply = ("reply", True, child_id)
            else:
                reply = ("reply", True, bool(await job.host.once(argument)))
        except Exception as exc:  # noqa: BLE001 - handed to the job, which decides
            reply = ("reply", False, portable(exc))
        if not self.doomed:
            self.wire.write(frame(reply))


def spawn(
    new_process: Callable[..., BaseProcess],
    loop: asyncio.AbstractEventLoop,
    app_ref: str,
    *,
    app_dir: str | None = None,
    measure_memory: bool,
    on_gone: Callable[[ChildHandle], None],
) -> ChildHandle:
    """Start one child process on a fresh socketpair; it begins by loading ``app_ref``."""
    parent_sock, child_sock = socket.socketpair()
    process = new_process(
        target=child_main, args=(child_sock, app_ref, app_dir), name="coldbrew-pool", daemon=True
    )
    try:
        process.start()
    except BaseException:
        parent_sock.close()
        raise
    finally:
        child_sock.close()
    return ChildHandle(
        loop, process, parent_sock, app_ref=app_ref, measure_memory=measure_memory, on_gone=on_gone
    )


def describe_exit(code: int | None) -> str:
    """How a child ended, for error messages and logs (``killed by SIGKILL``, ...)."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


async def wait_exit(process: BaseProcess) -> int | None:
    """Exit status of a child whose pipe or sentinel closed; SIGKILL it if it lingers."""
    delay = 0.0005
    waited = 0.0
    while (code := process.exitcode) is None:
        if waited >= 2 * _EXIT_STATUS_WAIT_SECONDS:
            return None  # reaped by someone else, or unkillable: stop waiting
        if waited >= _EXIT_STATUS_WAIT_SECONDS:
            process.kill()
        await asyncio.sleep(delay)
        waited += delay
        delay = min(delay * 2, 0.05)
    return code
