"""``CapGate``: this worker's side of the fleet-wide caps (``max_running``).

A tenant's or a job type's cap (``coldbrew tenants set T --max-running N``,
``coldbrew types set TYPE --max-running N``) is enforced at claim, in
PostgreSQL (``claim_capped`` in claim.py: the scopes' advisory locks, taken
without waiting, then a count of their ``running`` rows). The gate decides
*when* a capped delivery may try that claim, so that a full cap costs neither
job slots nor a stream of futile claims:

- **One claim in flight per scope.** At most one capped claim of a scope is
  in flight here at a time; the scope's other deliveries wait for its answer.
  A claim that took a place lets the scope's next waiting delivery try at
  once, while the job runs, unless it took the last place; a claim that found
  a duplicate lets it try too.
- **Waiting without a slot.** A claim that finds the cap full (or its lock
  held by another worker's claim: ``busy``) marks the scope full: its
  deliveries wait, holding no job slot, until a wake lets the best of them
  try again. A tenant's waiting deliveries stay in the worker's scheduler,
  where the tenant is not eligible meanwhile, so they keep their order; a
  type's are taken out into a scheduler of their own (``held``, same order),
  because the scheduler can only hold back whole tenants.
- **Wakes.** A place freed here (a capped job of the scope finished), a
  NOTIFY ``<ns>.caps`` from elsewhere in the fleet (coalesced: one wake per
  scope per burst), a change of the caps, or the re-check timer. A busy lock
  is re-checked after ``CAP_BUSY_RETRY`` (jittered). A full cap is re-checked
  after ``CAP_RETRY_MAX`` while the worker LISTENs, as the safety net for a
  lost NOTIFY (the reaper NOTIFYs too); while it does not, the
  re-check backs off from ``CAP_RETRY_FIRST`` to ``CAP_RETRY_MAX``.
- **Drain.** Held deliveries go back to the worker to be requeued; places
  freed by jobs that finished while draining are remembered, for the worker
  to tell the fleet.

The worker owns the gate and calls it; the gate calls back ``dispatch`` when
a delivery may try again, pushes tenants' waiting deliveries back into the
worker's scheduler, asks ``listening()`` whether NOTIFYs are heard, and counts
its waits in the metrics. It does no I/O.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from coldbrew.caps.decision import Capped
from coldbrew.holds import drain_held, held_items, remove_held_where
from coldbrew.jobstate import Delivery
from coldbrew.metrics import Metrics
from coldbrew.scheduler import FairScheduler, Pending
from coldbrew.store.records import ClaimResult

__all__ = ["CAP_BUSY_RETRY", "CAP_RETRY_FIRST", "CAP_RETRY_MAX", "CapGate", "Scope"]

Scope = tuple[str, str]
"""A fleet-wide cap's scope: ``("tenant", name)`` or ``("type", name)``."""

CAP_RETRY_FIRST = 0.05
CAP_RETRY_MAX = 0.5
"""Backoff of a full cap's re-check (seconds). Places freed here are seen at once,
places freed by other workers when their NOTIFY arrives: while this worker
LISTENs, a full cap is re-checked after ``CAP_RETRY_MAX`` only, as the safety
net for a lost NOTIFY (and for leases the reaper frees); while it does not, the
re-check backs off from ``CAP_RETRY_FIRST`` to ``CAP_RETRY_MAX``."""
CAP_BUSY_RETRY = 0.01
"""Re-check after another worker's capped claim held the scope's lock (seconds, +-50%)."""


