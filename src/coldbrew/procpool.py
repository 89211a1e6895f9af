"""Process pool for CPU-bound jobs, driven from the asyncio event loop.

Why not ``concurrent.futures.ProcessPoolExecutor``: when one of its children
dies the whole executor breaks (every pending future fails and the pool must be
rebuilt), and it cannot stop one job that runs past its timeout. Here each
child is supervised on its own: a job that times out or is cancelled has its
child SIGKILLed and replaced, a child that crashes fails only its own job, and
the jobs in the other children carry on.

Memory limit (``max_memory_mb``, ``COLDBREW_PROCESS_MAX_MEMORY_MB``): the
parent samples each child's resident set size (RSS, ``/proc/<pid>/statm``,
through a file descriptor opened once per child: one ``pread`` of a few
bytes, ~2 µs, and bound to that process, so a reused pid is never measured)
every ``memory_poll_seconds`` (0.1 s) and after each job. A busy child
over the limit is SIGKILLed and its job fails with ``MemoryLimitExceeded``
(error kind ``memory``, retryable); an idle one, or one left over the limit by
the job that just finished (whose result stands), is killed without failing
anything. Either way a fresh child replaces it. Why RSS sampled by the parent
rather than ``RLIMIT_AS`` in the child: the address-space limit counts
*virtual* memory, which real CPU jobs reserve far beyond what they touch
(glibc gives each thread a 64 MB malloc arena, numpy/OpenBLAS and codec
libraries start a thread pool with its stacks, files are mmapped), so a
transcode using 300 MB of RAM can map 2 GB and would fail at a limit sized
for RAM; and it fails the job with a ``MemoryError`` in whatever library
allocated, or a segfault in C code that does not check ``malloc``. RSS is
what the machine runs out of, it is what the kernel's OOM killer and
container limits judge, and a kill from the parent works whatever the job is
doing (also inside C code holding the GIL). The cost: a job can overshoot by
what it allocates within one sampling interval before it is killed (fresh
pages are written at ~0.4 GB/s on the 2-vCPU test machine and a few GB/s on
a fast one: tens to a few hundred MB in 0.1 s). Memory of processes the job starts
itself (``subprocess``) is not counted, and they are not killed with it:
limit those where they are started.

Recycling (``max_jobs``, ``COLDBREW_PROCESS_MAX_JOBS``): a child retires after
that many jobs, once its last result is returned. Its replacement boots as
soon as the last job starts and takes work only when the old child is done,
so no job waits for a boot and the pool never runs more than ``size`` jobs.

Wire: one socketpair per child carrying length-prefixed pickle frames. The
parent reads with ``loop.add_reader`` and non-blocking ``recv`` (never a
blocking read on the loop) and also watches the process sentinel, so a death is
seen at once rather than at the next job. A job costs one frame each way;
progress and the ``checkpoint``/``once`` RPCs add frames only when used.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pickle
import signal
import socket
import struct
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.util import Finalize
from types import TracebackType
from typing import Any, Literal, Protocol

import structlog

from coldbrew.app import App, load_app
from coldbrew.errors import (
    ColdbrewError,
    ConfigurationError,
    JobCancelled,
    JobTimeout,
    MemoryLimitExceeded,
    Permanent,
    Retry,
    WorkerCrashed,
)

__all__ = [
    "REPLACE_REASONS",
    "ContextHost",
    "PoolClosed",
    "ProcessContext",
    "ProcessPool",
    "RemoteJobError",
]

_HEADER = struct.Struct("!Q")
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_READ_SIZE = 256 * 1024
_ORPHAN_POLL_SECONDS = 1.0
_EXIT_STATUS_WAIT_SECONDS = 2.0  # after EOF/sentinel, how long before we SIGKILL and give up
_MB = 1024 * 1024
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

REPLACE_REASONS = ("crashed", "timeout", "cancelled", "memory", "max_jobs", "other")
"""Why a child was replaced: the label values of ``ProcessPool.replaced``."""

_REASON_OF_KILL = {
    "timeout": "timeout",
    "cancelled": "cancelled",
    "caller_cancelled": "cancelled",
    "memory": "memory",
    "max_jobs": "max_jobs",
}

log = structlog.get_logger(__name__)


class PoolClosed(ColdbrewError):
    """The process pool is not started yet, or is closed (or closing)."""


class RemoteJobError(ColdbrewError):
    """A job in the pool raised an exception other than ``Permanent``/``Retry``.

    ``kind`` is the exception's ``module.QualName`` (or ``UnpicklableResult``),
    ``traceback_text`` the child's formatted traceback.
    """

    def __init__(self, kind: str, message: str, traceback_text: str = "") -> None:
        super().__init__(kind, message, traceback_text)
        self.kind = kind
        self.message = message
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class ContextHost(Protocol):
    """The parent-side services behind a pool job's ``ProcessContext``."""

    def progress(self, fraction: float | None, message: str | None) -> None: ...

    async def checkpoint(self, state: Any) -> None: ...

    async def once(self, name: str) -> bool: ...


