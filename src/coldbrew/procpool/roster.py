"""A pool's children and who gets the next free one.

Why its own object: the pool (handing jobs out and taking children back),
the keeper (adding booted children, dropping dead ones) and the memory watch
(sampling them) all work on the same set of children, and the hand-off
between a freed child and the oldest waiting ``run()`` must stay in one
place to stay FIFO. It holds no policy about *why* a child comes or goes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from multiprocessing.process import BaseProcess

from coldbrew.procpool.errors import PoolClosed
from coldbrew.procpool.futures import fail
from coldbrew.procpool.handle import ChildHandle

__all__ = ["Roster"]


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
        self._waiters: deque[asyncio.Future[ChildHandle]] = deque()

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
        """Hand an idle child to the oldest waiter, or park it."""
        if child.doomed:
            return
        if not self.running:
            child.request_exit()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(child)
                return
        self._idle.append(child)

    async def acquire(self) -> ChildHandle:
        """The next free child, waiting (FIFO) behind earlier callers when none is idle."""
        while True:
            if self._idle and not self._waiters:
                child = self._idle.popleft()
            else:
                waiter: asyncio.Future[ChildHandle] = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    child = await waiter
                except asyncio.CancelledError:
                    if waiter.done() and not waiter.cancelled():
                        self.release(waiter.result())
                    elif waiter in self._waiters:
                        self._waiters.remove(waiter)
                    raise
            if not child.doomed:
                return child

    def fail_waiters(self) -> None:
        """The pool is closing: every ``run()`` still waiting for a child raises ``PoolClosed``."""
        while self._waiters:
            fail(self._waiters.popleft(), PoolClosed("process pool closed while waiting"))

    def exit_idle(self) -> None:
        """Tell every idle child to exit now (the pool is closing)."""
        while self._idle:
            self._idle.popleft().request_exit()
