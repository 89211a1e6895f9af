"""Retention settings: durations, "off", defaults, and clear errors; the prune pass's plan."""

from __future__ import annotations

import pytest

from coldbrew.errors import ConfigurationError
from coldbrew.settings import load_settings, parse_retention
from coldbrew.worker.prune import PassResult, Retention


def test_defaults_follow_river_and_keep_dead_jobs_a_month() -> None:
    """Succeeded 1 d, failed and cancelled 7 d, dead 30 d (rejected messages with them)."""
    retention = Retention.of(load_settings())
    assert retention.jobs == {
        "succeeded": 86400.0,
        "failed": 7 * 86400.0,
        "dead": 30 * 86400.0,
        "cancelled": 7 * 86400.0,
    }
    assert retention.rejected == 30 * 86400.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 604800.0), ("12h", 43200.0), ("90", 90.0), ("1h30m", 5400.0), (" 2w ", 1209600.0)],
)
def test_durations_are_read_as_seconds(text: str, seconds: float) -> None:
    """Durations as people write them, or plain seconds."""
    assert parse_retention(text) == seconds


@pytest.mark.parametrize("text", ["off", "OFF", "never", "forever", "none"])
def test_off_keeps_a_status_forever(text: str) -> None:
    """'off' (or never/forever/none) leaves the status out of every prune."""
    settings = load_settings(retention_failed=text)
    assert settings.retention_failed is None
    assert "failed" not in Retention.of(settings).jobs


def test_dead_off_keeps_rejected_messages_too() -> None:
    """Rejected messages follow the dead jobs' retention."""
    assert Retention.of(load_settings(retention_dead="off")).rejected is None


@pytest.mark.parametrize("text", ["a week", "-1d", "7 days", "1y", ""])
def test_a_bad_duration_names_the_variable(text: str) -> None:
    """A value that is not a duration fails at start-up, naming the variable and the way out."""
    with pytest.raises(ConfigurationError) as caught:
        load_settings(retention_cancelled=text)
    message = str(caught.value)
    assert "COLDBREW_RETENTION_CANCELLED" in message
    assert "'off'" in message


def test_a_bad_duration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment variable is read and refused the same way."""
    monkeypatch.setenv("COLDBREW_RETENTION_SUCCEEDED", "soon")
    with pytest.raises(ConfigurationError, match="COLDBREW_RETENTION_SUCCEEDED"):
        load_settings()


def test_pass_result_sums_by_table_and_status() -> None:
    """Counts add up per (table, status); the total is over every table."""
    result = PassResult()
    result.add("jobs", "succeeded", 3)
    result.add("jobs", "succeeded", 4)
    result.add("rate_buckets", "any", 2)
    assert result.counts == {("jobs", "succeeded"): 7, ("rate_buckets", "any"): 2}
    assert result.total == 9
