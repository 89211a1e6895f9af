"""The claim of a rate-limited job: take a token from each of its buckets, and claim.

A job with one rate limit and no cap (the common case) is claimed and then
takes its token with one statement (``claim_one_token``: an upsert that moves
the bucket on only if it conforms), rolled back together when there is none.
Any other limited job
(several limits, or a cap too) is claimed in one short transaction on one
pooled connection (``CapStore.claim_session``, inside the capped claim's
when the job is capped too): lock the job's GCRA buckets in key order and
read their backlogs (one statement), decide with ``ratelimit.gcra_all`` --
all buckets or none --, claim, and store the new backlogs only if the job
was claimed. A refusal answers ``RateLimited`` with the wait until the token
is due; the job is recorded as queued (status and stats see it) and its
delivery is held, not nacked (``RateGate.park``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from coldbrew.ratelimit import EPSILON, Rate, gcra_all
from coldbrew.store.caps import CapClaim, CapStore
from coldbrew.store.records import ClaimRequest, ClaimResult

__all__ = [
    "MIN_WAIT",
    "Bucket",
    "RateKind",
    "RateLimited",
    "claim_limited",
    "claim_one_token",
    "claim_with_tokens",
    "record_refusal",
]

MIN_WAIT = 0.001
"""The shortest wait a refusal hands out (seconds): the backlog a refused upsert read
may predate a concurrent claim's, and so promise a token a little early."""

RateKind = Literal["tenant", "type", "key"]


@dataclass(frozen=True, slots=True)
class Bucket:
    """One rate limit a job counts in: ``tenant:x``, ``type:y`` or ``key:<type>:<value>``."""

    kind: RateKind
    key: str
    rate: Rate


@dataclass(frozen=True, slots=True)
class RateLimited:
    """A rate-limited claim found no token: the delivery waits ``wait`` seconds, holding
    no slot. ``key`` is the bucket whose token is due last (``kind`` its kind)."""

    kind: RateKind
    key: str
    wait: float


async def claim_with_tokens(
    session: CapClaim, request: ClaimRequest, buckets: Sequence[Bucket]
) -> ClaimResult | RateLimited:
    """Inside ``session``'s transaction: take one token of every bucket and claim, or
    refuse with the wait until every bucket has one."""
    ordered = sorted(buckets, key=lambda b: b.key)  # one lock order fleet-wide: no deadlock
    keys = [b.key for b in ordered]
    backlogs = await session.tokens.lock_buckets(keys)
    grants, worst = gcra_all([backlogs[k] for k in keys], [b.rate for b in ordered])
    if worst is not None:
        refused = ordered[worst]
        return RateLimited(refused.kind, refused.key, grants[worst].wait)
    result = await session.claim(request)
    if result.claimed:
        await session.tokens.take(keys, [g.backlog for g in grants])
        result.rate_waits = {
            b.key: max(0.0, g.backlog - b.rate.interval * (b.rate.burst - 1))
            for b, g in zip(ordered, grants, strict=True)
        }
    return result


class _NoToken(Exception):
    """The token upsert found the bucket empty: roll the claim back."""

    def __init__(self, seen: float) -> None:
        super().__init__(seen)
        self.seen = seen


async def claim_one_token(
    caps: CapStore, request: ClaimRequest, bucket: Bucket
) -> ClaimResult | RateLimited:
    """A job with one rate limit: claim, then take the bucket's token in one statement,
    in one transaction rolled back when no token is due. ``started_at`` is the
    transaction's time, which the token was judged at: the rows' starts keep the bound.
    A duplicate takes no token; the bucket's row is locked only from the upsert on."""
    async with caps.claim_session() as session:
        try:
            async with session.transaction():
                return await _claim_then_take(session, request, bucket)
        except _NoToken as refused:  # rolled back: the job is not claimed
            tau = bucket.rate.interval * (bucket.rate.burst - 1)
            wait = max(refused.seen - tau, MIN_WAIT)
        # the rolled-back claim found the job claimable (no duplicate): record it as
        # waiting, on the same connection, and hold its delivery
        await session.register_waiting(request)
    return RateLimited(bucket.kind, bucket.key, wait)


async def _claim_then_take(session: CapClaim, request: ClaimRequest, bucket: Bucket) -> ClaimResult:
    """Inside the transaction: the claim, then (if it claimed) the token, or ``_NoToken``."""
    result = await session.claim(request)
    if not result.claimed:
        return result
    rate = bucket.rate
    tau = rate.interval * (rate.burst - 1)
    taken, seen = await session.tokens.take_one(bucket.key, rate.interval, tau + EPSILON)
    if taken is None:
        raise _NoToken(seen)
    result.rate_waits = {bucket.key: max(0.0, taken - tau)}
    return result


async def record_refusal(
    caps: CapStore, request: ClaimRequest, limited: RateLimited
) -> ClaimResult | RateLimited:
    """A refused job is recorded as queued (status and stats see it); ``limited`` unless
    its row says it is finished or held elsewhere (a duplicate: its result instead)."""
    async with caps.claim_session() as session:
        await session.register_waiting(request)
        result, claimable = await session.claimability(request.id)
    return limited if claimable else result


async def claim_limited(
    caps: CapStore, request: ClaimRequest, buckets: Sequence[Bucket]
) -> ClaimResult | RateLimited:
    """Claim ``request`` if each of its buckets has a token; else record it as waiting."""
    async with caps.claim_session() as session, session.transaction():
        answer = await claim_with_tokens(session, request, buckets)
        if isinstance(answer, ClaimResult):
            return answer
    # no token: the bucket locks are let go; record the job as waiting
    return await record_refusal(caps, request, answer)
