"""``RateGate``: which rate-limited deliveries may claim now, and which wait for a token."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from coldbrew.metrics import Metrics
from coldbrew.ratelimit import Rate
from coldbrew.rates import Bucket, RateGate, RateLimited
from coldbrew.scheduler import FairScheduler, Pending
from coldbrew.store import ClaimResult


def delivery(
    job_id: str,
    tenant: str = "t",
    job_type: str = "fetch",
    key: str | None = None,
    rate: Rate | None = None,
) -> Pending[Any]:
    payload = SimpleNamespace(
        envelope=SimpleNamespace(id=job_id),
        spec=SimpleNamespace(name=job_type, rate_limit=rate),
        rate_key=key,
    )
    return Pending(tenant, 0, time.monotonic(), payload)


def claimed(job_id: str, waits: dict[str, float]) -> ClaimResult:
    return ClaimResult(job_id, True, "running", 1, 3, None, None, None, rate_waits=waits)


class Harness:
    def __init__(self) -> None:
        self.scheduler: FairScheduler[Any] = FairScheduler(aging_seconds=1.0)
        self.dispatched = 0
        self.gate = RateGate(
            scheduler=self.scheduler,
            aging_seconds=1.0,
            metrics=Metrics(CollectorRegistry()),
            dispatch=self.dispatch,
        )

    def dispatch(self) -> None:
        self.dispatched += 1


def test_buckets_name_the_tenant_the_type_and_the_key() -> None:
    h = Harness()
    assert h.gate.buckets(delivery("1")) == ()
    h.gate.set_rates({"t": Rate(10, 1)}, {"fetch": Rate(5, 2)})
    per_key = Rate(2, 1)
    found = h.gate.buckets(delivery("1", key="fetch:a.example", rate=per_key))
    assert [(b.kind, b.key) for b in found] == [
        ("tenant", "tenant:t"),
        ("type", "type:fetch"),
        ("key", "key:fetch:a.example"),
    ]
    assert found[2].rate == per_key


async def test_a_refused_key_delivery_waits_apart_until_its_token_is_due() -> None:
    h = Harness()
    bucket = Bucket("key", "key:fetch:a", Rate(20, 1))
    first = delivery("1", key="fetch:a", rate=bucket.rate)
    assert h.gate.begin_claim(first, (bucket,))
    h.gate.park(first, RateLimited("key", bucket.key, 0.05), time.monotonic())
    assert h.gate.waiting() == 1 and not h.gate.tenant_blocked("t")
    second = delivery("2", key="fetch:a", rate=bucket.rate)
    assert not h.gate.begin_claim(second, (bucket,))  # blocked: held behind the first
    assert h.gate.take_held() is None  # nothing may go before the token is due
    other = Bucket("key", "key:fetch:b", bucket.rate)
    assert h.gate.begin_claim(delivery("3", key="fetch:b", rate=bucket.rate), (other,))
    await asyncio.sleep(0.07)
    assert h.dispatched >= 1
    assert h.gate.take_held().payload is first.payload  # oldest first, once the token is due
    assert h.gate.waiting() == 1


async def test_a_refused_tenant_is_held_back_in_the_scheduler() -> None:
    h = Harness()
    bucket = Bucket("tenant", "tenant:t", Rate(20, 1))
    pending = delivery("1")
    assert h.gate.begin_claim(pending, (bucket,))
    assert h.gate.tenant_blocked("t")  # one claim in flight for a burst of 1
    h.gate.park(pending, RateLimited("tenant", bucket.key, 0.05), time.monotonic())
    assert len(h.scheduler) == 1 and h.gate.tenant_blocked("t") and h.gate.waiting() == 1
    await asyncio.sleep(0.07)
    assert not h.gate.tenant_blocked("t") and h.gate.waiting() == 0


async def test_a_claim_that_took_the_last_token_blocks_until_the_next_is_due() -> None:
    h = Harness()
    bucket = Bucket("key", "key:k", Rate(10, 3))
    first, second = delivery("1"), delivery("2")
    assert h.gate.begin_claim(first, (bucket,))
    assert h.gate.begin_claim(second, (bucket,))  # burst 3: up to three claims in flight
    h.gate.claim_done(claimed("1", {bucket.key: 0.0}), time.monotonic())
    assert h.gate.begin_claim(delivery("3"), (bucket,))
    h.gate.claim_done(claimed("2", {bucket.key: 0.05}), time.monotonic())
    held = delivery("4")
    assert not h.gate.begin_claim(held, (bucket,))
    # the wait counts from the claim's start: a claim that took 0.05 s leaves none
    h.gate.claim_done(claimed("3", {bucket.key: 0.05}), time.monotonic() - 0.06)
    assert h.gate.take_held().payload is held.payload


async def test_drain_gives_back_held_deliveries_and_stops_the_timers() -> None:
    h = Harness()
    bucket = Bucket("key", "key:k", Rate(1, 1))
    pending = delivery("1")
    assert h.gate.begin_claim(pending, (bucket,))
    h.gate.park(pending, RateLimited("key", bucket.key, 30.0), time.monotonic())
    assert [p.payload for p in h.gate.drain()] == [pending.payload]
    assert h.gate.waiting() == 0
    assert not any(state.timer for state in h.gate._buckets.values())


def spared(job_id: str, key: str, wait: float, spare: int) -> ClaimResult:
    result = claimed(job_id, {key: wait})
    result.rate_spare = {key: spare}
    return result


def in_flight(h: Harness, bucket: Bucket, first: int) -> int:
    """Begin claims of new deliveries of the tenant's bucket until it is blocked; how many."""
    n = 0
    while not h.gate.tenant_blocked("t"):
        assert h.gate.begin_claim(delivery(str(first + n)), (bucket,))
        n += 1
    return n


