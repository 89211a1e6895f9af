"""Acks of asynchronous claims: which claims a commit covers, and what a restart left."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from coldbrew.claimacks import ClaimAcks, HeldAck, needs_verifying, split_covered, verdict
from coldbrew.errors import DatabaseUnavailable
from coldbrew.metrics import Metrics
from coldbrew.store import CommitMark

BOOT = datetime(2026, 1, 1, tzinfo=UTC)
REBOOT = BOOT + timedelta(minutes=5)


SETTLED: dict[str, list[Any]] = {"ack": [], "requeue": []}


class FakeDelivery:
    """Stands in for an ``Inbound``: records how it was settled, by its job id."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id

    def ack_soon(self) -> None:
        SETTLED["ack"].append(self.job_id)

    def requeue_soon(self) -> None:
        SETTLED["requeue"].append(self.job_id)

    async def requeue(self) -> bool:
        SETTLED["requeue"].append(self.job_id)
        return True


def held(job_id: str, seq: int, server: datetime = BOOT, attempt: int = 1) -> HeldAck:
    message = FakeDelivery(job_id)
    return HeldAck(job_id, attempt, CommitMark(server, seq), message=message)  # type: ignore[arg-type]


def ids(items: list[HeldAck]) -> list[str]:
    return [item.job_id for item in items]


def test_a_commit_covers_the_claims_of_its_server_that_committed_before_it() -> None:
    items = [held("a", 1), held("b", 2), held("c", 3), held("old", 1, server=REBOOT)]
    covered, rest = split_covered(items, BOOT, 2)
    assert ids(covered) == ["a", "b"]
    assert ids(rest) == ["c", "old"]


def test_claims_of_another_server_start_need_verifying_once_a_commit_passed_them() -> None:
    items = [held("a", 1), held("b", 4), held("new", 2, server=REBOOT)]
    assert ids(needs_verifying(items, REBOOT, 3)) == ["a"]  # b committed after the barrier was sent
    assert ids(needs_verifying(items, BOOT, 9)) == ["new"]


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (None, "lost"),  # a job published straight to RabbitMQ: its row was the claim's insert
        ({"attempt": 0, "worker_id": None}, "lost"),  # submitted row, the claim rolled back
        ({"attempt": 2, "worker_id": "w1"}, "lost"),  # attempt 3 was ours
        ({"attempt": 3, "worker_id": "w1"}, "verified"),
        ({"attempt": 3, "worker_id": None}, "verified"),  # finished: only attempt 3 could write
        ({"attempt": 3, "worker_id": "w2"}, "superseded"),  # another worker's attempt 3
        ({"attempt": 4, "worker_id": "w2"}, "superseded"),
    ],
)
def test_verdict_reads_the_row(row: dict[str, Any] | None, expected: str) -> None:
    assert verdict(held("j", 1, attempt=3), row, "w1") == expected


class FakeStore:
    def __init__(self) -> None:
        self.seq = 0
        self.server = BOOT
        self.rows: dict[str, dict[str, Any]] = {}
        self.barriers = 0
        self.down = 0  # barriers that fail before one succeeds

    async def durability_barrier(self) -> tuple[datetime, int]:
        if self.down:
            self.down -= 1
            raise DatabaseUnavailable("down")
        self.barriers += 1
        return self.server, self.seq

    async def verify_claims(self, job_ids: list[str]) -> dict[str, dict[str, Any]]:
        return {i: self.rows[i] for i in job_ids if i in self.rows}


@pytest.fixture
def settled() -> dict[str, list[Any]]:
    for record in SETTLED.values():
        record.clear()
    return SETTLED


def tracker(store: FakeStore, delay: float, stopped: list[Any]) -> ClaimAcks:
    return ClaimAcks(
        store,  # type: ignore[arg-type]
        Metrics(CollectorRegistry()),
        delay=delay,
        worker_id="w1",
        stop_job=stopped.append,
    )


async def test_a_completion_acks_the_claims_it_covers_and_no_barrier_runs(
    settled: dict[str, list[Any]],
) -> None:
    store = FakeStore()
    acks = tracker(store, 0.05, [])
    acks.hold(held("a", 1))
    acks.hold(held("b", 2))
    acks.committed(BOOT, 1)
    assert settled["ack"] == ["a"]
    acks.committed(BOOT, 2)
    assert settled["ack"] == ["a", "b"]
    await asyncio.sleep(0.1)
    assert store.barriers == 0
    assert len(acks) == 0


async def test_a_completion_batch_is_acted_on_once_for_all_its_outcomes(
    settled: dict[str, list[Any]],
) -> None:
    """The outcomes of one batch return one shared mark: the first acks what it covers, the
    others are no-ops, and a later batch's mark (equal or not) is acted on again."""
    store = FakeStore()
    acks = tracker(store, 10.0, [])
    acks.hold(held("a", 1))
    batch = CommitMark(BOOT, 1)
    acks.completed(batch)
    assert settled["ack"] == ["a"]
    acks.hold(held("b", 1))  # held after that batch's commit was heard
    acks.completed(batch)  # another outcome of the same batch
    assert settled["ack"] == ["a"]
    acks.completed(CommitMark(BOOT, 1))  # the next batch, sent after b's claim batch too
    assert settled["ack"] == ["a", "b"]
    acks.completed(CommitMark(BOOT, 0))  # a batch that covers nothing acks nothing
    assert settled["ack"] == ["a", "b"]
    await acks.close()


async def test_a_barrier_acks_what_no_completion_covered(settled: dict[str, list[Any]]) -> None:
    store = FakeStore()
    store.seq = 2
    acks = tracker(store, 0.02, [])
    acks.hold(held("a", 1))
    acks.hold(held("b", 2))
    assert settled["ack"] == []  # not before the delay
    await asyncio.sleep(0.1)
    assert settled["ack"] == ["a", "b"]
    assert store.barriers == 1


async def test_after_a_restart_survivors_are_acked_and_lost_claims_requeued_and_stopped(
    settled: dict[str, list[Any]],
) -> None:
    store = FakeStore()
    stopped: list[Any] = []
    acks = tracker(store, 0.01, stopped)
    store.down = 2  # PostgreSQL crashed; it comes back with another start time
    store.server, store.seq = REBOOT, 3
    store.rows = {
        "kept": {"attempt": 1, "worker_id": "w1"},
        "gone": {"attempt": 0, "worker_id": None},
        "moved": {"attempt": 2, "worker_id": "w2"},
    }
    for name in ["kept", "gone", "moved", "vanished"]:
        item = held(name, 1)
        item.state = f"state-{name}"  # type: ignore[assignment]
        acks.hold(item)
    acks.committed(REBOOT, 3)  # a completion on the new server proves nothing about these
    assert settled["ack"] == []
    for _ in range(100):
        if not len(acks):
            break
        await asyncio.sleep(0.05)
    assert sorted(settled["ack"]) == ["kept", "moved"]
    assert sorted(settled["requeue"]) == ["gone", "vanished"]
    assert sorted(stopped) == ["state-gone", "state-moved", "state-vanished"]


async def test_settle_all_requeues_what_it_cannot_prove(settled: dict[str, list[Any]]) -> None:
    store = FakeStore()
    store.down = 1000
    acks = tracker(store, 10.0, [])
    acks.hold(held("a", 1))
    await acks.settle_all(timeout=0.3)
    assert settled["requeue"] == ["a"]
    acks.hold(held("late", 2))  # after the close: straight back to RabbitMQ
    assert settled["requeue"] == ["a", "late"]
