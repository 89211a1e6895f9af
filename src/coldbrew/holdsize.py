"""How many deliveries a worker holds: what it will start soon, by Little's law.

A delivery held unacked in one worker is a job no other worker can start. A
fixed prefetch is wrong at both ends: a worker of 30-second jobs with its
slots full held a whole prefetch that another worker, idle, could have run
(issue #19: eight jobs on two workers took three rounds instead of two),
and a worker of no-op jobs starved on it (0.5x a plain consumer at
prefetch 300). So the hold follows the measured start rate::

    soon   = floor(start rate x COLDBREW_HOLD_SECONDS)    # what starts within the horizon
    hold   = min(cap, max(free slots, soon))             # cap: COLDBREW_PREFETCH or 1000

and the worker stops consuming altogether when every slot is busy and it
already holds ``soon`` waiting deliveries: a saturated worker of long jobs
(``soon`` is 0) then holds nothing beyond its running jobs, and the queue
keeps the rest for whichever worker frees a slot first. A free slot always
consumes again, with at least one delivery per tenant queue, so the fair
scheduler still sees every tenant's head whenever it has a slot to give.

Pure policy (STYLE practice 10): no I/O, the caller passes the clock.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

RESIZE_FACTOR = 2
"""A consuming prefetch is changed only when the wanted one is this many times larger or
smaller: each change is a cancel and a consume per tenant queue."""


class StartRate:
    """Jobs started per second: an exponentially weighted mean over about ``window`` s of
    the count the caller passes (the worker passes its finishes: in a steady state they
    are its starts, and a start-up burst is not one)."""

    def __init__(self, window: float, now: float) -> None:
        self.window = window
        self.rate = 0.0
        self._last = now
        self._count = 0

    def tick(self, now: float, count: int) -> float:
        """Fold in the events since the last tick (``count`` counts them all so far)."""
        elapsed = now - self._last
        if elapsed <= 0:
            return self.rate
        instant = (count - self._count) / elapsed
        weight = 1.0 - math.exp(-elapsed / self.window)
        self.rate += weight * (instant - self.rate)
        self._last, self._count = now, count
        return self.rate


@dataclass(frozen=True, slots=True)
class HoldLimits:
    """The settings the hold is sized with."""

    concurrency: int
    hold_seconds: float
    cap: int

    def soon(self, rate: float) -> int:
        """Waiting deliveries worth holding beyond the free slots: those that start within
        the horizon at ``rate``."""
        return min(self.cap, math.floor(rate * self.hold_seconds))

    def prefetch(self, running: int, rate: float) -> int:
        """The prefetch a consumer gets now: the free slots or the horizon's starts, capped."""
        free = max(0, self.concurrency - running)
        return max(1, min(self.cap, max(free, self.soon(rate))))


@dataclass(frozen=True, slots=True)
class Pause:
    """Cancel the tenant queues' consumers: the worker holds enough."""


@dataclass(frozen=True, slots=True)
class Consume:
    """Consume the tenant queues (again) with this prefetch."""

    prefetch: int


def plan(
    limits: HoldLimits,
    *,
    consuming: bool,
    prefetch: int,
    running: int,
    waiting: int,
    rate: float,
    may_resize: bool,
) -> Pause | Consume | None:
    """What to change, if anything, given the consumers' state and the worker's load.

    ``waiting``: deliveries held here and not started. Pause only when every
    slot is busy (then nothing new could start anyway, so caps, paused
    tenants and fairness lose nothing); a free slot always consumes.
    """
    soon = limits.soon(rate)
    if running >= limits.concurrency and waiting >= soon:
        return Pause() if consuming else None
    want = limits.prefetch(running, rate)
    if not consuming:
        return Consume(want)
    if may_resize and (want >= prefetch * RESIZE_FACTOR or want * RESIZE_FACTOR <= prefetch):
        return Consume(want)
    return None


class PrefetchPermit:
    """The prefetch the consumers may use: never more than the fleet was last told.

    The reconciler bounds a tenant queue's unacked deliveries with the
    prefetch each worker reported (worker/reconcile.py); a consumer whose
    prefetch rose after the report could hold more than a look allows for,
    and its deliveries would look lost. So a rise waits for a report: the
    hold asks (``ask``), the reconciler reports ``claim()`` and, once that
    report is committed, ``confirmed`` grants it. A fall takes effect at
    once (``claim`` lowers the grant before the report is written).
    """

    def __init__(self, initial: int) -> None:
        self.granted = initial
        """The largest prefetch the hold may use now (a committed report covers it)."""
        self.wanted = initial
        """What the hold would use if it could."""
        self.live = initial
        """The prefetch the consumers were last started with."""
        self.asked = asyncio.Event()
        """Set when more than the grant is wanted (the reconciler then reports early)."""

    def ask(self, want: int) -> int:
        """The prefetch to use for ``want``: at most what is granted (``pending`` says if
        more was asked)."""
        self.wanted = want
        if want > self.granted:
            self.asked.set()
        return min(want, self.granted)

    @property
    def pending(self) -> bool:
        """Whether a report should be made soon: the hold wants more than it may use."""
        return self.wanted > self.granted

    def claim(self) -> int:
        """What the next report says this worker's consumers may hold: the live prefetch or
        the wanted one, whichever is larger; the grant drops to it at once."""
        value = max(self.live, self.wanted)
        self.granted = min(self.granted, value)
        return value

    def confirmed(self, value: int) -> None:
        """A report saying ``value`` is committed: the hold may use up to it."""
        self.granted = value
