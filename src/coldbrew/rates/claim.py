"""The claim of a rate-limited job: take a token from each of its buckets, and claim.

One short transaction on one pooled connection (``CapStore.claim_session``,
inside the capped claim's when the job is capped too): lock the job's GCRA
buckets in key order and read their backlogs (one statement), decide with
``ratelimit.gcra_all`` -- all buckets or none --, claim, and store the new
backlogs only if the job was claimed, so a duplicate delivery takes no token.
A refusal answers ``RateLimited`` with the wait until the token is due; the
job is recorded as queued (status and stats see it) and its delivery is held,
not nacked (``RateGate.park``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from coldbrew.ratelimit import Rate, gcra_all
from coldbrew.store.caps import CapClaim, CapStore
from coldbrew.store.records import ClaimRequest, ClaimResult

__all__ = ["Bucket", "RateKind", "RateLimited", "claim_limited", "claim_with_tokens"]

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


async def claim_limited(
    caps: CapStore, request: ClaimRequest, buckets: Sequence[Bucket]
) -> ClaimResult | RateLimited:
    """Claim ``request`` if each of its buckets has a token; else record it as waiting."""
    async with caps.claim_session() as session:
        async with session.transaction():
            answer = await claim_with_tokens(session, request, buckets)
            if isinstance(answer, ClaimResult):
                return answer
        # no token: the bucket locks are let go; record the job as waiting
        await session.register_waiting(request)
        result, claimable = await session.claimability(request.id)
    return answer if claimable else result  # else finished or held elsewhere: not a wait
