"""Fair local scheduler: which held delivery runs next when a job slot frees.

The worker consumes many per-tenant queues with a small prefetch each, so it
holds the head of every tenant's queue at once. ``FairScheduler`` picks among
them (DESIGN guarantee 7, "fair and bounded waiting"). It is pure policy
(STYLE practice 10): no I/O, no clock -- the caller passes monotonic ``now``
and each item's ``enqueued_at``.

Policy
------
1. **Aging.** An item's effective priority is::

       min(TOP_CLASS, priority + floor((now - enqueued_at) / aging_seconds))

   with ``TOP_CLASS = 10``, one above the highest real priority (k = 1). An
   item gains one level per ``aging_seconds`` of waiting. A priority-p item
   ties fresh priority-9 work after ``(9 - p) * aging_seconds`` and wins the
   tie (it is older than its own tenant's fresh items, and another tenant's
   stream is served in turn with it), and reaches the cap after
   ``(10 - p) * aging_seconds``, where it also catches up with priority-9
   work that has itself been waiting -- the case when priority-9 work
   arrives faster than it is served. Why the cap is 10: it is the smallest
   cap that lets aged work overtake any priority-9 work, and every level
   above it only lengthens the worst case of a priority-0 job
   (``(9 + k) * aging_seconds``) without helping anyone. An item in the top
   class is simply *overdue*, and overdue items are served oldest first
   rather than by ever-growing age scores, so a sustained overload cannot
   starve anyone: once overdue, an item waits for at most about one round of
   tenants plus its own tenant's older overdue items. The worker passes one
   tenth of ``COLDBREW_AGING_SECONDS`` here, so that setting is the longest
   a held priority-0 job waits before it is overdue.
2. **Class first.** The highest effective priority class with an eligible
   tenant wins.
3. **Tenants within the class** are served in weighted fair order. This is
   deficit round robin in its virtual-time form (stride scheduling): each
   tenant has a ``pass`` value; serving it adds ``1 / weight``; the tenant
   with the lowest ``pass`` goes next (ties: the one that has waited longest
   in the class). Long-run shares are proportional to the weights, exactly
   as with DRR, but service is interleaved (A B A A B A ...) instead of in
   bursts of ``weight`` items, and the pick is one heap operation instead of
   a walk around a ring that would have to step over tenants that are in a
   lower class or ineligible. A tenant that becomes active starts at the
   current virtual time (it brings no saved credit, but keeps any debt from
   a moment ago), so a newcomer waits at most about one round however many
   items another tenant holds.
4. **Within a tenant**: effective priority descending, then oldest first
   (``enqueued_at``, then push sequence).
5. ``eligible(tenant) is False`` (paused, or at its fleet-wide cap) skips the
   tenant for this pick; its items stay and it is not charged. If every
   tenant of the top class is ineligible, the next class is served (the
   scheduler never idles while eligible work waits).

Data structures and cost
------------------------
Each tenant keeps one heap per priority level, keyed by
``(enqueued_at, seq)``. Within one level effective priority is a
non-decreasing function of age, so the oldest item of a level is that
level's best, and the tenant's best item is the best of at most ten heads.
(A single heap keyed by ``(-priority, enqueued_at)`` would *not* do: an old
priority-0 item can outrank a fresh priority-9 item of the same tenant.)

A tenant's class -- the effective priority of its best item -- only changes
when items are added or removed, or at a predictable instant: the earliest
time a level head crosses the next aging boundary. Each non-empty tenant has
one live entry in the heap of its class, keyed by ``(pass, stamp)``, and one
in a promotion heap keyed by that instant. ``pop`` first applies the
promotions that are due, then takes the lowest ``pass`` from the highest
non-empty class: O(log tenants) per push or pop, plus O(log tenants) per
promotion (at most about ten per item over its life) and per ineligible
tenant skipped. Superseded heap entries are dropped lazily and compacted
when they outnumber the live ones.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "TOP_CLASS",
    "FairScheduler",
    "Pending",
    "effective_priority",
]

T = TypeVar("T")

MIN_PRIORITY = 0
MAX_PRIORITY = 9
TOP_CLASS = MAX_PRIORITY + 1
"""Cap of the effective priority: overdue items of every priority meet here."""

_LEVELS = MAX_PRIORITY - MIN_PRIORITY + 1
_INF = math.inf

# heap entries: (key, stamp, tenant) for the class and promotion heaps, and
# (enqueued_at, seq, item) for a tenant's level heaps; stamps and seqs are
# unique, so tuples never compare past them.
_Entry = tuple[float, int, str]


@dataclass(slots=True)  # built per job: not frozen, a frozen __init__ costs ~2.5x
class Pending(Generic[T]):
    """A held delivery waiting for a job slot.

    ``seq`` is assigned by ``FairScheduler.push`` (leave it at the default);
    ``priority`` is clamped into 0..9 there.
    """

    tenant: str
    priority: int
    enqueued_at: float
    payload: T
    seq: int = -1


def effective_priority(priority: int, enqueued_at: float, now: float, aging_seconds: float) -> int:
    """``min(TOP_CLASS, priority + floor(age / aging_seconds))``, age clamped at 0."""
    limit = TOP_CLASS - priority
    return min(TOP_CLASS, priority + _aging_steps(enqueued_at, now, aging_seconds, limit))


def _aging_steps(enqueued_at: float, now: float, aging: float, limit: int) -> int:
    """The largest ``k`` in ``[0, limit]`` with ``enqueued_at + k * aging <= now``.

    Computed with the very expression used for promotion instants, so a
    promotion that is due always finds its item promoted (no float drift).
    """
    if limit <= 0 or enqueued_at + aging > now:
        return 0
    ratio = (now - enqueued_at) / aging
    k = limit if ratio >= limit else int(ratio)
    while k < limit and enqueued_at + (k + 1) * aging <= now:
        k += 1
    while k > 0 and enqueued_at + k * aging > now:
        k -= 1
    return k


class _Tenant(Generic[T]):
    """One tenant's pending items and its place in the class and promotion heaps."""

    __slots__ = ("count", "cstamp", "klass", "levels", "name", "pass_", "promo_at", "pstamp")

    def __init__(self, name: str) -> None:
        self.name = name
        self.levels: list[list[tuple[float, int, Pending[T]]]] = [[] for _ in range(_LEVELS)]
        self.count = 0
        self.pass_ = 0.0
        self.klass = -1  # class of the live class-heap entry; -1: none
        self.cstamp = -1
        self.promo_at = _INF  # instant of the live promotion entry; inf: none
        self.pstamp = -1


