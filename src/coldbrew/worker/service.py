"""What every background service of a worker is, and the one way they wait out an outage.

A service is a named coroutine ``run(stop)`` that works until ``stop`` is set
(River's maintenance services, Oban's plugins). The supervisor starts every
service in one ``TaskGroup``: an exception that escapes ``run`` is a bug and
fatal, never silent. What is *not* a bug -- PostgreSQL or RabbitMQ being
unreachable for a while -- is waited out here, with one backoff policy, so
that no loop writes its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Protocol, TypeVar

import structlog

from coldbrew.errors import BrokerUnavailable, DatabaseUnavailable

log = structlog.get_logger("coldbrew.worker")

T = TypeVar("T")

UNAVAILABLE: tuple[type[Exception], ...] = (DatabaseUnavailable, BrokerUnavailable)
"""The errors a service waits out rather than dies of."""


class Service(Protocol):
    """One background loop of a worker."""

    @property
    def name(self) -> str:
        """The task's name in logs and in the supervisor's ``TaskGroup``."""
        ...

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set; return soon after it is."""
        ...


async def sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile."""
    with suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def sleep_until_woken(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stop`` or ``wake`` is set meanwhile; clear ``wake``."""
    if not wake.is_set():
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
    wake.clear()


class Backoff:
    """Delays that double from ``first`` up to ``cap`` while a service stays away.

    ``reset()`` after a success: the next outage starts from ``first`` again.
    """

    __slots__ = ("_next", "cap", "first")

    def __init__(self, first: float = 0.2, cap: float = 5.0) -> None:
        self.first = first
        self.cap = cap
        self._next = first

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self._next = self.first


async def until_available(
    op: Callable[[], Awaitable[T]],
    *,
    event: str,
    give_up: Callable[[], bool] = lambda: False,
    on_unavailable: Callable[[Exception], None] | None = None,
    backoff: Backoff | None = None,
) -> T | None:
    """Retry ``op`` while PostgreSQL or RabbitMQ is unreachable; None once ``give_up()``.

    Each failure is logged as ``event`` and told to ``on_unavailable`` (health
    reporting); anything but the unavailability errors propagates at once.
    """
    delays = backoff  # made at the first failure: the claim path calls this per job
    while True:
        try:
            return await op()
        except UNAVAILABLE as exc:
            if on_unavailable is not None:
                on_unavailable(exc)
            if give_up():
                return None
            if delays is None:
                delays = Backoff()
            delay = delays.next_delay()
            log.warning(event, error=str(exc), retry_in=delay)
            await asyncio.sleep(delay)


class Periodic:
    """A service that calls ``step`` every ``interval``, and again at once after a full batch.

    ``step`` returns how much it did; a result of ``full_batch`` or more means
    more work is waiting. Outages are logged and retried with ``Backoff``.
    ``wait``, if given, says how long to sleep after a step that was not full
    (the relay wakes at the next scheduled job's time); ``interval`` otherwise.
    ``wake``, if given, ends that sleep as soon as it is set.
    """

    def __init__(
        self,
        name: str,
        step: Callable[[], Awaitable[int]],
        *,
        interval: float,
        full_batch: int,
        backoff_cap: float = 30.0,
        wait: Callable[[], float] | None = None,
        wake: asyncio.Event | None = None,
    ) -> None:
        self.name = name
        self.step = step
        self.interval = interval
        self.full_batch = full_batch
        self.backoff_cap = backoff_cap
        self.wait = wait
        self.wake = wake
        """Set by someone who knows work is due (a NOTIFY): ends the sleep early."""

    async def run(self, stop: asyncio.Event) -> None:
        backoff = Backoff(first=self.interval * 2, cap=max(self.backoff_cap, self.interval))
        while not stop.is_set():
            try:
                done = await self.step()
            except UNAVAILABLE as exc:
                delay = backoff.next_delay()
                log.warning("loop_step_failed", loop=self.name, error=str(exc), retry_in=delay)
                await sleep_unless(stop, delay)
                continue
            backoff.reset()
            if done < self.full_batch:
                seconds = self.interval if self.wait is None else self.wait()
                if self.wake is None:
                    await sleep_unless(stop, seconds)
                else:
                    await sleep_until_woken(stop, self.wake, seconds)
