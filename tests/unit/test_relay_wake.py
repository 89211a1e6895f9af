"""The relay sleeps until the earliest publish mark ahead when it falls before its next tick."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from coldbrew.metrics import Metrics
from coldbrew.worker.relay import WAKE_SLACK, Relay


class Outbox:
    def __init__(self, next_due: float | None) -> None:
        self.next_due = next_due
        self.horizons: list[float] = []

    async def take_due_publishes(self, limit: int, retry_after: float) -> list[Any]:
        return []

    async def next_due_in(self, horizon: float) -> float | None:
        self.horizons.append(horizon)
        return self.next_due


def relay(next_due: float | None) -> tuple[Relay, Outbox]:
    outbox = Outbox(next_due)
    store: Any = SimpleNamespace(outbox=outbox)
    return Relay(store, None, Metrics(CollectorRegistry()), interval=1.0), outbox  # type: ignore[arg-type]


async def test_wakes_for_a_mark_before_the_next_tick() -> None:
    soon, outbox = relay(0.3)
    assert await soon.publish_due() == 0
    assert outbox.horizons == [1.0]  # only marks before the next tick matter
    assert 0.25 < soon.next_wait() <= 0.3 + WAKE_SLACK
    assert soon.next_wait() == 1.0  # used once: the next pass asks again


async def test_sleeps_the_interval_without_one() -> None:
    idle, _ = relay(None)
    await idle.publish_due()
    assert idle.next_wait() == 1.0


async def test_a_mark_already_past_wakes_at_once() -> None:
    late, _ = relay(-0.5)
    await late.publish_due()
    assert late.next_wait() == WAKE_SLACK
