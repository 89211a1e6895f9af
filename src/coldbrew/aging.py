"""Aging inside one tenant's queue: find the low-priority messages RabbitMQ keeps back.

The local scheduler (``scheduler.py``) ages what a worker holds. But each
(lane, tenant) queue is a RabbitMQ priority queue, which always hands out its
highest priority first: under a sustained stream of priority-9 work a
priority-0 message of the *same* tenant is never delivered, and no local
policy can age a message it never sees (bench/fairness.py, aging (b): it ran
12.5 s after publication, only once the stream ended).

``StarvationWatch`` notices the pattern from the deliveries alone, at the
cost of two stores per message. RabbitMQ serves priorities strictly, FIFO
within one, so a delivery of priority ``q`` at instant ``t`` proves that no
message above ``q`` was waiting at ``t``, and that level ``q`` was flowing.
For each level ``p`` the watch derives ``clear(p)``: the last instant it was
known not to be held back -- the last delivery of a priority at or below
``p``, or a sweep that found the level empty. A message of priority ``p``
still hidden in the queue was published after ``clear(p)`` (or before this
worker began to watch), so the watch has an upper bound of its wait without
trusting any producer's clock.

When a level stayed held back for ``window`` seconds while higher-priority
deliveries kept coming, the queue is *due*: the sweeper (the worker's loop)
takes up to ``COLDBREW_AGING_SWEEP_LIMIT`` ready messages through a
short-lived consumer of its own, keeps those of held-back levels (``plan_sweep``)
and hands the rest straight back (``basic.nack`` with requeue: RabbitMQ puts
them back at the head of their priority). A kept message joins the scheduler
as if it had arrived at ``clear(p)``, so it becomes overdue, and runs ahead
of the stream, within ``COLDBREW_AGING_SECONDS`` of its publication
(plus up to one check interval).

Cost: nothing while every active queue also delivers its lowest priority now
and then, or uses priority 0 only (the usual case). A
queue that only ever receives one non-zero priority is swept once per window
while it has a backlog, each sweep moving its ready messages (at most the
limit) over the wire twice; the returned ones come back marked redelivered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from coldbrew.scheduler import MAX_PRIORITY, MIN_PRIORITY

__all__ = ["QueueKey", "StarvationWatch", "SweepPlan", "clamp_priority", "plan_sweep"]

_LEVELS = MAX_PRIORITY - MIN_PRIORITY + 1

QueueKey = tuple[str, str]
"""(lane, tenant): one broker queue."""


@dataclass(slots=True)
class _Levels:
    """One queue's evidence of when each priority level was last not held back."""

    delivered: list[float]  # delivered[q]: last delivery of exactly priority q
    swept: list[float]  # swept[p]: last sweep that found level p empty (start instant)
    last_delivery: float
    last_sweep: float = -float("inf")

    def clears(self) -> list[float]:
        """``clear(p)`` for every level: a delivery at or below ``p``, or a sweep of ``p``."""
        out = []
        run = -float("inf")
        for level in range(_LEVELS):
            run = max(run, self.delivered[level])
            out.append(max(run, self.swept[level]))
        return out


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """What a sweep keeps: message index -> the instant it counts as having arrived."""

    keep: dict[int, float] = field(default_factory=dict)
    cleared: tuple[int, ...] = ()  # levels the sweep proves empty (all their messages kept)


def clamp_priority(priority: int | None) -> int:
    """A message's priority as a level 0..9 (absent: 0)."""
    if priority is None:
        return MIN_PRIORITY
    return min(MAX_PRIORITY, max(MIN_PRIORITY, priority))


class StarvationWatch:
    """Per queue, when each priority level was last not held back; which queues are due.

    Pure (STYLE practice 10): the caller passes monotonic ``now``.
    ``window`` is how long a level may stay held back before its queue is
    swept; the worker uses half of ``COLDBREW_AGING_SECONDS``.
    """

    def __init__(self, window: float) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        self.window = window
        self._queues: dict[QueueKey, _Levels] = {}

    def __len__(self) -> int:
        return len(self._queues)

    def observe(self, key: QueueKey, priority: int, now: float) -> None:
        """A delivery of ``priority`` (0..9) from ``key``'s queue: the hot path, two stores."""
        levels = self._queues.get(key)
        if levels is None:
            # what waited before this worker watched counts from now: no clock to trust
            levels = self._queues[key] = _Levels([now] * _LEVELS, [now] * _LEVELS, now)
        levels.delivered[priority] = now
        levels.last_delivery = now

    def due(self, now: float) -> list[QueueKey]:
        """Queues whose deliveries, for a whole window, all came from above a held-back level.

        Level 9 hides nothing (no priority is above it). A queue swept less
        than a window ago is not due again yet, whatever that sweep found;
        one that delivered nothing since a level was last clear is idle or
        fully held, and is left alone.
        """
        horizon = now - self.window
        found = []
        for key, levels in self._queues.items():
            if levels.last_sweep > horizon:
                continue
            clears = levels.clears()
            if any(
                clear <= horizon and levels.last_delivery > clear for clear in clears[:MAX_PRIORITY]
            ):
                found.append(key)
        return found

    def plan(
        self,
        key: QueueKey,
        priorities: Sequence[int | None],
        *,
        now: float,
        keep_max: int,
        drained: bool,
        oldest: float,
    ) -> SweepPlan:
        """``plan_sweep`` with this queue's levels (nothing is kept for an unknown queue)."""
        levels = self._queues.get(key)
        if levels is None:
            return SweepPlan()
        return plan_sweep(
            priorities,
            levels.clears(),
            now=now,
            window=self.window,
            keep_max=keep_max,
            drained=drained,
            oldest=oldest,
        )

    def swept(self, key: QueueKey, started: float, cleared: Sequence[int]) -> None:
        """Record a sweep of ``key`` begun at ``started`` that left the ``cleared`` levels empty."""
        levels = self._queues.get(key)
        if levels is None:
            return
        levels.last_sweep = started
        for level in cleared:
            levels.swept[level] = max(levels.swept[level], started)


def plan_sweep(
    priorities: Sequence[int | None],
    clear: Sequence[float],
    *,
    now: float,
    window: float,
    keep_max: int,
    drained: bool,
    oldest: float,
) -> SweepPlan:
    """Choose which swept messages to keep, given their priorities in delivery order.

    A message is a candidate when its level has been held back for a whole
    window. At most ``keep_max`` are kept, those whose level has been held
    back longest first, then in delivery order; each counts as having
    arrived when its level was last clear, but no earlier than ``oldest``
    (the worker passes ``now - COLDBREW_AGING_SECONDS``: older is overdue
    anyway). The rest go back to the broker. ``drained``: the sweep took
    every message that was ready, so a level none of whose messages go back
    is empty.
    """
    horizon = now - window
    levels = [clamp_priority(p) for p in priorities]
    candidates = sorted(
        (clear[level], index) for index, level in enumerate(levels) if clear[level] <= horizon
    )
    keep = {index: max(since, oldest) for since, index in candidates[:keep_max]}
    if not drained:
        return SweepPlan(keep, ())
    returned = {level for index, level in enumerate(levels) if index not in keep}
    return SweepPlan(keep, tuple(level for level in range(_LEVELS) if level not in returned))
