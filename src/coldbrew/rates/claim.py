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

Refusals are what a fleet-wide bucket costs its neighbours: each runs in a
job slot, and two workers waiting for the same token both ask when it is
due. So a *contested* single-limit claim (``peek``: the gate's last answer
for the bucket was a refusal or took its last token) first reads the
bucket without a lock (``RateTokens.peek``) and refuses at once when no
token is due -- one light statement instead of a claim rolled back --; when
one is due it takes the token *before* it claims, locking the bucket with
SKIP LOCKED (``_take_then_claim``), so that a claim racing another worker's
for the same token refuses at once instead of waiting behind that claim's
lock; a duplicate rolls its token back. A delivery already recorded as
waiting (``recorded``) is not recorded again.
A claim that took its tokens says how many each bucket had left
(``rate_spare``), which bounds how many claims the gate sends next.
"""

from __future__ import annotations

import math
import time
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
    "spare_tokens",
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
    measured_at: float = 0.0
    """``time.monotonic()`` just before the statement whose clock ``wait`` counts from (0:
    unknown; the gate counts from the claim's start). Counted from the claim's start, a
    wait ends early by the pool's and the round trips' time, and the early claim is
    refused again."""


def spare_tokens(backlog: float, rate: Rate) -> int:
    """Tokens a bucket still has right after a take left it ``backlog`` seconds ahead:
    GCRA grants ``k`` more when ``backlog + (k - 1) * T <= tau`` (0: the next is not due)."""
    tau = rate.interval * (rate.burst - 1)
    if backlog > tau + EPSILON:
        return 0
    return math.floor((tau - backlog) / rate.interval + EPSILON) + 1


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
        result.rate_spare = {
            b.key: spare_tokens(g.backlog, b.rate) for b, g in zip(ordered, grants, strict=True)
        }
    return result


class _NoToken(Exception):
    """The token upsert found the bucket empty: roll the claim back."""

    def __init__(self, seen: float) -> None:
        super().__init__(seen)
        self.seen = seen


async def claim_one_token(
    caps: CapStore,
    request: ClaimRequest,
    bucket: Bucket,
    *,
    peek: bool = False,
    recorded: bool = False,
) -> ClaimResult | RateLimited:
    """A job with one rate limit: claim, then take the bucket's token in one statement,
    in one transaction rolled back when no token is due. ``started_at`` is the
    transaction's time, which the token was judged at: the rows' starts keep the bound.
    A duplicate takes no token; the bucket's row is locked only from the upsert on.

    ``peek``: the bucket is contested, so read it first and refuse without a claim when
    no token is due. ``recorded``: an earlier refusal recorded the job as waiting."""
    tau = bucket.rate.interval * (bucket.rate.burst - 1)
    async with caps.claim_session() as session:
        if peek:
            measured = time.monotonic()
            backlog = await session.tokens.peek(bucket.key)
            if backlog > tau + EPSILON:
                wait = max(backlog - tau, MIN_WAIT)
                limited = RateLimited(bucket.kind, bucket.key, wait, measured)
                return await _refused(session, request, limited, recorded=recorded)
            measured = time.monotonic()  # the transaction's now() is a little later
            try:
                async with session.transaction():
                    return await _take_then_claim(session, request, bucket, measured)
            except _Refused as refused:  # rolled back: no token, or another claim taking it
                wait = max(refused.wait, MIN_WAIT)
                limited = RateLimited(bucket.kind, bucket.key, wait, measured)
                return await _refused(session, request, limited, recorded=recorded)
            except _NotClaimed as duplicate:  # rolled back: the token is not spent on it
                return duplicate.result
            except _NoBucket:  # pruned since the peek: the upsert below creates it
                pass
        measured = time.monotonic()
        try:
            async with session.transaction():
                return await _claim_then_take(session, request, bucket, measured)
        except _NoToken as refused:  # rolled back: the job is not claimed
            wait = max(refused.seen - tau, MIN_WAIT)
        # the rolled-back claim found the job claimable (no duplicate): record it as
        # waiting, on the same connection, and hold its delivery
        if not recorded:
            await session.register_waiting(request)
    return RateLimited(bucket.kind, bucket.key, wait, measured)


class _Refused(Exception):
    """The contested take found no token, or another claim holding the bucket: roll back."""

    def __init__(self, wait: float) -> None:
        super().__init__(wait)
        self.wait = wait


class _NotClaimed(Exception):
    """The token was taken but the job is not claimable (a duplicate): roll the token back."""

    def __init__(self, result: ClaimResult) -> None:
        super().__init__(result.id)
        self.result = result


class _NoBucket(Exception):
    """The contested take found no bucket row (none yet, or pruned): claim the usual way."""


async def _take_then_claim(
    session: CapClaim, request: ClaimRequest, bucket: Bucket, measured: float
) -> ClaimResult:
    """A contested bucket, inside the transaction: the token first, then the claim.

    The bucket's row is locked with SKIP LOCKED: when another claim holds it,
    that claim is taking the due token, so this one refuses at once instead of
    waiting behind it in a job slot (the next token is due one interval after
    the one being taken). Judged at the transaction's time, as ``started_at``."""
    rate = bucket.rate
    tau = rate.interval * (rate.burst - 1)
    taken, mine, seen = await session.tokens.take_first(bucket.key, rate.interval, tau + EPSILON)
    if seen is None:
        raise _NoBucket
    if taken is None:
        raise _Refused(seen + rate.interval - tau if mine is None else mine - tau)
    result = await session.claim(request)
    if not result.claimed:
        raise _NotClaimed(result)
    result.rate_waits = {bucket.key: max(0.0, taken - tau)}
    result.rate_spare = {bucket.key: spare_tokens(taken, rate)}
    result.rate_measured_at = measured
    return result


async def _refused(
    session: CapClaim, request: ClaimRequest, limited: RateLimited, *, recorded: bool
) -> ClaimResult | RateLimited:
    """Record a refused job as waiting (unless ``recorded``) and answer ``limited``, or its
    row's answer when it is finished or held elsewhere (a duplicate)."""
    if recorded:  # a duplicate shows at the claim once the token is due
        return limited
    await session.register_waiting(request)
    result, claimable = await session.claimability(request.id)
    return limited if claimable else result


async def _claim_then_take(
    session: CapClaim, request: ClaimRequest, bucket: Bucket, measured: float
) -> ClaimResult:
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
    result.rate_spare = {bucket.key: spare_tokens(taken, rate)}
    result.rate_measured_at = measured
    return result


async def record_refusal(
    caps: CapStore, request: ClaimRequest, limited: RateLimited, *, recorded: bool = False
) -> ClaimResult | RateLimited:
    """A refused job is recorded as queued (status and stats see it); ``limited`` unless
    its row says it is finished or held elsewhere (a duplicate: its result instead).
    ``recorded``: an earlier refusal did so already; the next claim will tell."""
    if recorded:
        return limited
    async with caps.claim_session() as session:
        await session.register_waiting(request)
        result, claimable = await session.claimability(request.id)
    return limited if claimable else result


async def claim_limited(
    caps: CapStore, request: ClaimRequest, buckets: Sequence[Bucket], *, recorded: bool = False
) -> ClaimResult | RateLimited:
    """Claim ``request`` if each of its buckets has a token; else record it as waiting
    (unless ``recorded``: an earlier refusal did)."""
    async with caps.claim_session() as session, session.transaction():
        answer = await claim_with_tokens(session, request, buckets)
        if isinstance(answer, ClaimResult):
            return answer
    # no token: the bucket locks are let go; record the job as waiting
    return await record_refusal(caps, request, answer, recorded=recorded)