# --- child side -------------------------------------------------------------


def _frame(message: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(message, _PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def _kind(exc: BaseException) -> str:
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"


class _ChildChannel:
    """The child's end of the pipe: blocking frames, safe to use from several threads."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()
        self._rpc_lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        self.send_frame(_frame(message))

    def send_frame(self, frame: bytes) -> None:
        with self._send_lock:
            self._sock.sendall(frame)

    def recv(self) -> tuple[Any, ...] | None:
        """The next message from the parent; None when the parent has gone."""
        header = self._reader.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        (length,) = _HEADER.unpack(header)
        payload = self._reader.read(length)
        if len(payload) < length:
            return None
        message: tuple[Any, ...] = pickle.loads(payload)  # noqa: S301 - our parent, private socketpair
        return message

    def call(self, method: str, argument: Any) -> Any:
        """Ask the parent's host and block for its answer; re-raise the host's exception."""
        with self._rpc_lock:
            self.send(("rpc", method, argument))
            reply = self.recv()
        if reply is None:
            os._exit(0)  # the parent is gone: nobody is left to want this job's result
        _, ok, value = reply
        if not ok:
            raise value
        return value


class ProcessContext:
    """The ``ctx`` of a job running in the pool: identity, progress, checkpoints, once-guards."""

    def __init__(self, channel: _ChildChannel, info: Mapping[str, Any]) -> None:
        self._channel = channel
        self.job_id: str = info.get("job_id", "")
        self.type: str = info.get("type", "")
        self.attempt: int = info.get("attempt", 1)
        self.tenant: str = info.get("tenant", "default")
        self.queue: str = info.get("queue", "default")
        self.max_attempts: int | None = info.get("max_attempts")
        self.checkpoint_state: Any = info.get("checkpoint")
        self.log: Any = structlog.get_logger("coldbrew.job").bind(
            job_id=self.job_id, type=self.type, attempt=self.attempt, tenant=self.tenant
        )

    def progress(self, fraction: float | None = None, message: str | None = None) -> None:
        """Report progress; fire-and-forget, so it never waits on the parent."""
        self._channel.send(("progress", fraction, message))

    def checkpoint(self, state: Any) -> None:
        """Save ``state`` (JSON-able) for the next attempt; returns once it is stored."""
        self._channel.call("checkpoint", state)
        self.checkpoint_state = state

    def once(self, name: str) -> bool:
        """True the first time ``name`` is claimed for this job (across attempts), else False."""
        return bool(self._channel.call("once", name))


def _run_job(app: App, channel: _ChildChannel, message: tuple[Any, ...]) -> bytes:
    """Run one job and return the outcome frame; job code can never take the child down."""
    _, job_type, args, info = message
    try:
        value = app.get(job_type).func(ProcessContext(channel, info), **args)
    except Retry as exc:
        return _frame(("retry", str(exc), exc.delay))
    except Permanent as exc:
        return _frame(("permanent", str(exc)))
    except BaseException as exc:  # noqa: BLE001 - whatever the job raises is its outcome
        return _frame(("error", _kind(exc), str(exc), traceback.format_exc()))
    try:
        return _frame(("ok", value))
    except Exception as exc:  # noqa: BLE001 - pickling fails in many ways
        detail = f"the result of {job_type!r} ({type(value).__qualname__}) cannot be pickled: {exc}"
        return _frame(("error", "UnpicklableResult", detail, ""))


def _watch_parent(parent_pid: int) -> None:
    """Exit when re-parented: covers a parent killed while the pipe is held open elsewhere."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_ORPHAN_POLL_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, name="coldbrew-orphan-watch", daemon=True).start()


def _child_main(sock: socket.socket, app_ref: str) -> None:
    """Entry point of a pool child: load the app, then run jobs until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns shutdown
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _watch_parent(os.getppid())
    channel = _ChildChannel(sock)
    try:
        app = load_app(app_ref)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        channel.send(("boot_error", f"{_kind(exc)}: {exc}"))
        return
    channel.send(("ready", os.getpid()))
    while (message := channel.recv()) is not None and message[0] == "job":
        channel.send_frame(_run_job(app, channel, message))


# --- parent side ------------------------------------------------------------


class _Wire:
    """The parent's end of one child's socket: non-blocking, frames parsed on the loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        on_message: Callable[[bytes], None],
        on_eof: Callable[[], None],
    ) -> None:
        sock.setblocking(False)
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._on_message = on_message
        self._on_eof = on_eof
        self._inbox = bytearray()
        self._outbox = bytearray()
        self.closed = False
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        self._receive()

    def drain(self) -> None:
        """Dispatch whatever the peer wrote before it died (its last progress or its result)."""
        while not self.closed and self._receive():
            pass

    def _receive(self) -> bool:
        """Read what is available and dispatch whole frames; False when nothing more is ready."""
        try:
            data = self._sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self._on_eof()
            return False
        inbox = self._inbox
        inbox += data
        size = _HEADER.size
        while not self.closed and len(inbox) >= size:
            (length,) = _HEADER.unpack_from(inbox)
            end = size + length
            if len(inbox) < end:
                break
            payload = bytes(inbox[size:end])
            del inbox[:end]
            self._on_message(payload)
        return True

    def write(self, frame: bytes) -> None:
        """Send a frame without blocking; what the socket cannot take now is sent when it can."""
        if self.closed:
            return
        if self._outbox:
            self._outbox += frame
            return
        try:
            sent = self._sock.send(frame)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return  # the child is gone; the sentinel or EOF reports it
        if sent < len(frame):
            self._outbox += memoryview(frame)[sent:]
            self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self._sock.send(self._outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            sent = len(self._outbox)
        del self._outbox[:sent]
        if not self._outbox:
            self._loop.remove_writer(self._fd)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._fd)
        if self._outbox:
            self._loop.remove_writer(self._fd)
            self._outbox.clear()
        self._sock.close()


@dataclass(eq=False)
class _Job:
    job_id: str
    job_type: str
    host: ContextHost
    future: asyncio.Future[Any]
    rpcs: set[asyncio.Task[None]] = field(default_factory=set)


_EXIT_FRAME = _frame(("exit",))


class _Child:
    """The parent's handle on one child process and the job it is running."""

    def __init__(self, pool: ProcessPool, process: BaseProcess, sock: socket.socket) -> None:
        self.pool = pool
        self.process = process
        self.pid: int = process.pid or 0
        self.sentinel = process.sentinel
        loop = pool.loop
        self.booted: asyncio.Future[None] = loop.create_future()
        self.exited: asyncio.Future[int | None] = loop.create_future()
        self.job: _Job | None = None
        self.ready = False  # has loaded the app
        self.doomed = False  # killed, dying or told to exit: never handed a job again
        self.gone = False  # pipe or process closed
        self.kill_reason: str | None = None  # set when the parent killed it on purpose
        self.jobs_started = 0
        self.retiring = False  # running its last job (max_jobs); its successor is booting
        # resolved when its last job (max_jobs) is over or it is gone: its successor may start
        self.last_job_done: asyncio.Future[None] = loop.create_future()
        self.statm: int | None = None  # fd of /proc/<pid>/statm when memory is limited
        if pool.max_memory_bytes:
            with contextlib.suppress(OSError):  # it died at once: the sentinel reports that
                self.statm = os.open(f"/proc/{self.pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
        self.wire = _Wire(loop, sock, self._on_message, self.on_lost)
        loop.add_reader(self.sentinel, self.on_lost)

    def resident_bytes(self) -> int:
        """The child's resident set size now; 0 when it cannot be read (it is gone)."""
        if self.statm is None:
            return 0
        try:
            return int(os.pread(self.statm, 128, 0).split()[1]) * _PAGE_SIZE
        except (OSError, IndexError, ValueError):
            return 0

    def close_statm(self) -> None:
        if self.statm is not None:
            os.close(self.statm)
            self.statm = None

    def begin(self, job: _Job, frame: bytes) -> None:
        self.job = job
        self.wire.write(frame)

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
        self.wire.write(_EXIT_FRAME)

    def on_lost(self) -> None:
        """EOF on the pipe or the sentinel fired: the child is dead or dying."""
        if self.gone:
            return
        self.gone = self.doomed = True
        self.pool.loop.remove_reader(self.sentinel)
        self.wire.drain()
        self.wire.close()
        self.pool._on_child_lost(self)

    def _on_message(self, payload: bytes) -> None:
        try:
            message = pickle.loads(payload)  # noqa: S301 - our own child, private socketpair
        except Exception as exc:  # noqa: BLE001 - any unpickling failure
            detail = f"cannot unpickle a message from pool child {self.pid}: {_kind(exc)}: {exc}"
            self.abort(RemoteJobError("UnpicklableResult", detail), "bad_message")
            return
        tag = message[0]
        if tag == "progress":
            self._on_progress(message[1], message[2])
        elif tag == "rpc":
            self._on_rpc(message[1], message[2])
        elif tag == "ready":
            _resolve(self.booted, None)
        elif tag == "boot_error":
            error = f"pool child cannot load app {self.pool.app_ref!r}: {message[1]}"
            _fail(self.booted, ConfigurationError(error))
        elif self.job is not None and not self.job.future.done():
            if tag == "ok":
                self.job.future.set_result(message[1])
            else:
                self.job.future.set_exception(_outcome_error(message))

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
        task = self.pool.loop.create_task(self._answer(job, method, argument))
        job.rpcs.add(task)
        task.add_done_callback(job.rpcs.discard)

    async def _answer(self, job: _Job, method: str, argument: Any) -> None:
        reply: tuple[Any, ...]
        try:
            if method == "checkpoint":
                await job.host.checkpoint(argument)
                reply = ("reply", True, None)
            else:
                reply = ("reply", True, bool(await job.host.once(argument)))
        except Exception as exc:  # noqa: BLE001 - handed to the job, which decides
            reply = ("reply", False, _portable(exc))
        if not self.doomed:
            self.wire.write(_frame(reply))


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _outcome_error(message: tuple[Any, ...]) -> Exception:
    """The parent-side exception for a job's failure frame."""
    tag = message[0]
    if tag == "permanent":
        return Permanent(message[1])
    if tag == "retry":
        return Retry(message[1], delay=message[2])
    return RemoteJobError(message[1], message[2], message[3])


def _portable(exc: Exception) -> BaseException:
    """``exc`` if it survives pickling, else a ``RemoteJobError`` with the same message."""
    try:
        pickle.loads(pickle.dumps(exc, _PROTOCOL))  # noqa: S301 - round trip of our own bytes
    except Exception:  # noqa: BLE001 - any pickling failure
        return RemoteJobError(_kind(exc), str(exc), "")
    return exc


def _report_watch_end(task: asyncio.Task[None]) -> None:
    """The memory watcher only ends when the pool closes; anything else is a bug to see."""
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("procpool_memory_watch_failed", exc_info=error)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


async def _wait_exit(process: BaseProcess) -> int | None:
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


def _kill_all(processes: dict[int, BaseProcess]) -> None:
    """Finalizer: SIGKILL children left behind by a pool that was never closed."""
    for process in list(processes.values()):
        with contextlib.suppress(OSError, ValueError):
            process.kill()


_State = Literal["new", "starting", "running", "closing", "closed"]


class ProcessPool:
    """A fixed number of child processes, each running one job at a time.

    ``start()`` waits until every child has imported the app; ``run()`` hands a
    job to an idle child (FIFO among waiters) and returns its result;
    ``close()`` lets busy children finish within ``grace`` and kills the rest.
    ``max_memory_mb`` (0: no limit) kills and replaces a child whose resident
    memory goes over it; ``max_jobs`` (0: never) replaces a child after that
    many jobs (see the module docstring).
    """

    def __init__(
        self,
        size: int,
        app_ref: str,
        *,
        start_method: str = "spawn",
        max_memory_mb: int = 0,
        max_jobs: int = 0,
        memory_poll_seconds: float = 0.1,
    ) -> None:
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
        try:
            context = multiprocessing.get_context(start_method)
        except ValueError as exc:
            raise ConfigurationError(f"unknown process start method {start_method!r}") from exc
        # typeshed types get_context(str) as BaseContext, which lacks the Process attribute
        self._new_process: Callable[..., BaseProcess] = context.Process  # type: ignore[attr-defined]
        self._size = size
        self.app_ref = app_ref
        self.max_memory_mb = max_memory_mb
        self.max_memory_bytes = max_memory_mb * _MB
        self.max_jobs = max_jobs
        self._memory_poll_seconds = memory_poll_seconds
        self._memory_watch: asyncio.Task[None] | None = None
        self.replaced: dict[str, int] = dict.fromkeys(REPLACE_REASONS, 0)
        """Children replaced while running, by reason (``REPLACE_REASONS``); for metrics."""
        self._state: _State = "new"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._children: set[_Child] = set()
        self._idle: deque[_Child] = deque()
        self._waiters: deque[asyncio.Future[_Child]] = deque()
        self._replacing: set[asyncio.Task[None]] = set()
        self._reaping: set[asyncio.Task[None]] = set()
        self._processes: dict[int, BaseProcess] = {}
        self._finalizer = Finalize(self, _kill_all, args=(self._processes,), exitpriority=10)

    # --- properties ---------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise PoolClosed("process pool is not started; call start() first")
        return self._loop

    @property
    def size(self) -> int:
        return self._size

    @property
    def busy(self) -> int:
        """Children running a job."""
        return sum(1 for child in self._children if child.job is not None)

    @property
    def idle(self) -> int:
        """Children waiting for a job."""
        return len(self._idle)

    @property
    def alive(self) -> int:
        """Children that have loaded the app and can take jobs (idle or busy)."""
        return len(self.pids)

    @property
    def closed(self) -> bool:
        """True once ``close()`` has begun (or a start failed): ``run()`` is refused."""
        return self._state in ("closing", "closed")

    @property
    def pids(self) -> list[int]:
        """Process ids of the children counted by ``alive`` (not one running its last job)."""
        return [
            child.pid
            for child in self._children
            if child.ready and not child.doomed and not child.retiring
        ]

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
                *(self._boot() for _ in range(self._size)), return_exceptions=True
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
        for child in results:
            if isinstance(child, _Child):
                self._release(child)
        if self.max_memory_bytes:
            self._memory_watch = self.loop.create_task(
                self._watch_memory(), name="coldbrew-pool-memory-watch"
            )
            self._memory_watch.add_done_callback(_report_watch_end)
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
        for child in list(self._children):
            child.kill("start_failed")
        await self._reap_all()
        self._finalizer()

    async def close(self, grace: float = 5.0) -> None:
        """Stop: idle children exit now, busy ones may finish within ``grace`` s, then are killed.

        Idempotent. Waiting ``run()`` calls raise ``PoolClosed``, as do jobs killed at the end.
        """
        if self._state in ("new", "closed"):
            self._state = "closed"
            return
        if self._state == "closing":
            await self._reap_all()
            return
        self._state = "closing"
        if self._memory_watch is not None:
            self._memory_watch.cancel()
            await asyncio.gather(self._memory_watch, return_exceptions=True)
        while self._waiters:
            _fail(self._waiters.popleft(), PoolClosed("process pool closed while waiting"))
        for task in self._replacing:
            task.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)
        while self._idle:
            self._idle.popleft().request_exit()
        exits = [child.exited for child in self._children]
        if exits:
            await asyncio.wait(exits, timeout=grace)
        for child in list(self._children):
            if not child.exited.done():
                error = PoolClosed(f"process pool closed; job killed after {grace:g} s grace")
                child.abort(error, "closed")
        await self._reap_all()
        self._state = "closed"
        self._finalizer()
        log.debug("procpool_closed", app=self.app_ref)

    async def _reap_all(self) -> None:
        while self._children or self._reaping:
            await asyncio.gather(
                *(child.exited for child in self._children), *self._reaping, return_exceptions=True
            )

    # --- children -----------------------------------------------------------

    def _spawn(self) -> _Child:
        parent_sock, child_sock = socket.socketpair()
        process = self._new_process(
            target=_child_main, args=(child_sock, self.app_ref), name="coldbrew-pool", daemon=True
        )
        try:
            process.start()
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        child = _Child(self, process, parent_sock)
        self._children.add(child)
        self._processes[child.pid] = process
        return child

    async def _boot(self) -> _Child:
        child = self._spawn()
        try:
            await asyncio.shield(child.booted)
        except BaseException:
            # Nobody awaits the boot future any more: mark its outcome as seen.
            child.booted.add_done_callback(_ignore_outcome)
            child.kill("boot_failed")
            raise
        rss = child.resident_bytes()
        if self.max_memory_bytes and rss > self.max_memory_bytes:
            child.kill("boot_failed")
            raise ConfigurationError(
                f"a pool child uses {rss / _MB:.0f} MB of memory once it has loaded "
                f"{self.app_ref!r}, over COLDBREW_PROCESS_MAX_MEMORY_MB={self.max_memory_mb}: "
                "no job could run; raise the limit"
            )
        child.ready = True
        return child

    def _on_child_lost(self, child: _Child) -> None:
        with contextlib.suppress(ValueError):
            self._idle.remove(child)
        task = self.loop.create_task(self._reap(child), name=f"coldbrew-pool-reap-{child.pid}")
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def _reap(self, child: _Child) -> None:
        """Collect a dead child's exit status, fail what it was doing, and replace it."""
        code = await _wait_exit(child.process)
        if code is not None:
            child.process.close()
        child.close_statm()
        self._processes.pop(child.pid, None)
        self._children.discard(child)
        how = _describe_exit(code)
        _fail(
            child.booted,
            ConfigurationError(f"pool child for {self.app_ref!r} {how} before loading the app"),
        )
        job = child.job
        if job is not None:
            error = f"pool child {child.pid} running job {job.job_type!r} {job.job_id} {how}"
            _fail(job.future, WorkerCrashed(error))
        _resolve(child.exited, code)
        _resolve(child.last_job_done, None)
        if child.ready and self._state == "running":
            reason = child.kill_reason
            self.replaced[_REASON_OF_KILL.get(reason or "crashed", "other")] += 1
            if reason is None:
                job_id = None if job is None else job.job_id
                log.warning("procpool_child_died", pid=child.pid, how=how, job_id=job_id)
            elif reason == "max_jobs":
                log.debug("procpool_child_recycled", pid=child.pid, jobs=child.jobs_started)
            else:
                log.info("procpool_child_replaced", pid=child.pid, reason=reason)
            if not child.retiring:  # a retiring child's successor is already booting
                self._start_replacement()

    def _start_replacement(self, predecessor: _Child | None = None) -> None:
        task = self.loop.create_task(self._replace(predecessor), name="coldbrew-pool-replace")
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self, predecessor: _Child | None = None) -> None:
        """Boot a replacement child, retrying with backoff while the pool is running.

        With ``predecessor`` (a child running its last job), the new child
        boots now but takes work only once that job is over, so the pool
        never runs more than ``size`` jobs at a time.
        """
        delay = 0.5
        while self._state == "running":
            try:
                child = await self._boot()
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
            self._release(child)
            return

    async def _watch_memory(self) -> None:
        """Every ``memory_poll_seconds``, kill the children whose RSS is over the limit."""
        while True:
            await asyncio.sleep(self._memory_poll_seconds)
            for child in list(self._children):
                if child.ready and not child.doomed:
                    self._check_memory(child)

    def _check_memory(self, child: _Child) -> bool:
        """Kill ``child`` if it is over the memory limit; True when it was killed.

        A busy child's job fails with ``MemoryLimitExceeded``; a job whose
        result has already arrived keeps it (the child is killed all the same).
        """
        rss = child.resident_bytes()
        if rss <= self.max_memory_bytes:
            return False
        child.wire.drain()  # a result already written wins over the kill
        job = child.job
        running = job is not None and not job.future.done()
        log.warning(
            "procpool_child_over_memory",
            pid=child.pid,
            rss_mb=round(rss / _MB),
            limit_mb=self.max_memory_mb,
            job_id=job.job_id if running and job is not None else None,
        )
        if running and job is not None:
            message = (
                f"pool child {child.pid} running job {job.job_type!r} {job.job_id} was killed: "
                f"its resident memory reached {rss / _MB:.0f} MB, over the limit of "
                f"{self.max_memory_mb} MB (COLDBREW_PROCESS_MAX_MEMORY_MB)"
            )
            error = MemoryLimitExceeded(message, limit_bytes=self.max_memory_bytes, rss_bytes=rss)
            child.abort(error, "memory")
        else:
            child.kill("memory")
        return True

    def _release(self, child: _Child) -> None:
        """Hand an idle child to the oldest waiter, or park it."""
        if child.doomed:
            return
        if self._state != "running":
            child.request_exit()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(child)
                return
        self._idle.append(child)

    async def _acquire(self) -> _Child:
        while True:
            if self._idle and not self._waiters:
                child = self._idle.popleft()
            else:
                waiter: asyncio.Future[_Child] = self.loop.create_future()
                self._waiters.append(waiter)
                try:
                    child = await waiter
                except asyncio.CancelledError:
                    if waiter.done() and not waiter.cancelled():
                        self._release(waiter.result())
                    elif waiter in self._waiters:
                        self._waiters.remove(waiter)
                    raise
            if not child.doomed:
                return child

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
        frame = _frame(("job", job_type, args, dict(info)))
        child = await self._acquire()
        child.jobs_started += 1
        if self.max_jobs and child.jobs_started >= self.max_jobs:
            child.retiring = True  # this is its last job: boot its successor meanwhile
            self._start_replacement(child)
        job = _Job(str(info.get("job_id", "")), job_type, host, self.loop.create_future())
        timer = None
        if timeout is not None:
            timer = self.loop.call_later(timeout, self._expire, child, job, timeout)
        child.begin(job, frame)
        try:
            return await job.future
        except asyncio.CancelledError:
            child.abort(None, "caller_cancelled")  # nobody waits for the result: stop the work
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._finish(child, job)

    def _expire(self, child: _Child, job: _Job, timeout: float) -> None:
        if not job.future.done():
            what = f"job {job.job_type!r} {job.job_id}"
            child.abort(JobTimeout(f"{what} timed out after {timeout:g} s"), "timeout")

    def _finish(self, child: _Child, job: _Job) -> None:
        for task in job.rpcs:
            task.cancel()
        if child.job is job:
            child.job = None
        if child.doomed:
            return
        if self.max_memory_bytes and self._check_memory(child):
            return  # the job left it over the limit: the next job gets a fresh child
        if child.retiring:
            child.request_exit("max_jobs")
            _resolve(child.last_job_done, None)
            return
        self._release(child)

    def cancel(self, job_id: str) -> bool:
        """Kill the child running ``job_id`` (its ``run()`` raises ``JobCancelled``)."""
        found = False
        for child in list(self._children):
            job = child.job
            if job is not None and job.job_id == job_id and not job.future.done():
                child.abort(JobCancelled(f"job {job_id!r} was cancelled"), "cancelled")
                found = True
        return found
