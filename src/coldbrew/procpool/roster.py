"""A pool's children and who gets the next free one.

Why its own object: the pool (handing jobs out and taking children back),
the keeper (adding booted children, dropping dead ones) and the memory watch
(sampling them) all work on the same set of children, and the hand-off
between a freed child and the oldest waiting ``run()`` must stay in one
place to stay FIFO. It holds no policy about *why* a child comes or goes.

Why a waiter is a callback and not a future: the freed child is handed to
the oldest waiter, and that waiter's job framed and written to it, in the
very callback that read the previous job's result (``Waiter.start``). With a
future, the hand-off waited for two turns of the worker's event loop (the
finished ``run()`` resuming, then the waiting one), each behind whatever else
the loop had ready -- ~12% of the children's time idle in a busy worker
(issue #19 item 4).
"""

from __future__ import annotations

import contextlib
from collections import deque
from multiprocessing.process import BaseProcess
from typing import Protocol

from coldbrew.procpool.errors import PoolClosed
from coldbrew.procpool.handle import ChildHandle

__all__ = ["Roster", "Waiter"]


class Waiter(Protocol):
    """A job waiting for a child (the pool's): started in the child it is handed."""

    def start(self, child: ChildHandle) -> None:
        """Take ``child`` and begin the job in it, now (called from a loop callback)."""

    def fail(self, error: BaseException) -> None:
        """The pool closed before a child was free: the job fails with ``error``."""


class Roster:
    """Every child of one pool, the idle ones, and the ``run()`` calls waiting for one."""

    def __init__(self) -> None:
        self.running = False
        """True while the pool is running: only then is a freed child parked or handed out
        (else it is told to exit), and only then is a lost child replaced."""
        self.children: set[ChildHandle] = set()
        self.processes: dict[int, BaseProcess] = {}
        """By pid, for the finalizer that kills what a never-closed pool left behind."""
        self._idle: deque[ChildHandle] = deque()
        self._waiters: deque[Waiter] = deque()

    @property
    def idle(self) -> int:
        """Children waiting for a job."""
        return len(self._idle)

    @property
    def waiting(self) -> int:
        """``run()`` calls waiting for a child (a cancelled one may count until it is skipped)."""
        return len(self._waiters)

    @property
    def busy(self) -> int:
        """Children running a job."""
        return sum(1 for child in self.children if child.job is not None)

    @property
    def pids(self) -> list[int]:
        """Process ids of the children that can take jobs (not one running its last job)."""
        return [
            child.pid
            for child in self.children
            if child.ready and not child.doomed and not child.retiring
        ]

    def add(self, child: ChildHandle) -> None:
        """A child was spawned (it is not free until ``release``)."""
        self.children.add(child)
        self.processes[child.pid] = child.process

    def forget(self, child: ChildHandle) -> None:
        """A child died or is dying: never hand it out again."""
        with contextlib.suppress(ValueError):
            self._idle.remove(child)

    def discard(self, child: ChildHandle) -> None:
        """A child was reaped: nothing is left of it."""
        self.processes.pop(child.pid, None)
        self.children.discard(child)

    def release(self, child: ChildHandle) -> None:
        """Hand an idle child to the oldest waiter (its job begins now), or park it."""
        if child.doomed:
            return
        if not self.running:
            child.request_exit()
            return
        if self._waiters:
            self._waiters.popleft().start(child)
            return
        self._idle.append(child)

    def take_idle(self) -> ChildHandle | None:
        """An idle child for a new job, or None when there is none or others wait (FIFO)."""
        if self._waiters:
            return None
        while self._idle:
            child = self._idle.popleft()
            if not child.doomed:
                return child
        return None

    def wait(self, waiter: Waiter) -> None:
        """Queue ``waiter`` for the next free child (behind earlier waiters)."""
        self._waiters.append(waiter)

    def unwait(self, waiter: Waiter) -> None:
        """``waiter`` gave up before it got a child."""
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def fail_waiters(self) -> None:
        """The pool is closing: every ``run()`` still waiting for a child raises ``PoolClosed``."""
        while self._waiters:
            self._waiters.popleft().fail(PoolClosed("process pool closed while waiting"))

    def exit_idle(self) -> None:
        """Tell every idle child to exit now (the pool is closing)."""
        while self._idle:
            self._idle.popleft().request_exit()
