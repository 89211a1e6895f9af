"""Several broker URLs and libpq's multi-host form (issue #14): parsing, masking, bad values."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coldbrew.errors import ConfigurationError
from coldbrew.settings import load_settings, mask_url, split_urls
from coldbrew.transport.connection import start_index

ROOT = Path(__file__).resolve().parents[2]


def test_a_list_splits_on_commas_that_start_a_url() -> None:
    """Commas inside a URL (an unencoded one in a password) do not split it; blanks drop."""
    text = " amqp://a:p,w@h1:5672/ , amqps://b:q@h2:5671/vh?heartbeat=5,"
    assert split_urls(text) == ["amqp://a:p,w@h1:5672/", "amqps://b:q@h2:5671/vh?heartbeat=5"]
    assert split_urls("amqp://h/") == ["amqp://h/"]


def test_a_list_is_masked_url_by_url() -> None:
    """Every password of the list is masked, the hosts stay readable."""
    masked = mask_url("amqp://a:secret1@h1/,amqps://b:secret2@h2:5671/")
    assert masked == "amqp://a:***@h1/,amqps://b:***@h2:5671/"


def test_a_multi_host_database_url_is_one_url_masked_once() -> None:
    """libpq's ``h1:port,h2:port`` is one URL: its password and ``?password=`` are masked."""
    url = "postgresql://u:s3cret@db1:5432,db2:5433/app?target_session_attrs=read-write"
    assert mask_url(url) == (
        "postgresql://u:***@db1:5432,db2:5433/app?target_session_attrs=read-write"
    )
    assert "pw" not in mask_url("postgresql://db1,db2/app?password=pw")


def test_primary_is_as_good_as_read_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several hosts with ``primary`` (or libpq's PGTARGETSESSIONATTRS) are accepted."""
    monkeypatch.setenv(
        "COLDBREW_DATABASE_URL", "postgresql://db1,db2/app?target_session_attrs=primary"
    )
    load_settings()
    monkeypatch.setenv("COLDBREW_DATABASE_URL", "postgresql://db1,db2/app")
    monkeypatch.setenv("PGTARGETSESSIONATTRS", "read-write")
    load_settings()


def test_settings_accept_lists_and_multi_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLDBREW_AMQP_URL", "amqp://h1/,amqp://h2:5673/,amqps://h3/")
    monkeypatch.setenv(
        "COLDBREW_DATABASE_URL",
        "postgresql://db1:5432,db2,[::1]:5433/app?target_session_attrs=read-write",
    )
    settings = load_settings()
    assert settings.amqp_urls == ["amqp://h1/", "amqp://h2:5673/", "amqps://h3/"]


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("COLDBREW_AMQP_URL", "amqp://h1/,http://h2/", "URL 2 must start with amqp://"),
        ("COLDBREW_AMQP_URL", "amqp://h1/,amqp://h2:99999/", "URL 2 is not a valid URL"),
        ("COLDBREW_AMQP_URL", " , ", "at least one"),
        ("COLDBREW_AMQP_URL", "amqp:///", "names no host"),
        (
            "COLDBREW_DATABASE_URL",
            "postgresql://db1:x,db2/app?target_session_attrs=read-write",
            "host 1 has an invalid port",
        ),
        ("COLDBREW_DATABASE_URL", "postgresql://db1,,db2/app", "host 2 of the host list"),
        ("COLDBREW_DATABASE_URL", "postgresql://db1,db2/app", "target_session_attrs=read-write"),
        (
            "COLDBREW_DATABASE_URL",
            "postgresql://db1,db2/app?target_session_attrs=any",
            "target_session_attrs=read-write",
        ),
        (
            "COLDBREW_DATABASE_URL",
            "postgresql://db1,db2/app?target_session_attrs=primary-ish",
            "target_session_attrs must be one of",
        ),
    ],
)
def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert variable in str(caught.value)
    assert expected in str(caught.value)


def test_a_bad_list_exits_2_with_passwords_masked() -> None:
    """The CLI: exit 2, one line naming the variable, no password echoed."""
    env = {
        **os.environ,
        "COLDBREW_AMQP_URL": "amqp://u:hunter2hunter2@h1/,ftp://u:hunter2hunter2@h2/",
    }
    done = subprocess.run(
        [sys.executable, "-m", "coldbrew", "stats"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "COLDBREW_AMQP_URL" in done.stderr
    assert "hunter2" not in done.stderr


def test_start_index_spreads_and_is_stable() -> None:
    """A fleet's keys spread over the URLs; one key always starts at the same URL."""
    starts = [start_index(f"worker-{n}", 3) for n in range(300)]
    assert {starts.count(i) for i in range(3)} and min(starts.count(i) for i in range(3)) > 60
    assert start_index("worker-7", 3) == start_index("worker-7", 3)
    assert start_index("anything", 1) == 0
