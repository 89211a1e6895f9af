"""The consumer hold: what the tenant queues' consumers may deliver, sized by Little's law.

The policy is ``holdsize.py``: hold what starts within ``COLDBREW_HOLD_SECONDS``
at the measured start rate, at least the free slots, at most the cap
(``COLDBREW_PREFETCH``, or 1000), and nothing more once every slot is busy.
This service applies it to the consumers: it pauses them (``basic.cancel``)
when the worker is saturated and holds enough, consumes again as soon as a
slot frees, and re-consumes with a new prefetch when the rate has moved by
half or double (a live ``basic.qos`` does not reach a running consumer).

The intake tells it of each finish and of the load (``note``), a handful of
integer operations per job; the service wakes only when the pause state
should change, or every ``TICK_SECONDS`` to fold the start rate in.

A pause races the acks of the jobs that just started: the broker counts a
delivery against the prefetch until its ack, which follows the claim's
commit, so the ``basic.cancel`` is normally on the wire first. When it is
not, one prefetch's worth more arrives and waits here, as before this hold.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import suppress

import structlog

from coldbrew.holdsize import Consume, HoldLimits, Pause, PrefetchPermit, StartRate, plan
from coldbrew.metrics import Metrics
from coldbrew.settings import Settings
from coldbrew.transport import Broker
from coldbrew.worker.lifecycle import Lifecycle
from coldbrew.worker.service import UNAVAILABLE, Backoff

log = structlog.get_logger("coldbrew.hold")

TICK_SECONDS = 0.25
"""How often the start rate is folded in (and the prefetch reconsidered)."""
RATE_WINDOW_SECONDS = 0.5
"""The start rate's averaging window (a few ticks: a no-op drain reaches its hold in ~1 s)."""
PROBE_SECONDS = 1.0
"""While paused, how often the paused queues are looked at (a passive declare each): a queue
deleted meanwhile sends no basic.cancel to a consumer we do not have."""
PROBE_BATCH = 200
"""Paused queues looked at per probe at most (round robin over more)."""
RESIZE_EVERY_SECONDS = 1.0
"""At most one re-consume with a new prefetch per this (each costs a cancel and a
consume per tenant queue)."""


class ConsumerHold:
    """Pauses, resumes and resizes the tenant queues' consumers as the load says."""

    name = "consumer-hold"

    def __init__(
        self, *, settings: Settings, broker: Broker, lifecycle: Lifecycle, metrics: Metrics
    ) -> None:
        self.limits = HoldLimits(
            concurrency=settings.concurrency,
            hold_seconds=settings.hold_seconds,
            cap=settings.hold_cap,
        )
        self.broker = broker
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.finished = 0
        """Jobs finished so far (the intake counts them): the start rate is read from them.

        In a steady state a worker starts as many jobs as it finishes (Little's
        law), and counting finishes does not mistake a start-up burst (a free
        worker filling its slots at once) for a rate: a worker of 30-second
        jobs finishes nothing for 30 s, so it holds nothing beyond its slots.
        """
        self._rate = StartRate(RATE_WINDOW_SECONDS, time.monotonic())
        self._running = 0
        self._waiting = 0
        self._wake = asyncio.Event()
        self._resized_at = 0.0
        self._probed_at = 0.0
        self.permit = PrefetchPermit(self.initial_prefetch)
        """What the fleet was told this worker's consumers may hold (the reconciler reports
        it); the prefetch rises only within it."""

    @property
    def initial_prefetch(self) -> int:
        """The consumers' prefetch before any job started: the free slots, capped."""
        return self.limits.prefetch(0, 0.0)

    def note(self, running: int, waiting: int) -> None:
        """The intake's load changed: ``running`` jobs, ``waiting`` deliveries held unstarted.

        Wakes the service only when the pause state should flip, so a busy
        worker pays a comparison per job, not a task switch.
        """
        self._running, self._waiting = running, waiting
        consumers = self.broker.consumers
        saturated = running >= self.limits.concurrency
        if consumers.paused:
            if not saturated:
                self._wake.set()
        elif saturated and waiting >= self.limits.soon(self._rate.rate):
            self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        backoff = Backoff(first=TICK_SECONDS, cap=5.0)
        while not stop.is_set() and not self.lifecycle.draining:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=TICK_SECONDS)
            self._wake.clear()
            if stop.is_set() or self.lifecycle.draining:
                return  # the drain cancels every consumer itself
            try:
                await self.apply(time.monotonic())
            except UNAVAILABLE as exc:
                delay = backoff.next_delay()
                log.warning("consumer_hold_failed", error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()

    async def apply(self, now: float) -> None:
        """Fold in the start rate and change the consumers if the plan says so; while paused,
        look for a paused queue that was deleted (``PROBE_SECONDS``)."""
        rate = self._rate.tick(now, self.finished)
        consumers = self.broker.consumers
        action = plan(
            self.limits,
            consuming=not consumers.paused,
            prefetch=consumers.prefetch,
            running=self._running,
            waiting=self._waiting,
            rate=rate,
            may_resize=now - self._resized_at >= RESIZE_EVERY_SECONDS,
        )
        if isinstance(action, Pause):
            await consumers.pause()
            self.metrics.consumer_pauses.inc()
        elif isinstance(action, Consume):
            prefetch = self.permit.ask(action.prefetch)
            if consumers.paused or prefetch != consumers.prefetch:
                if not consumers.paused:
                    self._resized_at = now
                    log.info("consumer_prefetch", prefetch=prefetch, rate=round(rate, 1))
                await consumers.resume(prefetch)
                self.permit.live = consumers.prefetch
        if consumers.paused and now - self._probed_at >= PROBE_SECONDS:
            self._probed_at = now
            await consumers.probe_paused(PROBE_BATCH)
        self.metrics.consumer_prefetch.set(0 if consumers.paused else consumers.prefetch)
