"""The hold's policy: Little's law over the start rate, bounded by free slots and the cap."""

from __future__ import annotations

import pytest

from coldbrew.holdsize import Consume, HoldLimits, Pause, PrefetchPermit, StartRate, plan
from coldbrew.settings import DEFAULT_HOLD_CAP, load_settings

LIMITS = HoldLimits(concurrency=2, hold_seconds=0.25, cap=1000)


def test_a_start_up_burst_is_averaged_over_the_window() -> None:
    """Two long jobs started at once are not read as a rate of hundreds per second."""
    rate = StartRate(window=2.0, now=0.0)
    assert rate.tick(0.25, 2) < 1.0
    assert LIMITS.soon(rate.rate) == 0


def test_a_steady_rate_converges() -> None:
    rate = StartRate(window=2.0, now=0.0)
    for step in range(1, 81):  # 20 s at 4,000 starts/s
        rate.tick(step * 0.25, step * 1000)
    assert rate.rate == pytest.approx(4000, rel=0.01)
    assert rate.tick(20.0, 80_000) == rate.rate  # no time passed: unchanged


def test_the_rate_decays_when_starts_stop() -> None:
    rate = StartRate(window=2.0, now=0.0)
    rate.tick(1.0, 1000)
    high = rate.rate
    rate.tick(11.0, 1000)
    assert rate.rate < high * 0.01


def test_prefetch_is_the_free_slots_or_the_horizon_capped() -> None:
    limits = HoldLimits(concurrency=100, hold_seconds=0.25, cap=300)
    assert limits.prefetch(running=0, rate=0.0) == 100  # idle: the free slots
    assert limits.prefetch(running=100, rate=0.0) == 1  # never 0 (unlimited in AMQP)
    assert limits.prefetch(running=100, rate=400.0) == 100  # 400/s x 0.25 s
    assert limits.prefetch(running=0, rate=50_000.0) == 300  # the cap


def test_long_jobs_on_full_slots_pause_with_nothing_waiting() -> None:
    """30 s jobs: the rate is tiny, so a full worker holds nothing and stops consuming."""
    action = plan(
        LIMITS, consuming=True, prefetch=2, running=2, waiting=0, rate=0.07, may_resize=True
    )
    assert action == Pause()
    assert (
        plan(LIMITS, consuming=False, prefetch=2, running=2, waiting=0, rate=0.07, may_resize=True)
        is None
    )


def test_a_free_slot_always_consumes_whatever_waits() -> None:
    """Held deliveries of a paused or capped tenant never stop the others being consumed."""
    action = plan(
        LIMITS, consuming=False, prefetch=2, running=1, waiting=50, rate=0.0, may_resize=False
    )
    assert action == Consume(1)


def test_short_jobs_keep_consuming_until_the_horizon_is_held() -> None:
    limits = HoldLimits(concurrency=100, hold_seconds=0.25, cap=1000)
    busy = {"consuming": True, "prefetch": 1000, "running": 100, "may_resize": True}
    assert plan(limits, waiting=10, rate=4000.0, **busy) is None  # 1000 start within 0.25 s
    assert plan(limits, waiting=1000, rate=4000.0, **busy) == Pause()


def test_resizing_waits_for_a_factor_of_two_and_its_turn() -> None:
    limits = HoldLimits(concurrency=100, hold_seconds=0.25, cap=1000)
    state = {"consuming": True, "prefetch": 100, "running": 50, "waiting": 0}
    assert plan(limits, rate=600.0, may_resize=True, **state) is None  # 150: under 2x
    assert plan(limits, rate=4000.0, may_resize=False, **state) is None  # not its turn
    assert plan(limits, rate=4000.0, may_resize=True, **state) == Consume(1000)
    shrink = {**state, "prefetch": 1000}
    assert plan(limits, rate=0.0, may_resize=True, **shrink) == Consume(50)


def test_prefetch_setting_is_the_cap() -> None:
    assert load_settings().hold_cap == DEFAULT_HOLD_CAP
    assert load_settings(prefetch=2).hold_cap == 2
    assert load_settings(hold_seconds=0).hold_seconds == 0


def test_the_prefetch_rises_only_after_a_report_says_so() -> None:
    """The reconciler bounds unacked deliveries by the reported prefetch: a rise waits for
    a committed report; a fall takes effect when the report is claimed."""
    permit = PrefetchPermit(4)
    assert permit.ask(100) == 4 and permit.pending and permit.asked.is_set()
    claimed = permit.claim()
    assert claimed == 100 and permit.ask(100) == 4, "not before the report is committed"
    permit.confirmed(claimed)
    assert permit.ask(100) == 100 and not permit.pending
    permit.live = 100
    assert permit.ask(10) == 10
    permit.live = 10
    assert permit.claim() == 10 and permit.granted == 10, "a fall is granted at once"
    assert permit.ask(50) == 10
