"""capacity.py: Erlang C against textbook values, the wait quantiles, targets, the planner."""

from __future__ import annotations

import math

import pytest

from coldbrew.capacity import (
    MIN_ARRIVALS,
    MIN_TIMED,
    LaneSample,
    RateChange,
    WaitTarget,
    erlang_c,
    mean_wait,
    parse_rate_change,
    parse_target,
    plan_lane,
    predicted_wait,
    slots_needed,
    wait_quantile,
)
from coldbrew.errors import ConfigurationError


def erlang_c_by_factorials(c: int, a: float) -> float:
    """The textbook formula, written out independently of the recursion under test."""
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


@pytest.mark.parametrize(
    ("slots", "load", "expected"),
    [
        (2, 1.0, 1 / 3),  # the classic: two servers, one erlang
        (1, 0.5, 0.5),  # M/M/1: P(wait) = rho
        (1, 0.9, 0.9),
        (10, 8.0, 0.4092),  # call-centre tables: 10 agents, 8 erlangs -> 40.9 %
        (11, 10.0, 0.6821),  # 11 agents, 10 erlangs -> 68.2 %
        (3, 2.0, 4 / 9),  # (8/6 * 3) / (1 + 2 + 2 + 4) = 4/9
    ],
)
def test_erlang_c_matches_textbook_values(slots: int, load: float, expected: float) -> None:
    assert erlang_c(slots, load) == pytest.approx(expected, abs=5e-5)


@pytest.mark.parametrize(("slots", "load"), [(5, 3.3), (20, 17.0), (50, 45.5), (100, 80.0)])
def test_erlang_c_recursion_equals_the_factorial_formula(slots: int, load: float) -> None:
    assert erlang_c(slots, load) == pytest.approx(erlang_c_by_factorials(slots, load), rel=1e-9)


def test_erlang_c_edges() -> None:
    """No load never waits; a load at or above the slots always waits; huge fleets compute."""
    assert erlang_c(4, 0.0) == 0.0
    assert erlang_c(4, 4.0) == 1.0
    assert erlang_c(4, 9.0) == 1.0
    assert 0 < erlang_c(100_000, 99_000.0) < 1
    with pytest.raises(ValueError, match="at least 1"):
        erlang_c(0, 1.0)


def test_mean_wait_and_quantiles_for_mm1() -> None:
    """M/M/1 with rho 0.5, W 1 s: Wq = rho W / (1 - rho) = 1 s; P(Wq > t) = rho e^(-(1-rho)t/W)."""
    assert mean_wait(1, 0.5, 1.0) == pytest.approx(1.0)
    # the median wait is 0 (half the jobs do not wait); the p90 solves 0.5 e^(-t/2) = 0.1
    assert wait_quantile(1, 0.5, 1.0, 0.5) == 0.0
    assert wait_quantile(1, 0.5, 1.0, 0.9) == pytest.approx(2 * math.log(5))
    assert math.isinf(mean_wait(2, 2.0, 1.0))
    assert math.isinf(wait_quantile(2, 3.0, 1.0, 0.95))


def test_slots_needed_is_the_fewest_meeting_the_target() -> None:
    target = WaitTarget(0.95, 5.0)
    needed = slots_needed(8.0, 10.0, target)
    assert wait_quantile(needed, 8.0, 10.0, 0.95) <= 5.0
    assert wait_quantile(needed - 1, 8.0, 10.0, 0.95) > 5.0
    # a mean target of zero wait is never met exactly, but a tiny one is, with more slots
    assert slots_needed(8.0, 10.0, WaitTarget(None, 0.01)) > needed


@pytest.mark.parametrize(
    ("text", "quantile", "seconds"),
    [
        ("p95<=5s", 0.95, 5.0),
        ("P99 <= 500ms", 0.99, 0.5),
        ("mean<=2s", None, 2.0),
        ("p50<1m", 0.5, 60),
    ],
)
def test_parse_target(text: str, quantile: float | None, seconds: float) -> None:
    target = parse_target(text)
    assert target.quantile == (pytest.approx(quantile) if quantile else None)
    assert target.seconds == seconds


@pytest.mark.parametrize("text", ["", "p95", "p95<=", "p95<=soon", "p0<=5s", "max<=5s", "p100<=1s"])
def test_parse_target_rejects_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ConfigurationError, match=r"--target-wait"):
        parse_target(text)


