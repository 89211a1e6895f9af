"""``aging.py``: when a queue may hide held-back messages, and which swept ones to keep."""

from __future__ import annotations

import pytest

from coldbrew.aging import StarvationWatch, clamp_priority, plan_sweep

KEY = ("default", "acme")
W = 1.0


def stream(watch: StarvationWatch, priority: int, start: float, end: float) -> None:
    """Deliveries of ``priority`` every 0.1 s in [start, end)."""
    t = start
    while t < end:
        watch.observe(KEY, priority, t)
        t += 0.1


def test_a_priority_nine_stream_makes_the_queue_due_after_one_window() -> None:
    watch = StarvationWatch(W)
    stream(watch, 9, 0.0, 2.0)
    assert watch.due(0.9) == []
    assert watch.due(1.95) == [KEY]


def test_lowest_priority_deliveries_keep_the_queue_clear() -> None:
    watch = StarvationWatch(W)
    for t in range(50):
        watch.observe(KEY, 9, t * 0.1)
        if t % 5 == 0:
            watch.observe(KEY, 0, t * 0.1)
    assert watch.due(5.0) == []


def test_a_middle_priority_flowing_still_leaves_lower_levels_held_back() -> None:
    watch = StarvationWatch(W)
    stream(watch, 9, 0.0, 3.0)
    stream(watch, 4, 0.05, 3.0)
    assert watch.due(3.0) == [KEY]  # levels 0..3 were never clear after t=0


def test_an_idle_queue_is_not_due() -> None:
    watch = StarvationWatch(W)
    watch.observe(KEY, 9, 0.0)
    # nothing was delivered after the watch began: nothing is known to be ahead of anything
    assert watch.due(10.0) == []


def test_a_recent_sweep_defers_the_next_one_even_when_it_cleared_nothing() -> None:
    watch = StarvationWatch(W)
    stream(watch, 9, 0.0, 5.0)
    assert watch.due(2.0) == [KEY]
    watch.swept(KEY, 2.0, cleared=())
    assert watch.due(2.5) == []
    assert watch.due(3.05) == [KEY]


def test_a_sweep_that_cleared_the_low_levels_resets_them() -> None:
    watch = StarvationWatch(W)
    stream(watch, 9, 0.0, 5.0)
    watch.swept(KEY, 2.0, cleared=tuple(range(9)))
    assert watch.due(2.9) == []
    assert watch.due(3.1) == [KEY]  # a window of priority-9 deliveries after the sweep


def test_plan_keeps_held_back_levels_and_returns_the_rest() -> None:
    clear = [0.0] * 5 + [9.5] * 5  # levels 0-4 held back since 0, levels 5-9 clear at 9.5
    plan = plan_sweep(
        [9, 9, 7, 3, 0, 0],
        clear,
        now=10.0,
        window=W,
        keep_max=10,
        drained=True,
        oldest=-100.0,
    )
    assert sorted(plan.keep) == [3, 4, 5]
    assert set(plan.keep.values()) == {0.0}
    # levels with a returned message (7, 9) are not empty; the others are
    assert plan.cleared == (0, 1, 2, 3, 4, 5, 6, 8)


def test_plan_prefers_the_longest_held_back_and_respects_keep_max() -> None:
    clear = [1.0, 2.0, 3.0] + [9.9] * 7
    plan = plan_sweep(
        [9, 2, 2, 1, 0, 0],
        clear,
        now=10.0,
        window=W,
        keep_max=3,
        drained=True,
        oldest=-100.0,
    )
    assert plan.keep == {4: 1.0, 5: 1.0, 3: 2.0}
    # a priority-2 message went back: level 2 is not empty, nor is 9
    assert 2 not in plan.cleared and 9 not in plan.cleared
    assert 0 in plan.cleared and 1 in plan.cleared


def test_plan_counts_arrival_no_earlier_than_oldest() -> None:
    plan = plan_sweep([0], [0.0] * 10, now=100.0, window=W, keep_max=5, drained=True, oldest=90.0)
    assert plan.keep == {0: 90.0}


def test_plan_without_drain_clears_nothing() -> None:
    plan = plan_sweep([9, 0], [0.0] * 10, now=10.0, window=W, keep_max=5, drained=False, oldest=0.0)
    assert sorted(plan.keep) == [0, 1]
    assert plan.cleared == ()


def test_recently_clear_levels_are_not_kept() -> None:
    plan = plan_sweep([0, 0], [9.5] * 10, now=10.0, window=W, keep_max=5, drained=True, oldest=0.0)
    assert plan.keep == {}
    assert 0 not in plan.cleared


def test_watch_plan_uses_its_own_levels() -> None:
    watch = StarvationWatch(W)
    stream(watch, 9, 0.0, 3.0)
    plan = watch.plan(KEY, [9, 9, 0], now=3.0, keep_max=5, drained=True, oldest=0.0)
    assert plan.keep == {2: 0.0}
    assert watch.plan(("other", "x"), [0], now=3.0, keep_max=5, drained=True, oldest=0.0).keep == {}


@pytest.mark.parametrize(("raw", "level"), [(None, 0), (-3, 0), (0, 0), (5, 5), (12, 9)])
def test_clamp_priority(raw: int | None, level: int) -> None:
    assert clamp_priority(raw) == level


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        StarvationWatch(0)
