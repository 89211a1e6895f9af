"""``RateGate``: this worker's side of the fleet-wide rate limits.

A tenant's or a job type's rate (``coldbrew tenants set T --rate 10/s``,
``coldbrew types set TYPE --rate 600/min``) and a job's per-key rate
(``@app.job(rate_limit="50/s", rate_key="domain")``) are enforced at claim,
in PostgreSQL (``rates.claim``: GCRA buckets locked and updated in the
claim's transaction). The gate decides *when* a limited delivery may try that
claim, so that an empty bucket costs neither job slots nor a stream of
futile claims -- the shape of the cap gate (caps/gate.py):

- **A few claims in flight per bucket.** At most ``min(burst, RATE_INFLIGHT)``
  claims of a bucket are in flight here at a time (one for a burst of 1: there
  is never more than one token to take), so that the claim's round trips do
  not bound the rate; the bucket's other deliveries wait for an answer. A
  claim that took its tokens says, per bucket, when the next token is due: the
  bucket's next delivery tries at once if one is there, or waits until then
  without asking PostgreSQL.
- **Paced claims once the bucket is contested.** A claim runs in a job slot,
  so a futile one costs the other tenants slot time (bench/ratelimit.py: with
  four claims per worker sent at each due token, four in five were refused,
  ~7% of the neighbour's slots). After a refusal, or a claim that took the
  bucket's last token, the bucket is *contested* here: this worker sends one
  claim per emission interval (each claim blocks the bucket for one interval,
  so round trips do not bound the rate, as one claim at a time did), a
  refusal or a claim's answer sets the timer to the next token plus one
  interval per claim still in flight here, and a single-limit claim first
  reads the bucket without a lock, then takes a due token before it claims,
  refusing at once when another claim holds the bucket (``contested``:
  ``claim_one_token(peek)``). A claim that finds tokens to spare
  (``rate_spare``) ends it: up to that many, at most ``min(burst,
  RATE_INFLIGHT)``, go at once again.
- **Waiting without a slot, until the token is due.** A claim refused with
  ``RateLimited(wait)`` (another worker took the token first) blocks its
  bucket until ``wait`` is over (plus a jitter of at most a millisecond or
  two, so that two workers do not ask at the same instant); then the best
  waiting delivery tries again. A tenant's waiting deliveries stay in the
  worker's scheduler, where the tenant is not eligible meanwhile, so the
  other tenants' deliveries are dispatched as before; a type's or a key's are
  taken out into a scheduler of their own (``held``, same order), because the
  scheduler can only hold back whole tenants -- so deliveries of one type with
  different keys are independent.
- **Drain.** Held deliveries go back to the worker to be requeued.

No I/O: the worker calls it, it calls back ``dispatch`` when a bucket opens.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from coldbrew.holds import drain_held, held_items, remove_held_where
from coldbrew.jobstate import Delivery
from coldbrew.metrics import Metrics
from coldbrew.ratelimit import Rate
from coldbrew.rates.claim import Bucket, RateLimited
from coldbrew.scheduler import FairScheduler, Pending
from coldbrew.store.records import ClaimResult

__all__ = ["RATE_INFLIGHT", "RATE_JITTER", "RateGate"]

RATE_INFLIGHT = 4
"""Most claims of one bucket in flight on one worker (and never more than its burst)."""
CONTESTED_MAX = 1000
"""Contested buckets remembered before the stale ones are dropped (per-key limits)."""
RATE_JITTER = 0.002
"""At most this many seconds (and at most a tenth of the wait) are added to a bucket's
wait, so that workers waiting for the same token do not all ask at the same instant."""


@dataclass(slots=True)
class _BucketState:
    """A rate-limited bucket as this worker sees it: a claim in flight, a wait until its
    next token (``timer``), and the deliveries of a type or key bucket held meanwhile."""

    claiming: int = 0
    limit: int = 1  # most claims ever in flight at once: min(burst, RATE_INFLIGHT)
    most: int = RATE_INFLIGHT  # claims allowed in flight now (at most ``limit``): fewer
    # when a claim found fewer tokens to spare
    timer: asyncio.TimerHandle | None = None
    held: FairScheduler[Delivery] | None = None

    @property
    def blocked(self) -> bool:
        return self.claiming >= self.most or self.timer is not None

    @property
    def idle(self) -> bool:
        return not self.claiming and self.timer is None and not self.held


class RateGate:
    """Which rate-limited deliveries may try their claim now; the others wait for a token."""

    def __init__(
        self,
        *,
        scheduler: FairScheduler[Delivery],
        aging_seconds: float,
        metrics: Metrics,
        dispatch: Callable[[], None],
    ) -> None:
        """``scheduler``: the worker's, where a tenant's waiting deliveries stay;
        ``aging_seconds``: the aging of the schedulers that hold a type's or key's;
        ``dispatch``: start what may start now."""
        self._scheduler = scheduler
        self._aging_seconds = aging_seconds
        self._metrics = metrics
        self._dispatch = dispatch
        self._tenant_rates: dict[str, Rate] = {}
        self._type_rates: dict[str, Rate] = {}
        self._weights: dict[str, float] = {}
        self._buckets: dict[str, _BucketState] = {}
        # job id -> the delivery whose limited claim is in flight, and its buckets
        self._claiming: dict[str, tuple[Pending[Delivery], tuple[Bucket, ...]]] = {}
        self._held_ready: set[str] = set()  # buckets whose held deliveries may go now
        # bucket key -> until when (monotonic) it counts as contested: its last answer here
        # was a refusal or took its last token (kept apart from _buckets, which forgets
        # an idle bucket; expires once a whole burst would have come back untaken)
        self._contested: dict[str, float] = {}
        metrics.rate_waiting.set_function(self.waiting)

    # --- settings ------------------------------------------------------------------

    def set_rates(self, tenant_rates: dict[str, Rate], type_rates: dict[str, Rate]) -> bool:
        """Rates were read; True when they changed. Then every waiting bucket asks again
        at once (PostgreSQL answers with the right wait), and a bucket that lost its limit
        gives its held deliveries back to the scheduler."""
        if tenant_rates == self._tenant_rates and type_rates == self._type_rates:
            return False
        self._tenant_rates, self._type_rates = tenant_rates, type_rates
        for key, state in list(self._buckets.items()):
            kind, _, name = key.partition(":")
            limited = name in (self._tenant_rates if kind == "tenant" else self._type_rates)
            if kind != "key" and not limited and state.held is not None:
                for pending in state.held.drain():
                    self._scheduler.push(pending)
                state.held = None
            self._open(key, dispatch=False)
        return True

    def set_weight(self, tenant: str, weight: float) -> None:
        """A tenant's weight, for the order of the deliveries held for a type or key."""
        self._weights[tenant] = weight
        for state in self._buckets.values():
            if state.held is not None:
                state.held.set_weight(tenant, weight)

    # --- questions from dispatch -----------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether any bucket has state here (a claim in flight, a wait, waiters)."""
        return bool(self._buckets)

    def tenant_blocked(self, tenant: str) -> bool:
        """Whether the tenant's own bucket has a claim in flight here or waits for a token."""
        state = self._buckets.get(f"tenant:{tenant}")
        return state is not None and state.blocked

    def contested(self, buckets: tuple[Bucket, ...]) -> bool:
        """Whether a single-limit claim should read its bucket first: the last answer here
        was a refusal or took the bucket's last token, so the token may be gone."""
        return len(buckets) == 1 and self._is_contested(buckets[0].key)

    def buckets(self, pending: Pending[Delivery]) -> tuple[Bucket, ...]:
        """The rate limits ``pending`` counts in (none: it claims as usual)."""
        delivery = pending.payload
        spec = delivery.spec
        if spec.rate_limit is None and not (self._tenant_rates or self._type_rates):
            return ()
        found: list[Bucket] = []
        if (rate := self._tenant_rates.get(pending.tenant)) is not None:
            found.append(Bucket("tenant", f"tenant:{pending.tenant}", rate))
        if (rate := self._type_rates.get(spec.name)) is not None:
            found.append(Bucket("type", f"type:{spec.name}", rate))
        if spec.rate_limit is not None and delivery.rate_key is not None:
            found.append(Bucket("key", f"key:{delivery.rate_key}", spec.rate_limit))
        return tuple(found)

    def take_held(self) -> Pending[Delivery] | None:
        """The best held delivery of a type or key bucket that may try now, if any."""
        while self._held_ready:
            key = self._held_ready.pop()
            state = self._buckets.get(key)
            if state is None or state.blocked or not state.held:
                continue
            pending = state.held.pop(time.monotonic())
            if state.held:
                self._held_ready.add(key)  # the next may go if this one finds a token
            return pending
        return None

    def begin_claim(self, pending: Pending[Delivery], buckets: tuple[Bucket, ...]) -> bool:
        """Mark the claim of ``pending`` in flight for its buckets; False when a type or key
        bucket is blocked, and then ``pending`` waits in that bucket's ``held``. (The
        caller has checked that its tenant is eligible.)"""
        for bucket in buckets:
            state = self._buckets.get(bucket.key)
            if bucket.kind != "tenant" and state is not None and state.blocked:
                self._hold(state, pending)
                return False
        for bucket in buckets:
            state = self._state(bucket.key)
            state.limit = max(1, min(bucket.rate.burst, RATE_INFLIGHT))
            state.most = min(state.most, state.limit)
            state.claiming += 1
            if state.timer is None and self._is_contested(bucket.key):
                # paced: the next claim one interval on (for the next token), whatever
                # this one's round trips take; its answer sets the timer right
                self._block(bucket.key, state, bucket.rate.interval)
        self._claiming[pending.payload.envelope.id] = (pending, buckets)
        return True

    # --- how a claim ended ---------------------------------------------------------

    def claim_done(self, result: ClaimResult, began: float) -> None:
        """A limited claim's result, before the job runs: each bucket's next delivery may
        try at once, or when its next token is due (``result.rate_waits``, counted from
        the claim's transaction, which began at about ``began``, ``time.monotonic()``)."""
        entry = self._claiming.pop(result.id, None)
        if entry is None:
            return
        waits = result.rate_waits or {}
        spares = result.rate_spare or {}
        began = max(began, result.rate_measured_at or 0.0)  # nearer the statement's clock
        for bucket in entry[1]:
            state = self._buckets.get(bucket.key)
            if state is None:
                continue
            state.claiming = max(0, state.claiming - 1)
            wait = waits.get(bucket.key, 0.0) - (time.monotonic() - began)
            spare = spares.get(bucket.key)
            if spare is not None:  # as many claims as there were tokens left
                state.most = max(1, min(spare, state.limit)) if spare else state.limit
                if spare < 1:
                    self._contest(bucket, wait)
                else:
                    self._contested.pop(bucket.key, None)
            if wait > 0:
                self._block(bucket.key, state, self._paced(bucket, state, wait))
            else:
                self._open(bucket.key, dispatch=False)
        self._dispatch()

    def claim_over(self, pending: Pending[Delivery]) -> None:
        """``pending``'s limited claim ended without ``claim_done`` (limited elsewhere, gave
        up, or cancelled): its buckets may take another claim."""
        job_id = pending.payload.envelope.id
        entry = self._claiming.get(job_id)
        if entry is None or entry[0] is not pending:
            return
        del self._claiming[job_id]
        for bucket in entry[1]:
            state = self._buckets.get(bucket.key)
            if state is not None:
                state.claiming = max(0, state.claiming - 1)
                # a contested bucket's pacing timer stood for this claim's token, which
                # it did not take: with no other claim in flight, try again now
                paced = not state.claiming and self._is_contested(bucket.key)
                if state.timer is None or paced:
                    self._open(bucket.key, dispatch=False)

    def park(self, pending: Pending[Delivery], limited: RateLimited, began: float) -> None:
        """Hold a delivery whose claim found no token until the token is due (``limited``,
        its wait counted from the claim that began at ``began``): held, not nacked, and
        holding no job slot."""
        bucket = self._bucket_of(pending, limited.key)
        began = max(began, limited.measured_at)  # nearer the statement's clock
        self.claim_over(pending)
        self._metrics.rate_limited.labels(limited.kind).inc()
        self._metrics.rate_wait_seconds.observe(limited.wait)
        state = self._state(limited.key)
        wait = max(limited.wait - (time.monotonic() - began), 0.0)
        if bucket is not None:
            self._contest(bucket, wait)
            wait = self._paced(bucket, state, wait)
        if limited.kind == "tenant":  # waits in the scheduler; the tenant is held back meanwhile
            self._scheduler.push(pending)
        else:
            self._hold(state, pending)
        self._block(limited.key, state, wait)

    def waiting(self) -> int:
        """Deliveries waiting here for a token (the gauge, read when scraped): held for a
        type or key bucket, or in the scheduler behind their tenant's bucket."""
        held = sum(len(state.held) for state in self._buckets.values() if state.held)
        by_tenant = self._scheduler.pending_by_tenant()
        return held + sum(n for t, n in by_tenant.items() if self.tenant_blocked(t))

    # --- holding and draining -------------------------------------------------------

    def held_items(self) -> Iterator[Pending[Delivery]]:
        """Every delivery held here: waiting in a bucket's ``held`` or its claim in flight."""
        return held_items(self._buckets.values(), self._claiming)

    def remove_held_where(
        self, pred: Callable[[Pending[Delivery]], bool]
    ) -> list[Pending[Delivery]]:
        """Take out the deliveries held for buckets for which ``pred`` is true."""
        return remove_held_where(self._buckets.values(), pred)

    def drain(self) -> list[Pending[Delivery]]:
        """Stop the timers and give back every delivery held for a type or key (shutdown)."""
        waiting = drain_held(self._buckets.values())
        self._held_ready.clear()
        return waiting

    # --- internals -----------------------------------------------------------------

    def _state(self, key: str) -> _BucketState:
        state = self._buckets.get(key)
        if state is None:
            state = self._buckets[key] = _BucketState()
        return state

    def _is_contested(self, key: str) -> bool:
        until = self._contested.get(key)
        if until is None:
            return False
        if until < time.monotonic():
            del self._contested[key]
            return False
        return True

    def _contest(self, bucket: Bucket, wait: float) -> None:
        """``bucket`` has no token for ``wait`` s: contested until a full burst could be
        back after that (nobody else taking it), when its knowledge is stale."""
        now = time.monotonic()
        if len(self._contested) >= CONTESTED_MAX:  # many keys: forget the stale ones
            self._contested = {k: t for k, t in self._contested.items() if t >= now}
        refill = bucket.rate.interval * bucket.rate.burst
        self._contested[bucket.key] = now + max(wait, 0.0) + refill

    def _paced(self, bucket: Bucket, state: _BucketState, wait: float) -> float:
        """The wait before this worker's next claim of a contested bucket: its next token
        is due after ``wait``, and the claims still in flight here are for the tokens
        after it, one interval apart."""
        if not self._is_contested(bucket.key):
            return wait
        return wait + bucket.rate.interval * state.claiming

    def _bucket_of(self, pending: Pending[Delivery], key: str) -> Bucket | None:
        """The bucket ``key`` of ``pending``'s claim in flight (None: not in flight)."""
        entry = self._claiming.get(pending.payload.envelope.id)
        if entry is None:
            return None
        return next((b for b in entry[1] if b.key == key), None)

    def _hold(self, state: _BucketState, pending: Pending[Delivery]) -> None:
        if state.held is None:
            state.held = FairScheduler(aging_seconds=self._aging_seconds, weights=self._weights)
        state.held.push(pending)

    def _block(self, key: str, state: _BucketState, wait: float) -> None:
        """No token until ``wait`` is over: the bucket's deliveries wait, then one tries."""
        self._held_ready.discard(key)
        if state.timer is not None:
            state.timer.cancel()
        delay = wait + random.uniform(0.0, min(RATE_JITTER, max(wait, 0.001) / 10))
        state.timer = asyncio.get_running_loop().call_later(delay, self._open, key)

    def _open(self, key: str, *, dispatch: bool = True) -> None:
        """The bucket's token is due (or its claim ended): its best waiter may try."""
        state = self._buckets.get(key)
        if state is None:
            return
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        if not state.blocked and state.held:
            self._held_ready.add(key)
        if state.idle:
            del self._buckets[key]
        if dispatch:
            self._dispatch()
