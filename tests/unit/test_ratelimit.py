"""Rate limits, the pure part: the rate parser, the GCRA arithmetic, rate keys, @app.job."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coldbrew import App, Context
from coldbrew.errors import ConfigurationError, ContractViolation
from coldbrew.ratelimit import (
    Rate,
    default_burst,
    format_rate,
    gcra,
    gcra_all,
    parse_rate,
    rate_key_value,
)
from coldbrew.rates.claim import spare_tokens


@pytest.mark.parametrize(
    ("text", "per_second"),
    [
        ("10/s", 10.0),
        ("600/min", 10.0),
        ("2.5/h", 2.5 / 3600),
        ("0.5/s", 0.5),
        (" 3 / sec ", 3.0),
        ("90/minute", 1.5),
        ("1/hour", 1 / 3600),
        ("50/S", 50.0),
    ],
)
def test_rates_parse(text: str, per_second: float) -> None:
    assert parse_rate(text).per_second == pytest.approx(per_second)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "10",
        "10/",
        "/s",
        "10/d",
        "10/m",
        "-1/s",
        "0/s",
        "1e3/s",
        "ten/s",
        "1/s/s",
        "200000/s",
        "nan/s",
        "inf/s",
    ],
)
def test_bad_rates_are_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(ConfigurationError, match="--rate"):
        parse_rate(text, what="--rate")


@pytest.mark.parametrize("burst", [0, -1, 100_001, True, 2.5])
def test_bad_bursts_are_refused(burst: object) -> None:
    with pytest.raises(ConfigurationError, match="burst"):
        parse_rate("1/s", burst)  # type: ignore[arg-type]


def test_default_burst_is_a_tenth_of_a_second_at_least_one() -> None:
    assert [default_burst(r) for r in (0.001, 1, 10, 10.5, 50, 600)] == [1, 1, 1, 2, 5, 60]
    assert parse_rate("50/s").burst == 5
    assert parse_rate("50/s", 12).burst == 12


def test_rates_are_shown_in_the_unit_that_reads_best() -> None:
    assert [format_rate(r) for r in (50, 0.5, 1 / 3600, 1.5)] == ["50/s", "30/min", "1/h", "1.5/s"]
    assert str(Rate(10, 2)) == "10/s burst 2"


def test_gcra_grants_a_burst_then_one_token_per_interval() -> None:
    rate = Rate(10, 3)  # T = 0.1 s, tau = 0.2 s
    backlog, answers = 0.0, []
    for _ in range(4):  # four at the same instant: three granted
        grant = gcra(backlog, rate)
        answers.append(grant.allowed)
        if grant.allowed:
            backlog = grant.backlog
    assert answers == [True, True, True, False]
    assert backlog == pytest.approx(0.3)
    refused = gcra(backlog, rate)
    assert refused.wait == pytest.approx(0.1)  # the next token is due in one interval
    assert gcra(backlog - 0.1, rate).allowed  # 0.1 s later it is there


def test_gcra_all_is_all_or_nothing_and_waits_for_the_last_bucket() -> None:
    rates = [Rate(10, 1), Rate(1, 1)]
    grants, worst = gcra_all([0.0, 0.0], rates)
    assert worst is None and [g.backlog for g in grants] == pytest.approx([0.1, 1.0])
    grants, worst = gcra_all([0.05, 0.4], rates)
    assert worst == 1 and grants[worst].wait == pytest.approx(0.4)


arrivals = st.lists(st.floats(min_value=0, max_value=0.5), min_size=1, max_size=200)


@settings(max_examples=200, deadline=None)
@given(
    gaps=arrivals,
    per_second=st.floats(min_value=0.5, max_value=500),
    burst=st.integers(min_value=1, max_value=20),
    window=st.floats(min_value=0.01, max_value=5),
)
def test_gcra_never_starts_more_than_burst_plus_rate_in_any_window(
    gaps: list[float], per_second: float, burst: int, window: float
) -> None:
    """However requests arrive, any window of ``w`` seconds holds at most
    ``burst + w * rate`` starts (GCRA's bound: floor((w + tau) / T) + 1)."""
    rate = Rate(per_second, burst)
    now, tat, starts = 0.0, 0.0, []
    for gap in gaps:
        now += gap
        grant = gcra(tat - now, rate)
        if grant.allowed:
            tat = now + grant.backlog
            starts.append(now)
    tau = rate.interval * (burst - 1)
    bound = math.floor((window + tau) / rate.interval + 1e-6) + 1
    for i, start in enumerate(starts):
        inside = sum(1 for s in starts[i:] if s < start + window)
        assert inside <= bound


@settings(max_examples=100, deadline=None)
@given(per_second=st.floats(min_value=0.5, max_value=500), burst=st.integers(1, 20))
def test_a_refused_start_that_waits_as_told_is_granted_and_the_rate_is_kept(
    per_second: float, burst: int
) -> None:
    """A backlog retried exactly when told starts every time, at the steady rate."""
    rate = Rate(per_second, burst)
    now, tat, starts = 0.0, 0.0, 0
    while starts < 100:
        grant = gcra(tat - now, rate)
        if grant.allowed:
            tat, starts = now + grant.backlog, starts + 1
        else:
            now += grant.wait
            assert gcra(tat - now, rate).allowed
    # 100 starts took (100 - burst) intervals: the steady rate after the burst
    assert now == pytest.approx((100 - burst) * rate.interval, rel=1e-6, abs=1e-9)


def test_rate_keys_come_from_an_argument_or_a_function() -> None:
    assert rate_key_value("fetch", "domain", {"domain": "a.example"}) == "fetch:a.example"
    assert rate_key_value("fetch", "n", {"n": 3}) == "fetch:3"
    assert rate_key_value("fetch", lambda a: a["u"][:1], {"u": "xy"}) == "fetch:x"
    assert rate_key_value("fetch", None, {}) == "fetch"


@pytest.mark.parametrize(
    ("key", "args"),
    [
        ("domain", {}),
        ("domain", {"domain": None}),
        ("domain", {"domain": ["a"]}),
        ("domain", {"domain": True}),
        ("domain", {"domain": "x" * 201}),
        (lambda a: a["missing"], {}),
    ],
)
def test_a_rate_key_that_cannot_be_read_is_a_contract_violation(key: object, args: dict) -> None:
    with pytest.raises(ContractViolation) as caught:
        rate_key_value("fetch", key, args)  # type: ignore[arg-type]
    assert caught.value.reason == "rate_key"


def test_app_job_takes_a_rate_limit_and_refuses_bad_ones_when_declared() -> None:
    app = App()

    @app.job(rate_limit="50/s", rate_burst=10, rate_key="domain")
    async def fetch(ctx: Context, domain: str) -> None: ...

    spec = app.get("fetch")
    assert spec.rate_limit == Rate(50, 10) and spec.rate_key == "domain"

    async def job(ctx: Context, domain: str) -> None: ...

    for kwargs, match in [
        ({"rate_limit": "fast"}, "rate_limit must look like"),
        ({"rate_limit": "0/s"}, "above 0"),
        ({"rate_limit": "5/s", "rate_burst": 0}, "burst"),
        ({"rate_key": "domain"}, "need a rate_limit"),
        ({"rate_limit": "5/s", "rate_key": "host"}, "not one of its arguments"),
        ({"rate_limit": "5/s", "rate_key": 3}, "argument name or a function"),
    ]:
        with pytest.raises(ConfigurationError, match=match):
            App().job(name="j", **kwargs)(job)  # type: ignore[arg-type]


def test_spare_tokens_counts_what_gcra_would_still_grant() -> None:
    rate = Rate(10, 3)  # T = 0.1 s, tau = 0.2 s
    assert spare_tokens(0.1, rate) == 2  # a first take from a full bucket
    assert spare_tokens(0.0999, rate) == 2
    assert spare_tokens(0.2, rate) == 1
    assert spare_tokens(0.1995, rate) == 1
    assert spare_tokens(0.2005, rate) == 0
    assert spare_tokens(0.3, rate) == 0
    assert spare_tokens(0.0, Rate(1, 1)) == 1
    assert spare_tokens(1.0, Rate(1, 1)) == 0
    for backlog in (0.0, 0.05, 0.1, 0.15, 0.2, 0.25):  # k spare: k more takes conform
        k = spare_tokens(backlog, rate)
        left = backlog
        for _ in range(k):
            grant = gcra(left, rate)
            assert grant.allowed
            left = grant.backlog
        assert not gcra(left, rate).allowed
