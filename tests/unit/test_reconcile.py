"""The reconcile rules: which waiting rows cannot have a message in their queue (pure parts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from coldbrew.scheduler import FairScheduler, Pending
from coldbrew.stats import lane_consumers
from coldbrew.store import QueueLook, WaitingCount
from coldbrew.topology import Topology
from coldbrew.transport import QueueCounts
from coldbrew.worker.reconcile import Bounds, judge, per_consumer

NOW = datetime(2025, 1, 1, tzinfo=UTC)
BOUNDS = Bounds(prefetch=8, keep=8, min_gap=10.0, max_age=60.0)


def waiting(
    confirmed: int,
    *,
    before: int | None = None,
    held: int = 0,
    look_age: float | None = 20.0,
    previous_ready: int | None = 0,
    previous_deficit: int | None = None,
    top_priority: int = 0,
    fleet_prefetch: int | None = None,
    fleet_prefetch_sum: int | None = None,
    suspects_age: float | None = 25.0,
    sweeping: int = 0,
) -> WaitingCount:
    """A queue's counts; by default its previous look was 20 s ago and suspected rows
    confirmed up to 25 s ago."""
    return WaitingCount(
        queue="default",
        tenant="default",
        waiting=confirmed,
        waiting_before=confirmed if before is None else before,
        top_priority=top_priority,
        held=held,
        previous_look=None if look_age is None else NOW - timedelta(seconds=look_age),
        previous_ready=previous_ready,
        previous_deficit=previous_deficit,
        previous_suspects=None if suspects_age is None else NOW - timedelta(seconds=suspects_age),
        sweeping=sweeping,
        fleet_prefetch=fleet_prefetch,
        fleet_prefetch_sum=fleet_prefetch_sum,
    )


def test_a_backlog_within_what_consumers_hold_is_never_short() -> None:
    """20,000 rows, 19,984 ready, two consumers holding 8 each: no deficit at any look."""
    counts = QueueCounts(ready=19_984, consumers=2)
    first = judge(counts, waiting(20_000, look_age=None), started=NOW, bounds=BOUNDS)
    assert first.deficit is not None and first.deficit <= 0 and first.republish == 0
    second = judge(
        counts,
        waiting(20_000, previous_ready=19_990, previous_deficit=first.deficit),
        started=NOW,
        bounds=BOUNDS,
    )
    assert second.republish == 0


def test_the_count_rule_needs_the_deficit_at_two_looks_and_takes_the_smaller() -> None:
    counts = QueueCounts(ready=500, consumers=2)
    once = judge(counts, waiting(1_000, previous_ready=900), started=NOW, bounds=BOUNDS)
    assert once.deficit == 1_000 - 500 - 16 - 8  # two consumers, and one paused worker's
    assert once.republish == 0, "one look is not enough: a draining worker's deliveries"
    twice = judge(
        counts, waiting(1_000, previous_ready=900, previous_deficit=300), started=NOW, bounds=BOUNDS
    )
    assert (twice.republish, twice.rule) == (300, "count")
    assert twice.confirmed_by == NOW - timedelta(seconds=25), "only the previous look's suspects"
    assert twice.suspects == 476, "this look's own suspects, for the next one"


def test_nothing_is_republished_that_the_previous_look_did_not_suspect() -> None:
    counts = QueueCounts(ready=0, consumers=1)
    verdict = judge(
        counts, waiting(40, previous_deficit=30, suspects_age=None), started=NOW, bounds=BOUNDS
    )
    assert verdict.republish == 0 and verdict.suspects == 40
    # suspects confirmed after the previous look began: only rows confirmed before it count
    later = judge(counts, waiting(40, suspects_age=1.0), started=NOW, bounds=BOUNDS)
    assert later.confirmed_by == NOW - timedelta(seconds=20)


def test_the_idle_rule_finds_a_loss_smaller_than_the_prefetch_bound() -> None:
    """An empty queue at two looks: rows confirmed before the first, beyond those reported
    held, are lost, however small the loss."""
    counts = QueueCounts(ready=0, consumers=2)
    verdict = judge(counts, waiting(5, before=5, held=2), started=NOW, bounds=BOUNDS)
    assert verdict.deficit == 5 - 16 - 8 - 2
    assert (verdict.republish, verdict.rule) == (3, "idle")


def test_held_deliveries_of_saturated_workers_are_not_lost() -> None:
    counts = QueueCounts(ready=0, consumers=3)
    verdict = judge(counts, waiting(24, before=24, held=24), started=NOW, bounds=BOUNDS)
    assert verdict.republish == 0


def test_paused_consumers_deliveries_are_not_lost() -> None:
    """Two saturated workers cancelled their consumers (the broker counts none) and hold 30
    deliveries unclaimed between them, and up to their prefetch more that were in flight at
    the cancel: the count rule finds no deficit; a loss beyond all that is still found."""
    paused = QueueCounts(ready=500, consumers=0)
    held = waiting(
        550,
        held=30,
        fleet_prefetch=10,
        fleet_prefetch_sum=20,
        previous_ready=500,
        previous_deficit=20,
    )
    verdict = judge(paused, held, started=NOW, bounds=BOUNDS)
    assert verdict.deficit == 550 - 500 - 30 - 20 and verdict.republish == 0
    lost = QueueCounts(ready=300, consumers=0)  # 200 messages gone from the queue
    verdict = judge(lost, held, started=NOW, bounds=BOUNDS)
    assert verdict.deficit == 200 and (verdict.republish, verdict.rule) == (20, "count")


def test_the_idle_rule_needs_an_empty_queue_at_both_looks() -> None:
    counts = QueueCounts(ready=0, consumers=1)
    verdict = judge(counts, waiting(3, previous_ready=4), started=NOW, bounds=BOUNDS)
    assert verdict.republish == 0


@pytest.mark.parametrize("age", [None, 5.0, 61.0])
def test_a_previous_look_too_recent_or_too_old_decides_nothing(age: float | None) -> None:
    counts = QueueCounts(ready=0, consumers=1)
    verdict = judge(
        counts, waiting(100, look_age=age, previous_deficit=100), started=NOW, bounds=BOUNDS
    )
    assert verdict.republish == 0


def test_a_missing_queue_has_no_bound_and_nothing_to_republish() -> None:
    verdict = judge(None, waiting(10), started=NOW, bounds=BOUNDS)
    assert verdict == type(verdict)(None)


def test_a_queue_without_confirmed_rows_has_nothing_missing() -> None:
    verdict = judge(QueueCounts(ready=7, consumers=0), None, started=NOW, bounds=BOUNDS)
    assert verdict.deficit == -7 and verdict.republish == 0


def test_the_republish_is_bounded_per_pass() -> None:
    bounds = Bounds(prefetch=8, keep=0, min_gap=1.0, max_age=60.0, limit=1000)
    counts = QueueCounts(ready=0, consumers=1)
    verdict = judge(counts, waiting(50_000), started=NOW, bounds=bounds)
    assert verdict.republish == 1000


def test_the_bound_is_the_fleets_largest_prefetch_and_kept_sweeps_count_with_priorities() -> None:
    assert per_consumer(waiting(1), BOUNDS) == 8
    assert per_consumer(waiting(1, fleet_prefetch=64), BOUNDS) == 64
    assert per_consumer(waiting(1, top_priority=3), BOUNDS) == 8 + 8


def test_what_a_running_sweep_took_is_not_lost() -> None:
    """A look during an aging sweep: 1,000 ready messages are on the sweep's channel."""
    counts = QueueCounts(ready=19_000, consumers=3)  # two workers and the sweep's consumer
    during = waiting(
        20_000, top_priority=9, previous_ready=19_000, previous_deficit=10, sweeping=1_000
    )
    verdict = judge(counts, during, started=NOW, bounds=BOUNDS)
    assert verdict.deficit is not None and verdict.deficit <= 0 and verdict.republish == 0
    # a sweep that took a small queue's every message: empty at both looks, nothing lost
    emptied = QueueCounts(ready=0, consumers=3)
    verdict = judge(emptied, waiting(300, held=16, sweeping=300), started=NOW, bounds=BOUNDS)
    assert verdict.republish == 0 and verdict.suspects == 0


