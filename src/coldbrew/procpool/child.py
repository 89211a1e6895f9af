"""What runs inside a pool child: load the app once, then run jobs until told to stop.

Why this is all the child does: everything that decides (timeouts, memory,
recycling, replacing) lives in the parent, which can SIGKILL a child whatever
it is doing. The child only turns each job into one outcome frame, so job
code (whatever it raises, or returns that cannot be pickled) can never take
it down or leave the parent waiting without an answer. The child ignores
SIGINT/SIGTERM (the parent owns shutdown) and exits by itself when its
parent goes away.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Any

import structlog

from coldbrew.app import App, load_app
from coldbrew.errors import Permanent, Retry, Snooze
from coldbrew.procpool.protocol import HEADER, error_kind, frame

__all__ = ["ProcessContext", "child_main"]

_ORPHAN_POLL_SECONDS = 1.0


class _ChildChannel:
    """The child's end of the pipe: blocking frames, safe to use from several threads."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()
        self._rpc_lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        self.send_frame(frame(message))

    def send_frame(self, data: bytes) -> None:
        with self._send_lock:
            self._sock.sendall(data)

    def recv(self) -> tuple[Any, ...] | None:
        """The next message from the parent; None when the parent has gone."""
        header = self._reader.read(HEADER.size)
        if len(header) < HEADER.size:
            return None
        (length,) = HEADER.unpack(header)
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
        self.snoozes: int = info.get("snoozes", 0)
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

    def submit(
        self, type: str, args: Mapping[str, Any] | None = None, *, name: str, **options: Any
    ) -> str:
        """Spawn a child job (``Context.submit``, relayed to the parent, which collects it
        for this attempt's outcome); returns its id once the parent checked it."""
        return str(self._channel.call("submit", (type, dict(args or {}), name, options)))

    @property
    def batch(self) -> _ProcessBatch:
        """This job's batch: ``ctx.batch.add(type, args, name=...)``, as a coroutine job's."""
        return _ProcessBatch(self._channel)


class _ProcessBatch:
    """``ctx.batch`` in the pool: ``add`` is relayed to the parent's ``Context``."""

    def __init__(self, channel: _ChildChannel) -> None:
        self._channel = channel

    def add(
        self,
        type: str,
        args: Mapping[str, Any] | None = None,
        *,
        name: str,
        queue: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> str:
        """Add a member to this job's batch and block until it is committed; its id."""
        member = {
            "type": type,
            "args": dict(args or {}),
            "name": name,
            "queue": queue,
            "priority": priority,
            "max_attempts": max_attempts,
            "timeout": timeout,
        }
        return str(self._channel.call("batch_add", member))


def _run_job(app: App, channel: _ChildChannel, message: tuple[Any, ...]) -> bytes:
    """Run one job and return the outcome frame; job code can never take the child down."""
    _, job_type, args, info = message
    trace_id = info.get("trace_id")  # the job's trace, as its worker-side log lines carry it
    try:
        if trace_id is None:
            value = app.get(job_type).func(ProcessContext(channel, info), **args)
        else:
            with structlog.contextvars.bound_contextvars(trace_id=trace_id):
                value = app.get(job_type).func(ProcessContext(channel, info), **args)
    except Snooze as exc:
        return frame(("snooze", exc.seconds))
    except Retry as exc:
        return frame(("retry", str(exc), exc.delay))
    except Permanent as exc:
        return frame(("permanent", str(exc)))
    except BaseException as exc:  # noqa: BLE001 - whatever the job raises is its outcome
        return frame(("error", error_kind(exc), str(exc), traceback.format_exc()))
    if isinstance(value, Snooze):  # ``return Snooze(s)`` is the same as raising it
        return frame(("snooze", value.seconds))
    try:
        return frame(("ok", value))
    except Exception as exc:  # noqa: BLE001 - pickling fails in many ways
        detail = f"the result of {job_type!r} ({type(value).__qualname__}) cannot be pickled: {exc}"
        return frame(("error", "UnpicklableResult", detail, ""))


def _watch_parent(parent_pid: int) -> None:
    """Exit when re-parented: covers a parent killed while the pipe is held open elsewhere."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_ORPHAN_POLL_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, name="coldbrew-orphan-watch", daemon=True).start()


def child_main(sock: socket.socket, app_ref: str, app_dir: str | None = None) -> None:
    """Entry point of a pool child: load the app (from the parent's ``app_dir``), then run jobs."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns shutdown
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _watch_parent(os.getppid())
    channel = _ChildChannel(sock)
    try:
        app = load_app(app_ref, app_dir)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        channel.send(("boot_error", f"{error_kind(exc)}: {exc}"))
        return
    channel.send(("ready", os.getpid()))
    while (message := channel.recv()) is not None and message[0] == "job":
        channel.send_frame(_run_job(app, channel, message))
