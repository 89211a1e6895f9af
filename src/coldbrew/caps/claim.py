"""``claim_capped``: the claim of a job whose tenant or type has a fleet-wide cap.

One short transaction on one pooled connection (``CapStore.claim_session``)
takes the capped scopes' advisory locks *without waiting* (tenant, then
type), then counts their ``running`` rows in a statement of its own, so its
snapshot is taken under the locks: two workers cannot both see the last free
place, and a crashed worker's jobs free their places when the reaper moves
them, with no counter to drift. A lock held by another worker's capped claim
answers at once: ``Capped(scope, busy=True)``, so no pooled connection ever waits
on a lock. Without room the locks are let go, the job is recorded as queued
(visible to ``status`` and the gauges) and ``Capped(scope)`` is returned;
its delivery is held, not nacked (``CapGate.park``). A claim that took a
place carries ``places_left``, which the caller hands to
``CapGate.capped_claim_done`` before the job runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from coldbrew.caps.decision import Capped, busy_scope, counted_scopes, full_scope, places_left
from coldbrew.rates.claim import Bucket, RateLimited, claim_with_tokens
from coldbrew.store.caps import CapStore
from coldbrew.store.records import ClaimRequest, ClaimResult

__all__ = ["claim_capped"]


async def claim_capped(
    caps: CapStore, request: ClaimRequest, buckets: Sequence[Bucket] = ()
) -> ClaimResult | Capped | RateLimited:
    """Claim ``request`` if its caps leave room (and, with ``buckets``, if its rate limits
    have a token: ``rates.claim_with_tokens``, under the caps' locks); else record it as
    waiting (see above)."""
    async with caps.claim_session() as session:
        async with session.transaction():
            locks = await session.try_lock_cap_scopes(request.tenant, request.type)
            wait: Capped | RateLimited | None = busy_scope(locks)
            if wait is None:
                room = await session.cap_room(*counted_scopes(locks, request.tenant, request.type))
                wait = full_scope(locks, room)
                if wait is None:
                    answer = (
                        await claim_with_tokens(session, request, buckets)
                        if buckets
                        else await session.claim(request)
                    )
                    if isinstance(answer, ClaimResult):
                        if answer.claimed:
                            answer.places_left = places_left(locks, room)
                        return answer
                    wait = answer
        # no room: the locks are already let go; record the job as waiting
        await session.register_waiting(request)
        result, claimable = await session.claimability(request.id)
    return wait if claimable else result  # else finished or held elsewhere: not a wait