def test_parse_rate_change() -> None:
    assert parse_rate_change("2x").apply(3.0) == 6.0
    assert parse_rate_change("600/m").apply(3.0) == 10.0
    assert parse_rate_change("36/h") == RateChange(None, 0.01)
    for bad in ("2", "x2", "-1x", "0x", "5/d", "fast"):
        with pytest.raises(ConfigurationError, match="--what-if-rate"):
            parse_rate_change(bad)


def sample(**overrides: object) -> LaneSample:
    values: dict[str, object] = {
        "queue": "default",
        "window_seconds": 100.0,
        "submitted": 800,
        "finished": 790,
        "timed": 700,
        "service_mean_seconds": 1.0,
        "service_stddev_seconds": 1.0,
        "service_p95_seconds": 3.0,
        "waiting": 4,
        "slots": 10,
        "workers": 2,
    }
    values.update(overrides)
    return LaneSample(**values)  # type: ignore[arg-type]


def test_plan_lane_little_and_erlang() -> None:
    """λ 8/s, W 1 s on 10 slots: L = 8, rho = 0.8, P(wait) = C(10, 8); slots for p95<=5s."""
    target = WaitTarget(0.95, 0.5)
    plan = plan_lane(sample(), target)
    assert plan.status == "ok"
    assert plan.arrival_rate == pytest.approx(8.0)
    assert plan.load == pytest.approx(8.0)
    assert plan.utilisation == pytest.approx(0.8)
    assert plan.wait_probability == pytest.approx(0.4092, abs=5e-5)
    assert plan.mean_wait_seconds == pytest.approx(0.4092 / 2, abs=1e-4)
    assert plan.slots_needed == slots_needed(8.0, 1.0, target)
    assert plan.workers_needed == math.ceil(plan.slots_needed / 5)
    assert plan.service_cv == pytest.approx(1.0)


def test_plan_lane_what_if_overload_is_unbounded_and_json_safe() -> None:
    plan = plan_lane(sample(), WaitTarget(0.95, 5.0), RateChange(2.0, None))
    assert plan.utilisation == pytest.approx(1.6)
    assert math.isinf(plan.mean_wait_seconds or 0.0)
    assert plan.to_json()["mean_wait_seconds"] is None
    assert plan.slots_needed is not None
    assert plan.slots_needed > 16


def test_plan_lane_with_too_little_data_says_how_much_more() -> None:
    plan = plan_lane(sample(submitted=5, timed=3), WaitTarget(0.95, 5.0))
    assert plan.status == "insufficient_data"
    assert plan.load is None
    assert plan.utilisation is None
    assert plan.needs is not None
    assert f"{MIN_ARRIVALS - 5} more submitted" in plan.needs
    assert f"{MIN_TIMED - 3} more job(s) finished" in plan.needs
    assert "--window" in plan.needs


def test_plan_lane_without_workers_still_sizes_the_fleet() -> None:
    plan = plan_lane(sample(slots=0, workers=0), WaitTarget(0.95, 5.0))
    assert plan.status == "no_workers"
    assert plan.utilisation is None
    assert plan.slots_needed is not None
    assert plan.slots_needed >= 9
    assert plan.workers_needed is None


@pytest.mark.parametrize(
    ("load", "service", "target"),
    [
        (0.3, 1.0, WaitTarget(0.95, 0.0)),
        (8.0, 10.0, WaitTarget(0.95, 5.0)),
        (57.5, 0.2, WaitTarget(0.99, 0.05)),
        (300.0, 2.0, WaitTarget(None, 0.001)),
    ],
)
def test_slots_needed_search_equals_counting_up(
    load: float, service: float, target: WaitTarget
) -> None:
    """The exponential search and bisection give what adding one slot at a time gives."""
    counted = max(1, math.floor(load) + 1)
    while predicted_wait(counted, load, service, target) > target.seconds:
        counted += 1
    assert slots_needed(load, service, target) == counted


def test_a_what_if_beyond_any_fleet_says_so_instead_of_raising() -> None:
    plan = plan_lane(sample(), WaitTarget(0.95, 5.0), RateChange(None, 5_000_000.0))
    assert plan.slots_needed is None
    assert plan.workers_needed is None
    assert plan.needs is not None
    assert "beyond" in plan.needs
