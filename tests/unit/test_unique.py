"""Unique options (unique.py), durations (durations.py) and their checks at decoration."""

from __future__ import annotations

import math

import pytest

from coldbrew import App, Context
from coldbrew.durations import parse_duration
from coldbrew.errors import ConfigurationError
from coldbrew.model import Status
from coldbrew.unique import (
    DEFAULT_BY,
    DEFAULT_STATES,
    KNOWN_STATES,
    UniqueError,
    UniqueOpts,
    merged,
    unique_opts,
)


def test_known_states_are_the_job_statuses() -> None:
    assert tuple(s.value for s in Status) == KNOWN_STATES
    assert set(DEFAULT_STATES) == {"queued", "running", "retrying", "succeeded", "scheduled"}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("1.5", 1.5),
        ("90s", 90.0),
        ("15m", 900.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("7d", 604800.0),
        ("250ms", 0.25),
        (" 2H ", 7200.0),
        ("0", 0.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "h", "1x", "-5", "1h 30m", "nan", "inf", "1hh"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration|must be a finite number"):
        parse_duration(text)


def test_options_and_defaults() -> None:
    opts = unique_opts(3600)
    assert opts == UniqueOpts(period=3600.0, by=DEFAULT_BY, states=DEFAULT_STATES, keys=None)
    assert unique_opts("1h") == opts
    assert unique_opts("infinity") == UniqueOpts(period=None)
    assert unique_opts(math.inf) == UniqueOpts(period=None)
    assert unique_opts(None) is None
    narrow = unique_opts(5, "args, queue", ["queued"], ("domain",))
    assert narrow == UniqueOpts(5.0, ("args", "queue"), ("queued",), ("domain",))


@pytest.mark.parametrize(
    ("kwargs", "mentions"),
    [
        ({"unique_for": -1}, "positive"),
        ({"unique_for": 0}, "positive"),
        ({"unique_for": "soon"}, "not a duration"),
        ({"unique_for": True}, "not bool"),
        ({"unique_for": [60]}, "not list"),
        ({"unique_for": math.nan}, "positive"),
        ({"unique_for": 1e12}, "infinity"),
        ({"unique_for": 60, "unique_by": ("args", "colour")}, "unknown 'colour'"),
        ({"unique_for": 60, "unique_by": ()}, "at least one"),
        ({"unique_for": 60, "unique_by": 7}, "list of names"),
        ({"unique_for": 60, "unique_states": ("finished",)}, "unknown 'finished'"),
        ({"unique_for": 60, "unique_keys": ("",)}, "non-empty"),
        ({"unique_for": 60, "unique_by": ("tenant",), "unique_keys": ("a",)}, "include"),
        ({"unique_for": None, "unique_by": ("args",)}, "needs unique_for"),
        ({"unique_for": None, "unique_keys": ("a",)}, "needs unique_for"),
    ],
)
def test_bad_options_are_named(kwargs: dict[str, object], mentions: str) -> None:
    with pytest.raises(UniqueError, match=mentions):
        unique_opts(**kwargs)  # type: ignore[arg-type]


def test_decoration_refuses_bad_options() -> None:
    app = App()

    async def job(ctx: Context, a: int) -> None: ...

    with pytest.raises(ConfigurationError, match="job 'job': unique_for must be positive"):
        app.job(unique_for=-3)(job)
    with pytest.raises(ConfigurationError, match="unique_states: unknown 'done'"):
        app.job(unique_for=3, unique_states=("done",))(job)
    app.job(unique_for=3, unique_by=("args", "queue"))(job)
    assert app.get("job").unique == UniqueOpts(3.0, ("args", "queue"))


def test_key_is_canonical_and_covers_the_chosen_parts() -> None:
    opts = UniqueOpts(period=60)
    key = opts.key("t", {"a": 1, "b": [1, 2]}, "acme", "default")
    assert key == opts.key("t", {"b": [1, 2], "a": 1}, "acme", "slow")  # order; queue not a part
    assert key != opts.key("t", {"a": 1, "b": [2, 1]}, "acme", "default")
    assert key != opts.key("t", {"a": 1, "b": [1, 2]}, "globex", "default")
    assert key != opts.key("u", {"a": 1, "b": [1, 2]}, "acme", "default")
    by_args = UniqueOpts(period=60, by=("args",))
    assert by_args.key("t", {"a": 1}, "acme", "q") == by_args.key("t", {"a": 1}, "globex", "r")
    by_queue = UniqueOpts(period=60, by=("queue",))
    assert by_queue.key("t", {"a": 1}, "x", "q") == by_queue.key("t", {"a": 2}, "y", "q")
    assert by_queue.key("t", {}, "x", "q") != by_queue.key("t", {}, "x", "r")
    some = UniqueOpts(period=60, keys=("domain",))
    assert some.key("t", {"domain": "a", "page": 1}, "x", "q") == some.key(
        "t", {"domain": "a", "page": 2}, "x", "q"
    )


def test_a_submission_overrides_its_types_options() -> None:
    base = UniqueOpts(period=60, by=("args",), states=("queued",))
    assert merged(base, None, None, None, None) is base
    assert merged(None, None, None, None, None) is None
    assert merged(base, 5, None, None, None) == UniqueOpts(5.0, ("args",), ("queued",))
    assert merged(base, None, "args,tenant", None, None) == UniqueOpts(
        60.0, ("args", "tenant"), ("queued",)
    )
    assert merged(None, "2m", None, None, None) == UniqueOpts(120.0)
    with pytest.raises(UniqueError, match="needs unique_for"):
        merged(None, None, "args", None, None)


def test_a_submission_keeps_its_types_keys_unless_it_changes_the_parts() -> None:
    base = UniqueOpts(period=60, keys=("domain",))
    assert merged(base, None, "args, tenant", None, None) == base
    assert merged(base, None, ("args",), None, None) == UniqueOpts(60.0, ("args",))
