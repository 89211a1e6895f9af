"""Tests for coldbrew.logs: rendering, level filtering, redaction and the stdlib bridge."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from coldbrew import logs

_LIBRARIES = ("aio_pika", "aiormq", "asyncpg", "pamqp")


@pytest.fixture(autouse=True)
def _isolated_logging() -> Iterator[None]:
    """Give each test pristine structlog and root-logger state, and put it back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    library_levels = {name: logging.getLogger(name).level for name in _LIBRARIES}
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, saved in library_levels.items():
        logging.getLogger(name).setLevel(saved)


def json_lines(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines() if line.strip()]


def test_json_is_one_object_per_line_with_context(capsys: pytest.CaptureFixture[str]) -> None:
    """Each event is one JSON line with event, level, ISO UTC timestamp, logger and contextvars."""
    logs.configure("json", "info")
    structlog.contextvars.bind_contextvars(job_id="j-1", tenant="acme")
    log = structlog.get_logger("coldbrew.test")

    log.info("job_claimed", attempt=2)
    log.warning("lease_lost")

    captured = capsys.readouterr()
    assert captured.out == ""
    first, second = json_lines(captured.err)
    assert first["event"] == "job_claimed"
    assert first["level"] == "info"
    assert first["attempt"] == 2
    assert first["job_id"] == "j-1"
    assert first["tenant"] == "acme"
    assert first["logger"] == "coldbrew.test"
    assert first["timestamp"].endswith("Z")
    assert "T" in first["timestamp"]
    assert (second["event"], second["level"]) == ("lease_lost", "warning")


def test_debug_is_dropped_at_info(capsys: pytest.CaptureFixture[str]) -> None:
    """At info level a debug event is dropped before any processor runs, so it costs nothing."""
    logs.configure("json", "info")
    seen: list[str] = []

    def spy(_logger: object, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        seen.append(event_dict["event"])
        return event_dict

    structlog.get_config()["processors"].insert(0, spy)
    log = structlog.get_logger()

    log.debug("job_progress", progress=0.5)
    log.info("kept")

    assert seen == ["kept"]
    assert [e["event"] for e in json_lines(capsys.readouterr().err)] == ["kept"]


def test_debug_level_emits_debug(capsys: pytest.CaptureFixture[str]) -> None:
    """At debug level debug events are written."""
    logs.configure("json", "debug")
    structlog.get_logger().debug("job_progress")
    assert json_lines(capsys.readouterr().err)[0]["level"] == "debug"


def test_passwords_in_urls_are_masked(capsys: pytest.CaptureFixture[str]) -> None:
    """URL passwords are masked in values, nested values and exception text alike."""
    logs.configure("json", "info")
    log = structlog.get_logger()

    log.info(
        "connecting",
        url="amqp://guest:secret@rabbit:5672/",
        targets=["postgresql://u:p4ss@db/coldbrew"],
        pair=os.terminal_size((80, 24)),  # a tuple subclass is left as it is
    )
    try:
        raise ConnectionError("cannot reach amqp://guest:secret@rabbit/")
    except ConnectionError:
        log.exception("connect_failed")

    err = capsys.readouterr().err
    assert "secret" not in err
    assert "p4ss" not in err
    first, second = json_lines(err)
    assert first["url"] == "amqp://guest:***@rabbit:5672/"
    assert first["targets"] == ["postgresql://u:***@db/coldbrew"]
    assert "amqp://guest:***@rabbit/" in second["exception"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("amqp://guest:secret@host/", "amqp://guest:***@host/"),
        ("postgresql://u:p@h/db", "postgresql://u:***@h/db"),
        ("postgresql://:p@h/db", "postgresql://:***@h/db"),
        ("amqps://u:p@ss@h:5671/vh", "amqps://u:***@h:5671/vh"),
        ("a amqp://x:y@h b postgresql://c:d@e", "a amqp://x:***@h b postgresql://c:***@e"),
        ("amqp://guest@host/", "amqp://guest@host/"),
        ("http://host:8080/path?to=a@b", "http://host:8080/path?to=a@b"),
        ("no url here", "no url here"),
    ],
)
def test_mask_urls(text: str, expected: str) -> None:
    """Only the password part of a URL is masked; URLs without one are left alone."""
    assert logs.mask_urls(text) == expected


def test_stdlib_records_use_the_same_renderer(capsys: pytest.CaptureFixture[str]) -> None:
    """A library's logging record comes out as the same JSON, masked, with its logger name."""
    logs.configure("json", "info")
    structlog.contextvars.bind_contextvars(job_id="j-2")

    logging.getLogger("aiormq").warning("connection to %s lost", "amqp://g:s3cret@h/")
    logging.getLogger("aiormq.connection").info("chatter")  # below WARNING for libraries

    (record,) = json_lines(capsys.readouterr().err)
    assert record["event"] == "connection to amqp://g:***@h/ lost"
    assert record["level"] == "warning"
    assert record["logger"] == "aiormq"
    assert record["job_id"] == "j-2"
    assert "timestamp" in record


def test_libraries_are_verbose_at_debug(capsys: pytest.CaptureFixture[str]) -> None:
    """At debug level the libraries' own debug records get through."""
    logs.configure("json", "debug")
    logging.getLogger("asyncpg").debug("pool_acquired")
    assert json_lines(capsys.readouterr().err)[0]["event"] == "pool_acquired"


def test_configure_is_idempotent(capsys: pytest.CaptureFixture[str]) -> None:
    """Configuring twice leaves one handler, so each record is written once."""
    logs.configure("json", "info")
    logs.configure("json", "info")

    ours = [h for h in logging.getLogger().handlers if isinstance(h, logs._StderrHandler)]
    assert len(ours) == 1
    logging.getLogger("coldbrew.lib").warning("once")
    structlog.get_logger().warning("once")
    assert [e["event"] for e in json_lines(capsys.readouterr().err)] == ["once", "once"]


def test_reconfigure_reaches_cached_loggers(capsys: pytest.CaptureFixture[str]) -> None:
    """A logger cached under one format follows a later configure() to another format."""
    logs.configure("json", "info")
    log = structlog.get_logger()
    log.info("as_json")
    logs.configure("console", "info")
    log.info("as_console", url="amqp://u:pw@h/")

    first, second = capsys.readouterr().err.splitlines()
    assert json.loads(first)["event"] == "as_json"
    assert "as_console" in second
    assert "amqp://u:***@h/" in second
    assert not second.startswith("{")


def test_auto_is_json_when_stderr_is_not_a_tty(capsys: pytest.CaptureFixture[str]) -> None:
    """With stderr captured (not a TTY), auto picks JSON."""
    logs.configure("auto", "info")
    structlog.get_logger().info("hello")
    assert json_lines(capsys.readouterr().err)[0]["event"] == "hello"


def test_console_renders_exceptions_masked(capsys: pytest.CaptureFixture[str]) -> None:
    """The console renderer prints the traceback, with URL passwords masked."""
    logs.configure("console", "warning")
    log = structlog.get_logger()
    log.info("dropped")
    try:
        raise ValueError("bad postgresql://u:topsecret@db/x")
    except ValueError:
        log.exception("failed")

    err = capsys.readouterr().err
    assert "dropped" not in err
    assert "failed" in err
    assert "Traceback" in err
    assert "topsecret" not in err
    assert "postgresql://u:***@db/x" in err
