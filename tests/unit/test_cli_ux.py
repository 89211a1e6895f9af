"""The CLI's pure parts: durations, shortened values, progress lines, the stats rows."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coldbrew.cli.common import format_duration, parse_duration
from coldbrew.cli.tables import merge_rows, stats_lines
from coldbrew.errors import ConfigurationError
from coldbrew.model import JobRecord, Status
from coldbrew.store import FinishedStats, QueueStats
from coldbrew.watch import PlainLines, plain_line, shorten, value_text


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("1h", 3600),
        ("7d", 604800),
        ("1h30m", 5400),
        ("45", 45),
        ("2w", 1209600),
        (" 1H ", 3600),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    """`--since` reads seconds, minutes, hours, days, weeks, combined, or bare seconds."""
    assert parse_duration(text, "--since") == seconds


@pytest.mark.parametrize("text", ["", "soon", "-1h", "0s", "1y", "1h x", "nan", "inf", "9999d"])
def test_bad_durations_name_the_flag(text: str) -> None:
    """Anything else is a usage error that names the flag and shows the forms it takes."""
    with pytest.raises(ConfigurationError, match="--since must be"):
        parse_duration(text, "--since")


def test_format_duration() -> None:
    assert [format_duration(v) for v in (None, 0.42, 75, 7200, 90000)] == [
        "-",
        "0.4s",
        "1.2m",
        "2.0h",
        "1.0d",
    ]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=60,
)


@given(json_values, st.integers(min_value=10, max_value=120))
def test_value_text_is_always_json(value: Any, width: int) -> None:
    """However long the value, what is shown is JSON (values shortened, never the text)."""
    json.loads(value_text(value, width))


def test_shorten_cuts_values() -> None:
    value = {"name": "x" * 100, "items": list(range(10)), "deep": {"a": {"b": {"c": 1}}}}
    short = shorten(value, text=10, items=3, depth=2)
    assert short["name"] == "x" * 9 + "…"
    assert short["items"] == [0, 1, 2, "… 7 more"]
    assert short["deep"] == {"a": "{…}"}


def record(**fields: Any) -> JobRecord:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    values: dict[str, Any] = {
        "id": "job-1",
        "type": "thumbnail",
        "queue": "default",
        "tenant": "acme",
        "status": Status.RUNNING,
        "priority": 0,
        "attempt": 1,
        "max_attempts": 3,
        "progress": 0.25,
        "progress_message": "rendering 1/4",
        "result": None,
        "error_kind": None,
        "error_message": None,
        "dead_reason": None,
        "created_at": now,
        "started_at": now,
        "finished_at": None,
        "run_at": now + timedelta(seconds=3),
        "cancel_requested": False,
        "args": {},
    }
    values.update(fields)
    return JobRecord(**values)


def test_plain_lines_start_with_the_id_and_print_each_change_once() -> None:
    """Two jobs alike but for their id are told apart; a reading that changes nothing
    prints nothing; a retry shows when it is due, not a countdown."""
    out = io.StringIO()
    lines = PlainLines(out)
    a, b = record(id="job-a"), record(id="job-b")
    lines.update([a, b])
    lines.update([a, b])
    lines.update([record(id="job-a", progress=0.5, progress_message="rendering 2/4"), b])
    retrying = record(
        id="job-b", status=Status.RETRYING, error_kind="ConnectionError", error_message="reset"
    )
    lines.update([retrying])
    lines.update([retrying])
    printed = out.getvalue().splitlines()
    assert printed == [
        "job-a  thumbnail acme@default  attempt 1/3  running    25%  rendering 1/4",
        "job-b  thumbnail acme@default  attempt 1/3  running    25%  rendering 1/4",
        "job-a  thumbnail acme@default  attempt 1/3  running    50%  rendering 2/4",
        "job-b  thumbnail acme@default  attempt 1/3  retrying   25%  ConnectionError: reset "
        "(next attempt at 00:00:03.00Z)",
    ]


def test_succeeded_line_shows_the_result_as_json() -> None:
    done = record(
        status=Status.SUCCEEDED,
        progress=1.0,
        progress_message=None,
        result={"url": "s3://" + "x" * 300},
    )
    line = plain_line(done)
    assert "succeeded 100%  → " in line
    json.loads(line.split("→ ", 1)[1])


def test_stats_rows_include_lanes_whose_jobs_all_succeeded() -> None:
    """A lane and tenant with only succeeded jobs in the window is a row (it was missing:
    `stats` said "(no jobs)" after three jobs succeeded)."""
    waiting = [QueueStats("default", "acme", 1, 0, 0, 0, 0, 2.0)]
    finished = [
        FinishedStats("default", "acme", 1, 0, 0, 0, 0.5, 0.5, 0.1),
        FinishedStats("slow", "globex", 3, 1, 1, 0, 2.0, 3.0, 0.2),
    ]
    rows = merge_rows(waiting, finished, {}, {})
    assert [(r.waiting.queue, r.waiting.tenant) for r in rows] == [
        ("default", "acme"),
        ("slow", "globex"),
    ]
    title, header, *lines = stats_lines(rows, "1h")
    assert "finished in the last 1h" in title
    assert lines[1].split() == [
        "slow",
        "globex",
        "0",
        "0",
        "0",
        "0",
        "-",
        "-",
        "-",
        "│",
        "3",
        "1",
        "1",
        "0",
        "2.0s",
        "3.0s",
    ]