@dataclass(slots=True)
class _CapScope:
    """A fleet-wide cap's scope, as this worker sees it.

    At most one capped claim of a scope is in flight here (``claiming``). A
    claim that finds the cap full (or its lock busy) marks the scope ``full``:
    its deliveries wait, holding no job slot, until a wake (a place freed
    here, a NOTIFY from the fleet, a cap change, or the backoff timer) lets
    one of them try again. A tenant's waiting deliveries stay in the
    scheduler (the tenant is not eligible meanwhile), so they keep its order;
    a type's are taken out, into ``held`` (a scheduler of their own, same
    order), because the scheduler can only hold back whole tenants.
    """

    claiming: bool = False
    full: bool = False
    woken: bool = False  # a wake came while a claim was in flight: "full" may be stale
    timer: asyncio.TimerHandle | None = None
    fulls: int = 0  # claims in a row that found it full: the backoff doubles with each
    held: FairScheduler[Delivery] | None = None

    @property
    def blocked(self) -> bool:
        return self.claiming or self.full

    @property
    def idle(self) -> bool:
        """Nothing to remember (a grown backoff is kept until a place frees)."""
        waiting = self.claiming or self.full or bool(self.held) or self.timer is not None
        return not waiting and self.fulls == 0

    def hold(self, pending: Pending[Delivery], aging: float, weights: dict[str, float]) -> None:
        """Keep a type's delivery in ``held`` (in its order) until the scope may claim."""
        if self.held is None:
            self.held = FairScheduler(aging_seconds=aging, weights=weights)
        self.held.push(pending)