async def test_a_contested_bucket_paces_its_claims_one_interval_apart() -> None:
    """Four claims at each due token made four in five refusals (bench/ratelimit.py): after
    a refusal the worker sends one claim per interval (the next token's), however long
    each takes; a claim that found tokens to spare ends the pacing."""
    h = Harness()
    bucket = Bucket("tenant", "tenant:t", Rate(20, 5))  # T = 0.05 s
    assert in_flight(h, bucket, 0) == 4  # nothing known: min(burst, RATE_INFLIGHT)
    assert not h.gate.contested((bucket,))
    for i in (1, 2, 3):
        h.gate.claim_over(h.gate._claiming[str(i)][0])
    refused = h.gate._claiming["0"][0]
    h.gate.park(refused, RateLimited("tenant", bucket.key, 0.01), time.monotonic())
    assert h.gate.contested((bucket,))  # the next single-limit claim reads the bucket first
    await asyncio.sleep(0.03)
    assert in_flight(h, bucket, 10) == 1  # paced: the next one an interval on
    await asyncio.sleep(0.02)
    assert h.gate.tenant_blocked("t")
    await asyncio.sleep(0.05)
    assert in_flight(h, bucket, 20) == 1  # two in flight now, one interval apart
    assert len(h.gate._claiming) == 2
    h.gate.claim_done(spared("10", bucket.key, 0.0, 3), time.monotonic())
    assert not h.gate.contested((bucket,))
    assert in_flight(h, bucket, 30) == 2  # tokens to spare: unpaced, up to three in flight


async def test_a_claim_that_took_the_last_token_paces_past_the_claims_in_flight() -> None:
    """The next token is this worker's claim in flight's; the one after it is the next
    claim's: the timer counts one interval more per claim in flight."""
    h = Harness()
    bucket = Bucket("tenant", "tenant:t", Rate(20, 5))  # T = 0.05 s
    assert in_flight(h, bucket, 0) == 4
    for i in (2, 3):
        h.gate.claim_over(h.gate._claiming[str(i)][0])
    h.gate.claim_done(spared("0", bucket.key, 0.01, 0), time.monotonic())
    assert h.gate.contested((bucket,))
    assert h.gate.tenant_blocked("t")  # "1" is in flight: 0.01 + 0.05 s
    await asyncio.sleep(0.035)
    assert h.gate.tenant_blocked("t")
    await asyncio.sleep(0.04)
    assert not h.gate.tenant_blocked("t")


async def test_contested_outlives_the_forgotten_bucket_until_a_burst_is_back() -> None:
    """An idle bucket's state is dropped (a tenant's deliveries wait in the scheduler), but
    that it was contested is kept until a whole burst could have come back untaken."""
    h = Harness()
    bucket = Bucket("tenant", "tenant:t", Rate(50, 5))  # a burst comes back in 0.1 s
    pending = delivery("0")
    assert h.gate.begin_claim(pending, (bucket,))
    h.gate.park(pending, RateLimited("tenant", bucket.key, 0.01), time.monotonic())
    await asyncio.sleep(0.03)
    assert not h.gate.active  # the bucket's state is gone
    assert h.gate.contested((bucket,))
    assert in_flight(h, bucket, 10) == 1  # paced
    h.gate.claim_over(h.gate._claiming["10"][0])
    await asyncio.sleep(0.1)
    assert not h.gate.contested((bucket,))
    assert in_flight(h, bucket, 20) == 4


def test_only_a_single_limit_claim_peeks() -> None:
    h = Harness()
    tenant = Bucket("tenant", "tenant:t", Rate(50, 5))
    kind = Bucket("type", "type:fetch", Rate(50, 5))
    h.gate._contest(tenant, 1.0)
    assert h.gate.contested((tenant,))
    assert not h.gate.contested((tenant, kind))  # several limits: locked and read in one go
    assert not h.gate.contested(())


async def test_a_paced_claim_that_ended_without_an_answer_lets_the_next_one_go() -> None:
    """1/h: a contested bucket's pacing would block it for an hour; a claim that ended
    without taking a token (given up, cancelled) must not leave the bucket blocked."""
    h = Harness()
    bucket = Bucket("key", "key:k", Rate(1 / 3600, 1))
    first = delivery("1")
    assert h.gate.begin_claim(first, (bucket,))
    h.gate.park(first, RateLimited("key", bucket.key, 0.01), time.monotonic())
    await asyncio.sleep(0.03)
    second = h.gate.take_held()
    assert second is not None and h.gate.begin_claim(second, (bucket,))
    assert not h.gate.begin_claim(delivery("2"), (bucket,))  # paced: held behind it
    h.gate.claim_over(second)
    assert h.gate.take_held() is not None
