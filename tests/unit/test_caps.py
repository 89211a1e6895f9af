"""The capped claim's decisions (busy, full, places left) and how the gate hears a claim."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from coldbrew.caps import CapGate, Capped, busy_scope, counted_scopes, full_scope, places_left
from coldbrew.metrics import Metrics
from coldbrew.scheduler import FairScheduler, Pending
from coldbrew.store import CapLocks, CapRoom, ClaimRequest, ClaimResult


def locks(
    tenant_cap: int | None = None,
    type_cap: int | None = None,
    tenant_locked: bool | None = True,
    type_locked: bool | None = True,
) -> CapLocks:
    return CapLocks(tenant_cap, type_cap, tenant_locked, type_locked)


# --- decision.py ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        (locks(tenant_cap=2), None),
        (locks(tenant_cap=2, tenant_locked=False, type_locked=None), Capped("tenant", busy=True)),
        (locks(type_cap=2, type_locked=False), Capped("type", busy=True)),
        # the tenant's lock is judged first: the type's was then not even tried
        (
            locks(tenant_cap=1, type_cap=1, tenant_locked=False, type_locked=None),
            Capped("tenant", busy=True),
        ),
        (locks(tenant_cap=1, type_cap=1, type_locked=False), Capped("type", busy=True)),
    ],
)
def test_busy_scope_names_the_lock_another_claim_holds(
    found: CapLocks, expected: Capped | None
) -> None:
    assert busy_scope(found) == expected


def test_only_capped_scopes_are_counted() -> None:
    assert counted_scopes(locks(tenant_cap=3), "acme", "echo") == ("acme", None)
    assert counted_scopes(locks(type_cap=0), "acme", "echo") == (None, "echo")
    assert counted_scopes(locks(tenant_cap=1, type_cap=1), "acme", "echo") == ("acme", "echo")


@pytest.mark.parametrize(
    ("found", "room", "expected"),
    [
        (locks(tenant_cap=2), CapRoom(1, 0), None),
        (locks(tenant_cap=2), CapRoom(2, 0), Capped("tenant")),
        (locks(tenant_cap=0), CapRoom(0, 0), Capped("tenant")),  # cap 0: frozen
        (locks(type_cap=1), CapRoom(0, 1), Capped("type")),
        (locks(tenant_cap=1, type_cap=1), CapRoom(1, 1), Capped("tenant")),  # the tenant's first
        (locks(tenant_cap=5, type_cap=1), CapRoom(1, 1), Capped("type")),
        (locks(), CapRoom(100, 100), None),  # no cap: nothing can be full
    ],
)
def test_full_scope_is_the_first_cap_without_room(
    found: CapLocks, room: CapRoom, expected: Capped | None
) -> None:
    assert full_scope(found, room) == expected


def test_places_left_counts_the_claims_own_place() -> None:
    assert places_left(locks(tenant_cap=3), CapRoom(1, 0)) == {"tenant": 1}
    assert places_left(locks(tenant_cap=3, type_cap=2), CapRoom(2, 1)) == {"tenant": 0, "type": 0}
    assert places_left(locks(), CapRoom(0, 0)) == {}


# --- gate.py: a capped claim's result, told by its caller -------------------------------------


def pending(job_id: str, tenant: str = "acme", job_type: str = "echo") -> Pending[Any]:
    payload = SimpleNamespace(
        envelope=SimpleNamespace(id=job_id), spec=SimpleNamespace(name=job_type)
    )
    return Pending(tenant, 0, 0.0, payload)


def gate() -> tuple[CapGate, list[int]]:
    dispatched: list[int] = []
    cap_gate = CapGate(
        scheduler=FairScheduler(aging_seconds=60.0),
        aging_seconds=60.0,
        metrics=Metrics(CollectorRegistry()),
        dispatch=lambda: dispatched.append(1),
        listening=lambda: True,
    )
    cap_gate.set_caps({"acme": 2}, {})
    return cap_gate, dispatched


def claimed(job_id: str, left: dict[str, int] | None, status: str = "running") -> ClaimResult:
    return ClaimResult(job_id, left is not None, status, 1, 3, None, None, None, places_left=left)


def request(job_id: str) -> ClaimRequest:
    return ClaimRequest(job_id, "echo", "default", "acme", {}, 0, 3, None, None)


async def test_a_claim_with_places_left_lets_the_next_delivery_try_at_once() -> None:
    cap_gate, dispatched = gate()
    first = pending("j1")
    scopes = cap_gate.scopes(first)
    assert scopes == (("tenant", "acme"),)
    assert cap_gate.begin_claim(first, scopes)
    assert cap_gate.blocked(("tenant", "acme"))  # one claim in flight per scope
    cap_gate.capped_claim_done(claimed("j1", {"tenant": 1}))
    assert not cap_gate.blocked(("tenant", "acme"))
    assert dispatched == [1]


async def test_a_claim_that_took_the_last_place_marks_the_scope_full() -> None:
    cap_gate, dispatched = gate()
    first = pending("j1")
    assert cap_gate.begin_claim(first, cap_gate.scopes(first))
    cap_gate.capped_claim_done(claimed("j1", {"tenant": 0}))
    assert cap_gate.blocked(("tenant", "acme"))  # full: waits for a place to free
    assert dispatched == [1]
    cap_gate.drain()


async def test_a_capped_answer_parks_the_delivery_until_a_wake() -> None:
    """``Capped`` never reaches ``capped_claim_done`` (its type keeps it out): the intake
    parks the delivery, and the scope stays blocked, as full, until a wake."""
    cap_gate, dispatched = gate()
    first = pending("j1")
    assert cap_gate.begin_claim(first, cap_gate.scopes(first))
    cap_gate.park(first, Capped("tenant"))
    assert cap_gate.blocked(("tenant", "acme"))  # the claim is over, but the cap is full
    assert dispatched == []