class CapGate:
    """Which capped deliveries may try their claim now; the others wait for a wake."""

    retry_first = CAP_RETRY_FIRST
    retry_max = CAP_RETRY_MAX

    def __init__(
        self,
        *,
        scheduler: FairScheduler[Delivery],
        aging_seconds: float,
        metrics: Metrics,
        dispatch: Callable[[], None],
        listening: Callable[[], bool],
    ) -> None:
        """``scheduler``: the worker's, where a tenant's waiting deliveries stay;
        ``aging_seconds``: the aging of the schedulers that hold a type's;
        ``dispatch``: start what may start now; ``listening``: whether NOTIFYs
        of freed places are heard."""
        self._scheduler = scheduler
        self._aging_seconds = aging_seconds
        self._metrics = metrics
        self._dispatch = dispatch
        self._listening = listening
        self._tenant_caps: dict[str, int] = {}
        self._type_caps: dict[str, int] = {}
        self._weights: dict[str, float] = {}
        self._scopes: dict[Scope, _CapScope] = {}
        # job id -> the delivery whose capped claim is in flight, and its scopes
        self._claiming: dict[str, tuple[Pending[Delivery], tuple[Scope, ...]]] = {}
        self._held_ready: set[Scope] = set()  # type scopes whose held deliveries may go now
        self._notified: set[Scope] = set()
        self._freed_at_drain: set[Scope] = set()

    # --- settings ------------------------------------------------------------------

    def set_caps(self, tenant_caps: dict[str, int], type_caps: dict[str, int]) -> bool:
        """Caps were read (``name -> max_running``); True when they changed. Then waiting
        scopes look again at once, and a type that lost its cap gives its held
        deliveries back to the scheduler."""
        if tenant_caps == self._tenant_caps and type_caps == self._type_caps:
            return False
        self._tenant_caps, self._type_caps = tenant_caps, type_caps
        for scope, cap in list(self._scopes.items()):
            capped = scope[1] in (self._tenant_caps if scope[0] == "tenant" else self._type_caps)
            if not capped and cap.held is not None:
                for pending in cap.held.drain():
                    self._scheduler.push(pending)
                cap.held = None
            self._wake(scope, dispatch=False)
        return True

    def set_weight(self, tenant: str, weight: float) -> None:
        """A tenant's weight, for the order of the deliveries held for a type."""
        self._weights[tenant] = weight
        for cap in self._scopes.values():
            if cap.held is not None:
                cap.held.set_weight(tenant, weight)

    # --- questions from dispatch -----------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether any scope has state here (a claim in flight, a full cap, waiters)."""
        return bool(self._scopes)

    def blocked(self, scope: Scope) -> bool:
        """Whether ``scope`` has a claim in flight here or was found full."""
        cap = self._scopes.get(scope)
        return cap is not None and cap.blocked

    def scopes(self, pending: Pending[Delivery]) -> tuple[Scope, ...]:
        """The capped scopes of ``pending`` (none: it claims as usual)."""
        if not (self._tenant_caps or self._type_caps):
            return ()
        tenant, job_type = pending.tenant, pending.payload.spec.name
        if tenant in self._tenant_caps:
            if job_type in self._type_caps:
                return (("tenant", tenant), ("type", job_type))
            return (("tenant", tenant),)
        if job_type in self._type_caps:
            return (("type", job_type),)
        return ()

    def take_held(self) -> Pending[Delivery] | None:
        """The best held delivery of a type scope that may try again, if any."""
        while self._held_ready:
            scope = self._held_ready.pop()
            cap = self._scopes.get(scope)
            if cap is None or cap.blocked or not cap.held:
                continue
            pending = cap.held.pop(time.monotonic())
            if cap.held:
                self._held_ready.add(scope)  # more may go if this one's claim takes its place
            return pending
        return None

    def begin_claim(self, pending: Pending[Delivery], scopes: tuple[Scope, ...]) -> bool:
        """Mark the claim of ``pending`` in flight for its scopes; False when a type scope
        is blocked, and then ``pending`` waits in that type's ``held``. (The caller has
        checked that its tenant is eligible.)"""
        for scope in scopes:
            cap = self._scopes.get(scope)
            if scope[0] == "type" and cap is not None and cap.blocked:
                cap.hold(pending, self._aging_seconds, self._weights)
                return False
        for scope in scopes:
            cap = self._cap(scope)
            cap.claiming, cap.woken = True, False
        self._claiming[pending.payload.envelope.id] = (pending, scopes)
        return True

    # --- how a claim ended ---------------------------------------------------------

    def capped_claim_done(self, result: ClaimResult) -> None:
        """Told each capped claim's result by the intake as soon as it is known, before the
        job runs: a claim that took a place lets the scope's next waiting delivery try at
        once, while this job runs, unless it took the last place (``result.places_left``);
        a claim that found a duplicate lets it try too."""
        entry = self._claiming.pop(result.id, None)
        if entry is None:
            return
        scopes = entry[1]
        if result.claimed:
            left = result.places_left or {}
            for scope in scopes:
                if (cap := self._scopes.get(scope)) is not None:
                    cap.fulls = 0
                    if left.get(scope[0], 1) <= 0:  # full now: wait for a place to free
                        self._mark_full(scope, cap, busy=False)
        self._end_claim(scopes)
        self._dispatch()

    def claim_over(self, pending: Pending[Delivery], *, forget: bool = True) -> None:
        """``pending``'s capped claim ended without ``capped_claim_done`` (capped, gave up,
        or cancelled): its scopes may take another claim."""
        job_id = pending.payload.envelope.id
        entry = self._claiming.get(job_id)
        if entry is not None and entry[0] is pending:
            del self._claiming[job_id]
            self._end_claim(entry[1], forget=forget)

    def park(self, pending: Pending[Delivery], capped: Capped) -> None:
        """Hold a delivery whose cap is full (or whose lock was busy) until a wake: its
        claim answered ``capped``. It is held, not nacked."""
        self.claim_over(pending, forget=False)  # keep what a wake meanwhile said
        kind = capped.kind
        scope = (kind, pending.tenant if kind == "tenant" else pending.payload.spec.name)
        self._metrics.cap_waits.labels(kind).inc()
        cap = self._cap(scope)
        if kind == "tenant":  # waits in the scheduler, where the tenant is held back meanwhile
            self._scheduler.push(pending)
        else:
            cap.hold(pending, self._aging_seconds, self._weights)
        self._mark_full(scope, cap, busy=capped.busy)

    def job_done(
        self, pending: Pending[Delivery], scopes: tuple[Scope, ...], *, draining: bool
    ) -> None:
        """``pending`` ran here (or was a duplicate): a place of its scopes may have freed."""
        self.claim_over(pending)  # when no claim result was heard (gave up)
        if draining:
            self._freed_at_drain.update(scopes)
        for scope in scopes:
            if (cap := self._scopes.get(scope)) is not None:
                cap.fulls = 0
                self._wake(scope, dispatch=False)

    # --- the fleet -----------------------------------------------------------------

    def freed_elsewhere(self, payload: str) -> None:
        """NOTIFY ``<ns>.caps`` (``tenant:x`` or ``type:y``) from another worker: a place
        freed somewhere in the fleet. Wakes are coalesced: one per scope per burst of
        notifications."""
        kind, _, name = payload.partition(":")
        scope = (kind, name)
        if not self.blocked(scope):
            return  # nothing of that scope waits here
        if not self._notified:
            asyncio.get_running_loop().call_soon(self._wake_notified)
        self._notified.add(scope)

    # --- holding and draining -------------------------------------------------------

    def held_items(self) -> Iterator[Pending[Delivery]]:
        """Every delivery held here: waiting in a type's ``held`` or its capped claim in flight."""
        return held_items(self._scopes.values(), self._claiming)

    def remove_held_where(
        self, pred: Callable[[Pending[Delivery]], bool]
    ) -> list[Pending[Delivery]]:
        """Take out the deliveries held for types for which ``pred`` is true."""
        return remove_held_where(self._scopes.values(), pred)

    def drain(self) -> list[Pending[Delivery]]:
        """Stop the timers and give back every delivery held for a type (shutdown)."""
        waiting = drain_held(self._scopes.values())
        self._held_ready.clear()
        return waiting

    def freed_at_drain(self) -> list[str]:
        """The scopes (``tenant:x``, ``type:y``) where jobs that finished while draining
        freed places, for the fleet's waiters to hear."""
        return sorted(f"{kind}:{name}" for kind, name in self._freed_at_drain)

    # --- internals -----------------------------------------------------------------

    def _cap(self, scope: Scope) -> _CapScope:
        cap = self._scopes.get(scope)
        if cap is None:
            cap = self._scopes[scope] = _CapScope()
        return cap

    def _end_claim(self, scopes: tuple[Scope, ...], *, forget: bool = True) -> None:
        for scope in scopes:
            cap = self._scopes.get(scope)
            if cap is None:
                continue
            cap.claiming = False
            if not cap.full and cap.held:
                self._held_ready.add(scope)
            if forget and cap.idle:
                del self._scopes[scope]

    def _mark_full(self, scope: Scope, cap: _CapScope, *, busy: bool) -> None:
        """The scope has no place (or another worker was claiming one): wait for a wake."""
        cap.full = True
        self._held_ready.discard(scope)
        if cap.timer is not None:
            cap.timer.cancel()
        if cap.woken:  # a place freed while the claim was counting: look again at once
            cap.woken, delay = False, 0.0
        elif busy:  # another worker was claiming in this scope: there may be room
            delay = CAP_BUSY_RETRY * random.uniform(0.5, 1.5)
        elif self._listening():  # a freed place will be heard: safety net only
            delay = self.retry_max
        else:
            delay = min(self.retry_first * 2 ** min(cap.fulls, 20), self.retry_max)
            cap.fulls += 1
        cap.timer = asyncio.get_running_loop().call_later(delay, self._wake, scope)

    def _wake(self, scope: Scope, *, dispatch: bool = True) -> None:
        """Let a full scope's best waiting delivery try again (one claim at a time)."""
        cap = self._scopes.get(scope)
        if cap is None:
            return
        if cap.timer is not None:
            cap.timer.cancel()
            cap.timer = None
        if cap.claiming:
            cap.woken = True
        elif cap.full:
            cap.full = False
            if cap.held:
                self._held_ready.add(scope)
        if cap.idle:
            del self._scopes[scope]
        if dispatch:
            self._dispatch()

    def _wake_notified(self) -> None:
        scopes, self._notified = self._notified, set()
        for scope in scopes:
            self._wake(scope, dispatch=False)
        self._dispatch()