class FairScheduler(Generic[T]):
    """Picks the next held delivery by aged priority, then weighted fair share of tenants."""

    def __init__(
        self, *, aging_seconds: float = 3.0, weights: Mapping[str, float] | None = None
    ) -> None:
        """``aging_seconds``: waiting time worth one priority level (see module docs)."""
        if not (math.isfinite(aging_seconds) and aging_seconds > 0):
            raise ValueError(f"aging_seconds must be a finite number > 0, got {aging_seconds}")
        self._aging = aging_seconds
        self._weights: dict[str, float] = {}
        for tenant, weight in (weights or {}).items():
            self.set_weight(tenant, weight)
        self._tenants: dict[str, _Tenant[T]] = {}
        self._classes: list[list[_Entry]] = [[] for _ in range(TOP_CLASS + 1)]
        self._promos: list[_Entry] = []
        self._count = 0
        self._seq = 0
        self._stamp = 0
        self._stale = 0
        self._vtime = 0.0
        self._now = -_INF
        self.clamped = 0
        """How many pushed items had a priority outside 0..9 (and were clamped)."""

    # --- public API ------------------------------------------------------------

    def set_weight(self, tenant: str, weight: float) -> None:
        """Give ``tenant`` ``weight`` times the default share (1.0) of its class."""
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"weight of tenant {tenant!r} must be > 0, got {weight}")
        self._weights[tenant] = weight

    def push(self, item: Pending[T]) -> None:
        """Hold ``item`` until it is picked; assigns its ``seq`` and clamps its priority."""
        if not math.isfinite(item.enqueued_at):
            raise ValueError(f"enqueued_at must be finite, got {item.enqueued_at}")
        priority = min(MAX_PRIORITY, max(MIN_PRIORITY, item.priority))
        if priority != item.priority:
            self.clamped += 1
        self._seq += 1
        item = Pending(item.tenant, priority, item.enqueued_at, item.payload, self._seq)
        tenant = self._tenants.get(item.tenant)
        if tenant is None:
            tenant = self._tenants[item.tenant] = _Tenant(item.tenant)
        if tenant.count == 0:
            tenant.pass_ = max(tenant.pass_, self._vtime)
        heapq.heappush(tenant.levels[priority - MIN_PRIORITY], (item.enqueued_at, item.seq, item))
        tenant.count += 1
        self._count += 1
        self._reindex(tenant, requeue=False)
        self._maybe_compact()

    def pop(self, now: float, eligible: Callable[[str], bool] | None = None) -> Pending[T] | None:
        """Remove and return the next item to run, or None if nothing eligible is pending.

        ``now`` is monotonic seconds on the clock of ``enqueued_at``; a ``now``
        older than a previous one is treated as that previous one.
        ``eligible`` is called at most once per tenant per pick.
        """
        self._now = now = max(now, self._now)
        self._promote(now)
        for heap in reversed(self._classes):
            tenant = self._pick(heap, eligible)
            if tenant is not None:
                return self._serve(tenant, now)
        return None

    def remove_where(self, pred: Callable[[Pending[T]], bool]) -> list[Pending[T]]:
        """Remove and return (in push order) every item for which ``pred`` is true.

        ``pred`` sees every item before anything is removed, so if it raises,
        nothing is removed.
        """
        plans = [
            (tenant, *plan)
            for tenant in self._tenants.values()
            if tenant.count and (plan := self._plan_removal(tenant, pred)) is not None
        ]
        removed: list[Pending[T]] = []
        for tenant, levels, gone in plans:
            tenant.levels = levels
            tenant.count -= len(gone)
            self._count -= len(gone)
            removed.extend(gone)
            self._reindex(tenant, requeue=False)
        self._maybe_compact()
        removed.sort(key=lambda item: item.seq)
        return removed

    def drain(self) -> list[Pending[T]]:
        """Remove and return every pending item, in push order (for shutdown)."""
        return self.remove_where(lambda _item: True)

    def __len__(self) -> int:
        return self._count

    def items(self) -> Iterator[Pending[T]]:
        """Every pending item, in no particular order (O(items); for counts, not picking)."""
        for tenant in self._tenants.values():
            for heap in tenant.levels:
                for entry in heap:
                    yield entry[2]

    def pending_by_tenant(self) -> dict[str, int]:
        """Number of pending items per tenant that has any."""
        return {name: t.count for name, t in self._tenants.items() if t.count}

    def oldest_enqueued_at(self) -> float | None:
        """``enqueued_at`` of the oldest pending item, or None (O(tenants); for metrics)."""
        heads = [heap[0][0] for t in self._tenants.values() for heap in t.levels if heap]
        return min(heads, default=None)

    # --- picking -----------------------------------------------------------------

    def _promote(self, now: float) -> None:
        """Move tenants whose best item crossed an aging boundary by ``now`` up a class."""
        promos = self._promos
        while promos and promos[0][0] <= now:
            _at, stamp, name = heapq.heappop(promos)
            tenant = self._tenants.get(name)
            if tenant is None or tenant.pstamp != stamp:
                self._stale -= 1
                continue
            tenant.pstamp, tenant.promo_at = -1, _INF
            self._reindex(tenant, requeue=False)

    def _pick(
        self, heap: list[_Entry], eligible: Callable[[str], bool] | None
    ) -> _Tenant[T] | None:
        """Pop the lowest-``pass`` eligible tenant of one class heap, if any.

        Skipped entries go back even if ``eligible`` raises, so no tenant is lost.
        """
        skipped: list[_Entry] = []
        try:
            while heap:
                _pass, stamp, name = heap[0]
                tenant = self._tenants.get(name)
                if tenant is None or tenant.cstamp != stamp:
                    heapq.heappop(heap)
                    self._stale -= 1
                elif eligible is not None and not eligible(name):
                    skipped.append(heapq.heappop(heap))
                else:
                    heapq.heappop(heap)
                    tenant.klass = tenant.cstamp = -1
                    return tenant
            return None
        finally:
            for entry in skipped:
                heapq.heappush(heap, entry)

    def _serve(self, tenant: _Tenant[T], now: float) -> Pending[T]:
        """Take the tenant's best item and charge the tenant for it."""
        level = self._best_level(tenant, now)
        _enqueued_at, _seq, item = heapq.heappop(tenant.levels[level])
        tenant.count -= 1
        self._count -= 1
        self._vtime = max(self._vtime, tenant.pass_)
        tenant.pass_ = self._vtime + 1.0 / self._weights.get(tenant.name, 1.0)
        self._reindex(tenant, requeue=True)
        self._maybe_compact()
        return item

    def _best_level(self, tenant: _Tenant[T], now: float) -> int:
        """Level whose head has the highest effective priority, oldest first on ties."""
        best_key: tuple[int, float, int] | None = None
        best_level = -1
        for level, heap in enumerate(tenant.levels):
            if heap:
                enqueued_at, seq, _item = heap[0]
                eff = effective_priority(level + MIN_PRIORITY, enqueued_at, now, self._aging)
                key = (-eff, enqueued_at, seq)
                if best_key is None or key < best_key:
                    best_key, best_level = key, level
        return best_level

    # --- bookkeeping -------------------------------------------------------------

    def _rank(self, tenant: _Tenant[T], now: float) -> tuple[int, float]:
        """The tenant's class at ``now`` and the next instant it can rise (inf: never)."""
        aging = self._aging
        heads: list[tuple[int, float]] = []
        klass = -1
        for level, heap in enumerate(tenant.levels):
            if heap:
                priority, at = level + MIN_PRIORITY, heap[0][0]
                heads.append((priority, at))
                # fast path: most heads have not waited a whole aging period yet
                eff = priority if at + aging > now else effective_priority(priority, at, now, aging)
                klass = max(klass, eff)
        if klass >= TOP_CLASS:
            return klass, _INF
        return klass, min(at + (klass + 1 - priority) * aging for priority, at in heads)

    def _reindex(self, tenant: _Tenant[T], *, requeue: bool) -> None:
        """Refresh the tenant's class and promotion entries after a change.

        Ranks at the last ``now`` seen by ``pop``: that can only underestimate
        (aging is monotone in time), and the promotion entry then falls due at
        the next ``pop``, which corrects it.
        """
        if tenant.count == 0:
            self._drop_entries(tenant)
            return
        klass, promo_at = self._rank(tenant, self._now)
        if requeue or klass != tenant.klass:
            if tenant.klass >= 0:
                self._stale += 1
            tenant.klass, tenant.cstamp = klass, self._next_stamp()
            heapq.heappush(self._classes[klass], (tenant.pass_, tenant.cstamp, tenant.name))
        if promo_at != tenant.promo_at:
            if tenant.pstamp >= 0:
                self._stale += 1
            tenant.promo_at, tenant.pstamp = promo_at, -1
            if promo_at != _INF:
                tenant.pstamp = self._next_stamp()
                heapq.heappush(self._promos, (promo_at, tenant.pstamp, tenant.name))

    def _drop_entries(self, tenant: _Tenant[T]) -> None:
        if tenant.klass >= 0:
            self._stale += 1
        if tenant.pstamp >= 0:
            self._stale += 1
        tenant.klass = tenant.cstamp = tenant.pstamp = -1
        tenant.promo_at = _INF

    def _plan_removal(
        self, tenant: _Tenant[T], pred: Callable[[Pending[T]], bool]
    ) -> tuple[list[list[tuple[float, int, Pending[T]]]], list[Pending[T]]] | None:
        """The tenant's level heaps without the items matching ``pred``, and those items."""
        gone: list[Pending[T]] = []
        levels = list(tenant.levels)
        for level, heap in enumerate(levels):
            keep: list[tuple[float, int, Pending[T]]] = []
            for entry in heap:
                if pred(entry[2]):
                    gone.append(entry[2])
                else:
                    keep.append(entry)
            if len(keep) != len(heap):
                heapq.heapify(keep)
                levels[level] = keep
        return (levels, gone) if gone else None

    def _next_stamp(self) -> int:
        self._stamp += 1
        return self._stamp

    def _maybe_compact(self) -> None:
        if self._stale > 2 * len(self._tenants) + 1024:
            self._compact()

    def _compact(self) -> None:
        """Rebuild the heaps from the live entries; forget idle tenants that owe nothing."""
        self._tenants = {
            name: t for name, t in self._tenants.items() if t.count or t.pass_ > self._vtime
        }
        classes: list[list[_Entry]] = [[] for _ in range(TOP_CLASS + 1)]
        promos: list[_Entry] = []
        for t in self._tenants.values():
            if t.klass >= 0:
                classes[t.klass].append((t.pass_, t.cstamp, t.name))
            if t.pstamp >= 0:
                promos.append((t.promo_at, t.pstamp, t.name))
        for heap in classes:
            heapq.heapify(heap)
        heapq.heapify(promos)
        self._classes, self._promos, self._stale = classes, promos, 0
