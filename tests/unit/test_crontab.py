"""Cron schedules as values: declaration checks, the catch-up plan, DST, tick job ids."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from coldbrew import App, Context
from coldbrew.crontab import (
    COUNT_LIMIT,
    CronSpec,
    make_spec,
    manual_job_id,
    parse_config,
    parse_tick_id,
    plan,
    tick_job_id,
)
from coldbrew.errors import ConfigurationError
from coldbrew.model import JOB_ID_RE
from coldbrew.settings import load_settings

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def every_second(catch_up: str = "latest", max_catch_up: int = 10) -> CronSpec:
    return make_spec(
        name="s",
        expression="* * * * * *",
        type="job",
        catch_up=catch_up,
        max_catch_up=max_catch_up,
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# --- declaring -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"expression": "* * *"}, "must have 5 fields, or 6 with seconds last (found 3)"),
        ({"expression": "61 * * * *"}, "invalid cron expression '61 * * * *'"),
        ({"expression": "0 0 30 2 *"}, "invalid cron expression"),  # never happens
        ({"expression": ""}, "non-empty string"),
        ({"tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"tz": ""}, "IANA time zone"),
        ({"catch_up": "some"}, "catch_up must be one of latest, all, none, not 'some'"),
        ({"max_catch_up": 0}, "max_catch_up must be an integer 1..1000, not 0"),
        ({"max_catch_up": True}, "max_catch_up must be an integer"),
        ({"priority": 10}, "priority must be an integer 0..9"),
        ({"tenant": "Bad Tenant"}, "tenant 'Bad Tenant'"),
        ({"args": {"x": float("nan")}}, "args must be JSON"),
        ({"args": [1]}, "args must be an object"),
    ],
)
def test_bad_declarations_fail_naming_the_schedule(fields: dict[str, object], message: str) -> None:
    values: dict[str, object] = {"name": "nightly", "expression": "0 3 * * *", "type": "job"}
    values.update(fields)
    with pytest.raises(ConfigurationError) as caught:
        make_spec(**values)  # type: ignore[arg-type]
    assert "cron schedule 'nightly'" in str(caught.value)
    assert message in str(caught.value)


def test_a_name_too_long_for_a_job_id_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="needs name="):
        make_spec(name="x" * 65, expression="* * * * *", type="job")


def test_six_fields_read_seconds_last() -> None:
    spec = make_spec(name="s", expression="* * * * * */5", type="job")
    assert list(_take(spec.ticks_after(at(3)), 3)) == [at(5), at(10), at(15)]


def test_app_cron_sits_above_the_job_and_checks_at_decoration() -> None:
    app = App()

    @app.cron("*/5 * * * *", tz="Europe/Paris", args={"n": 1})
    @app.job()
    async def report(ctx: Context, n: int) -> None: ...

    assert app.schedules["report"].expression == "*/5 * * * *"
    assert app.schedules["report"].tz == "Europe/Paris"
    assert app.jobs["report"].func is report  # the job stays a normal job

    with pytest.raises(ConfigurationError, match="declared twice"):
        app.cron("0 * * * *")(report)
    app.cron("0 * * * *", name="hourly", args={"n": 2})(report)  # named: fine
    with pytest.raises(ConfigurationError, match="args do not fit"):
        app.cron("0 * * * *", name="bad-args", args={"n": "many"})(report)
    with pytest.raises(ConfigurationError, match="cron schedule 'tz'.*unknown time zone"):
        app.cron("0 * * * *", name="tz", tz="Nowhere/City", args={"n": 1})(report)


def test_app_cron_below_the_job_is_refused() -> None:
    app = App()

    async def loose(ctx: Context) -> None: ...

    with pytest.raises(ConfigurationError, match=r"must sit above the function's @app.job"):
        app.cron("* * * * *")(loose)


def test_config_schedules_parse_and_fail_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    specs = parse_config(
        '[{"type": "report", "expression": "0 6 * * *", "tz": "Europe/Paris"},'
        ' {"type": "report", "name": "evening", "expression": "0 18 * * *", "catch_up": "all"}]'
    )
    assert [(s.name, s.catch_up) for s in specs] == [("report", "latest"), ("evening", "all")]
    assert parse_config("") == []
    for text, message in [
        ("{", "is not JSON"),
        ('{"type": "x"}', "must be a JSON list"),
        ('[{"expression": "* * * * *"}]', 'needs a job "type"'),
        ('[{"type": "x"}]', 'needs an "expression"'),
        ('[{"type": "x", "expression": "* * * * *", "when": 1}]', "unknown keys ['when']"),
        ('[{"type": "x", "expression": "* *"}]', "cron schedule 'x'"),
        (
            '[{"type": "x", "expression": "* * * * *"}, {"type": "x", "expression": "0 * * * *"}]',
            "declared twice",
        ),
    ]:
        monkeypatch.setenv("COLDBREW_CRON", text)
        with pytest.raises(ConfigurationError, match="COLDBREW_CRON") as caught:
            load_settings()
        assert message in str(caught.value)


# --- the plan ------------------------------------------------------------------------------


def test_nothing_due_is_no_plan() -> None:
    assert plan(every_second(), at(5), at(5.5), grace=2) is None


def test_on_time_ticks_fire() -> None:
    decided = plan(every_second("none"), at(5), at(7.01), grace=2)
    assert decided is not None
    assert decided.fire == ((at(6), "fired"), (at(7), "fired"))
    assert (decided.skipped, decided.missed, decided.watermark) == (0, 0, at(7))


def test_latest_runs_the_most_recent_missed_tick_once() -> None:
    # down from 5 s to 60.5 s, no tick within the grace: one caught up, the rest skipped
    decided = plan(every_second("latest"), at(5), at(60.5), grace=0.4)
    assert decided is not None
    assert decided.fire == ((at(60), "caught_up"),)
    assert (decided.missed, decided.skipped, decided.caught_up) == (55, 54, 1)
    # a tick within the grace is the most recent: it runs on time, the missed are skipped
    decided = plan(every_second("latest"), at(5), at(60.2), grace=0.4)
    assert decided is not None
    assert decided.fire == ((at(60), "fired"),)
    assert (decided.missed, decided.skipped) == (54, 54)


def test_all_runs_up_to_max_catch_up_latest_missed_ticks() -> None:
    decided = plan(every_second("all", max_catch_up=3), at(5), at(60.5), grace=0.4)
    assert decided is not None
    assert decided.fire == tuple((at(s), "caught_up") for s in (58, 59, 60))
    assert (decided.missed, decided.skipped) == (55, 52)
    few = plan(every_second("all", max_catch_up=30), at(5), at(8.5), grace=0.4)
    assert few is not None
    assert few.fire == tuple((at(s), "caught_up") for s in (6, 7, 8))
    assert few.skipped == 0


def test_none_skips_every_missed_tick() -> None:
    decided = plan(every_second("none"), at(5), at(60.5), grace=0.4)
    assert decided is not None
    assert decided.fire == ()
    assert (decided.skipped, decided.watermark) == (55, at(60))


def test_a_week_long_outage_is_counted_up_to_a_limit() -> None:
    decided = plan(every_second("latest"), at(0), at(7 * 86_400 + 0.5), grace=0.4)
    assert decided is not None
    assert decided.skipped_more
    assert decided.missed == COUNT_LIMIT
    assert decided.fire == ((at(7 * 86_400), "caught_up"),)


def test_an_edit_never_reruns_a_decided_tick() -> None:
    """A new expression is planned from the same watermark: nothing at or before it fires."""
    before = make_spec(name="s", expression="* * * * * */2", type="job", catch_up="all")
    after = make_spec(name="s", expression="* * * * * */3", type="job", catch_up="all")
    first = plan(before, at(0), at(6.1), grace=1)
    assert first is not None
    again = plan(after, first.watermark, at(6.5), grace=1)
    assert again is None  # 6 s is a tick of both, already decided
    later = plan(after, first.watermark, at(9.1), grace=1)
    assert later is not None
    assert all(tick > first.watermark for tick, _ in later.fire)


# --- daylight saving time ------------------------------------------------------------------


def test_fall_back_fires_a_fixed_hour_once_and_a_wildcard_hour_at_both() -> None:
    # Paris 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens twice
    start = datetime(2026, 10, 24, 22, 0, tzinfo=UTC)  # 00:00 CEST
    daily = make_spec(name="d", expression="30 2 * * *", tz="Europe/Paris", type="job")
    ticks = list(_take(daily.ticks_after(start), 2))
    assert ticks[0] == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST, once
    assert ticks[1] == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)  # next day, 02:30 CET
    half_hourly = make_spec(name="h", expression="*/30 * * * *", tz="Europe/Paris", type="job")
    real = list(_take(half_hourly.ticks_after(datetime(2026, 10, 24, 23, 50, tzinfo=UTC)), 5))
    assert [t.strftime("%H:%M") for t in real] == ["00:00", "00:30", "01:00", "01:30", "02:00"]


def test_spring_forward_fires_a_missing_time_after_the_gap() -> None:
    # Paris 2026-03-29: 02:00 CET becomes 03:00 CEST; 02:30 does not exist
    daily = make_spec(name="d", expression="30 2 * * *", tz="Europe/Paris", type="job")
    first = daily.next_tick(datetime(2026, 3, 28, 23, 0, tzinfo=UTC))
    assert first == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 03:00 CEST, once that day
    assert daily.next_tick(first) == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)


# --- job ids -------------------------------------------------------------------------------


def test_tick_ids_are_derived_and_read_back() -> None:
    tick = datetime(2026, 12, 1, 20, 0, 5, tzinfo=UTC)
    job_id = tick_job_id("a:b", tick)
    assert job_id == "cron:a:b:2026-12-01T20:00:05Z"
    assert parse_tick_id(job_id) == ("a:b", tick)
    assert parse_tick_id(manual_job_id("a")) is None
    assert parse_tick_id("c7f0e1aa-0000") is None
    longest = "x" * 64
    assert JOB_ID_RE.fullmatch(tick_job_id(longest, tick))
    assert JOB_ID_RE.fullmatch(manual_job_id(longest))
    assert manual_job_id("a") != manual_job_id("a")


def _take(iterator: object, count: int) -> list[datetime]:
    it = iter(iterator)  # type: ignore[call-overload]
    return [next(it) for _ in range(count)]


def test_config_schedules_may_come_from_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``COLDBREW_CRON_FILE``, like every setting's ``_FILE`` variant."""
    path = tmp_path / "cron.json"
    path.write_text('[{"type": "cleanup", "expression": "*/15 * * * *"}]\n', encoding="utf-8")
    monkeypatch.delenv("COLDBREW_CRON", raising=False)
    monkeypatch.setenv("COLDBREW_CRON_FILE", str(path))
    (spec,) = load_settings().cron_schedules
    assert (spec.name, spec.type, spec.expression) == ("cleanup", "cleanup", "*/15 * * * *")
