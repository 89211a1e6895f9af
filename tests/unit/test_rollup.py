"""The rollup's pure parts: the buckets, percentiles read from them within the documented
error of ``percentile_cont``'s, and how a window is split between rollup and raw rows."""

from __future__ import annotations

import math
import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from coldbrew.store.rollup import (
    FLOOR_SECONDS,
    RELATIVE_ERROR,
    TOP_BUCKET,
    bucket_middle,
    bucket_of,
    percentile,
    plan_window,
)


def percentile_cont(values: list[float], fraction: float) -> float:
    """PostgreSQL's percentile_cont: linear interpolation between the two nearest ranks."""
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


def histogram(values: list[float]) -> tuple[list[int], list[int]]:
    counts = Counter(bucket_of(v) for v in values)
    buckets = sorted(counts)
    return buckets, [counts[b] for b in buckets]


def test_the_error_bound_is_half_a_bucket() -> None:
    """4.4%: the geometric middle of a bucket eight to a doubling."""
    assert pytest.approx(0.0443, abs=1e-4) == RELATIVE_ERROR
    for bucket in (1, 50, 200, TOP_BUCKET - 1):
        low = FLOOR_SECONDS * 2 ** ((bucket - 1) / 8)
        high = FLOOR_SECONDS * 2 ** (bucket / 8)
        assert bucket_of(low * (1 + 1e-12)) == bucket
        assert bucket_of(high * (1 - 1e-12)) == bucket
        middle = bucket_middle(bucket)
        assert low < middle < high
        assert max(middle / low - 1, 1 - middle / high) <= RELATIVE_ERROR + 1e-12


def test_short_negative_and_huge_durations_have_a_bucket() -> None:
    assert bucket_of(-3.0) == bucket_of(0.0) == bucket_of(FLOOR_SECONDS / 2) == 0
    assert bucket_of(math.nan) == 0
    assert bucket_of(1e12) == TOP_BUCKET
    assert bucket_middle(0) == FLOOR_SECONDS / 2


@pytest.mark.parametrize("seed", range(20))
def test_percentiles_from_buckets_are_within_the_error(seed: int) -> None:
    """Random samples (log-uniform, clustered, tiny, a single value): p50, p95, p99 and the
    extremes from the histogram are within the bound of percentile_cont's."""
    rng = random.Random(seed)
    kind = seed % 4
    size = rng.choice([1, 2, 3, 10, 101, 2000])
    if kind == 0:
        values = [10 ** rng.uniform(-4, 4) for _ in range(size)]
    elif kind == 1:
        values = [rng.gauss(2.0, 0.05) for _ in range(size)]
    elif kind == 2:
        values = [rng.uniform(0, 3e-4) for _ in range(size)]
    else:
        values = [rng.choice([0.5, 1.0, 30.0]) for _ in range(size)]
    buckets, counts = histogram(values)
    for fraction in (0.0, 0.5, 0.95, 0.99, 1.0):
        exact = percentile_cont(values, fraction)
        estimate = percentile(buckets, counts, fraction)
        assert estimate is not None
        assert abs(estimate - exact) <= max(
            RELATIVE_ERROR * exact * (1 + 1e-9), FLOOR_SECONDS / 2 + 1e-12
        ), (fraction, estimate, exact)


def test_an_empty_histogram_has_no_percentile() -> None:
    assert percentile([], [], 0.5) is None


AT = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def test_a_window_starting_late_in_its_minute_adds_the_rest_of_it() -> None:
    since = AT + timedelta(seconds=40)
    plan = plan_window(since, AT + timedelta(minutes=30, seconds=7))
    assert plan.rolled_from == AT + timedelta(minutes=1)
    assert plan.rolled_to == plan.tail == AT + timedelta(minutes=30, seconds=7)
    assert plan.add == (since, AT + timedelta(minutes=1))
    assert plan.subtract[0] == plan.subtract[1]


def test_a_window_starting_early_in_its_minute_subtracts_the_start_of_it() -> None:
    since = AT + timedelta(seconds=12)
    plan = plan_window(since, AT + timedelta(minutes=30))
    assert (plan.rolled_from, plan.rolled_to) == (AT, AT + timedelta(minutes=30))
    assert plan.subtract == (AT, since)
    assert plan.add[0] == plan.add[1]
    assert plan.tail == AT + timedelta(minutes=30)


def test_a_window_on_a_minute_reads_no_partial_minute() -> None:
    plan = plan_window(AT, AT + timedelta(minutes=3))
    assert (plan.rolled_from, plan.rolled_to, plan.tail) == (
        AT,
        AT + timedelta(minutes=3),
        plan.tail,
    )
    assert plan.add[0] == plan.add[1] and plan.subtract[0] == plan.subtract[1]


@pytest.mark.parametrize(
    "folded_to",
    [None, AT - timedelta(hours=1), AT + timedelta(seconds=50), AT + timedelta(minutes=1)],
)
def test_a_window_the_fold_has_not_passed_is_read_raw(folded_to: datetime | None) -> None:
    since = AT + timedelta(seconds=20)
    plan = plan_window(since, folded_to)
    assert plan.rolled_from == plan.rolled_to
    assert plan.tail == since
    assert plan.add[0] == plan.add[1] and plan.subtract[0] == plan.subtract[1]
