"""What a capped claim's facts mean: a busy lock, a full cap, the places left.

Pure functions over what the store read under the scopes' advisory locks
(``CapLocks``, ``CapRoom``). The tenant's scope is judged before the type's,
the order in which ``try_lock_cap_scopes`` takes the locks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from coldbrew.store.records import CapLocks, CapRoom

__all__ = ["Capped", "ScopeKind", "busy_scope", "counted_scopes", "full_scope", "places_left"]

ScopeKind = Literal["tenant", "type"]


@dataclass(frozen=True, slots=True)
class Capped:
    """A capped claim found no room: the job is recorded as queued and its delivery waits.

    ``kind`` names the scope whose cap is full (the tenant's is judged first);
    ``busy``: another worker's capped claim held that scope's lock at that
    instant -- there may be room, so the delivery tries again soon.
    """

    kind: ScopeKind
    busy: bool = False


def busy_scope(locks: CapLocks) -> Capped | None:
    """Which scope's lock another transaction holds (``busy``), or None."""
    if locks.tenant_locked is False:
        return Capped("tenant", busy=True)
    if locks.type_locked is False:
        return Capped("type", busy=True)
    return None


def counted_scopes(locks: CapLocks, tenant: str, job_type: str) -> tuple[str | None, str | None]:
    """The tenant and the type whose running jobs count, i.e. those with a cap (else None)."""
    return (
        tenant if locks.tenant_cap is not None else None,
        job_type if locks.type_cap is not None else None,
    )


def full_scope(locks: CapLocks, room: CapRoom) -> Capped | None:
    """Which cap (``tenant`` first, then ``type``) leaves no room, or None."""
    if locks.tenant_cap is not None and room.tenant_running >= locks.tenant_cap:
        return Capped("tenant")
    if locks.type_cap is not None and room.type_running >= locks.type_cap:
        return Capped("type")
    return None


def places_left(locks: CapLocks, room: CapRoom) -> dict[str, int]:
    """Places each capped scope has left once this claim took one."""
    left = {}
    if locks.tenant_cap is not None:
        left["tenant"] = locks.tenant_cap - room.tenant_running - 1
    if locks.type_cap is not None:
        left["type"] = locks.type_cap - room.type_running - 1
    return left
