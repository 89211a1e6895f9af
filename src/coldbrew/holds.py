"""Deliveries a gate holds per scope: what the cap gate and the rate gate share.

Both gates (caps/gate.py, rates/gate.py) keep, per scope, a scheduler of the
deliveries that wait for it (``held``) and a re-check timer (``timer``), plus
the claims they have in flight. Listing, filtering and draining those is the
same walk for both; it lives here once. Pure: no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from coldbrew.jobstate import Delivery
from coldbrew.scheduler import FairScheduler, Pending

__all__ = ["HeldState", "drain_held", "held_items", "remove_held_where"]


class HeldState(Protocol):
    """A scope's state as a gate keeps it: its held deliveries and its re-check timer."""

    timer: asyncio.TimerHandle | None
    held: FairScheduler[Delivery] | None


def held_items(
    states: Iterable[HeldState], claiming: Mapping[str, tuple[Pending[Delivery], Any]]
) -> Iterator[Pending[Delivery]]:
    """Every delivery held: waiting in a scope's ``held`` or its claim in flight."""
    for state in states:
        if state.held:
            yield from state.held.items()
    for pending, _ in claiming.values():
        yield pending


def remove_held_where(
    states: Iterable[HeldState], pred: Callable[[Pending[Delivery]], bool]
) -> list[Pending[Delivery]]:
    """Take out the held deliveries for which ``pred`` is true."""
    removed: list[Pending[Delivery]] = []
    for state in states:
        if state.held:
            removed.extend(state.held.remove_where(pred))
    return removed


def drain_held(states: Iterable[HeldState]) -> list[Pending[Delivery]]:
    """Stop every scope's timer and give back every held delivery (shutdown)."""
    waiting: list[Pending[Delivery]] = []
    for state in states:
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        if state.held is not None:
            waiting.extend(state.held.drain())
            state.held = None
    return waiting
