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