def test_job_queue_names_parse_back_to_their_pair() -> None:
    topology = Topology("ns")
    assert topology.job_queue_pair(topology.job_queue("fast", "acme")) == ("fast", "acme")
    assert topology.job_queue_pair("ns.unrouted") is None
    assert topology.job_queue_pair("other.q.fast.acme") is None
    assert topology.job_queue_pair("ns.q.fast") is None


def test_lane_consumers_take_the_most_of_a_lanes_fresh_looks() -> None:
    looks = [
        QueueLook("fast", "a", 0, 2, 0, 0, 1.0),
        QueueLook("fast", "b", 5, 1, 5, 0, 1.0),
        QueueLook("orphan", "a", 5, 0, 5, 0, 1.0),
        QueueLook("gone", "a", None, None, 3, None, 1.0),
        QueueLook("stale", "a", 0, 4, 0, 0, 500.0),
    ]
    assert lane_consumers(looks, max_age=60) == {"fast": 2, "orphan": 0}


def test_scheduler_items_lists_every_pending_item() -> None:
    scheduler: FairScheduler[str] = FairScheduler()
    for index, tenant in enumerate(["a", "a", "b"]):
        scheduler.push(Pending(tenant, index % 10, float(index), f"item-{index}"))
    scheduler.pop(10.0)
    listed = sorted(p.payload for p in scheduler.items())
    assert len(listed) == 2
    assert listed == sorted(p.payload for p in scheduler.drain())
