"""The API's admission pieces without a socket: waiter slots, the throttled warning, settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from coldbrew.api.errors import ApiError
from coldbrew.api.limits import ConnectionLimits, OverloadLog, WaiterSlots
from coldbrew.api.protocol import protocol_class
from coldbrew.settings import Settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No developer's COLDBREW_* variables or `.env` leak into the settings read here."""
    for name in list(os.environ):
        if name.startswith("COLDBREW_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_waiter_slots_refuse_past_the_limit_with_503_and_retry_after() -> None:
    """Two slots: a third waiter gets 503 too_many_waiters with Retry-After; a release frees one."""
    slots = WaiterSlots(2)
    first, second = slots.take("long_poll"), slots.take("long_poll")
    with pytest.raises(ApiError) as refused:
        slots.take("long_poll")
    assert (refused.value.status, refused.value.kind) == (503, "too_many_waiters")
    assert refused.value.headers["Retry-After"].isdigit()
    assert "COLDBREW_API_MAX_WAITERS" in refused.value.message
    first.release()
    first.release()  # idempotent: a second release does not free a slot it no longer holds
    assert slots.busy == 1
    with slots.take("long_poll"):
        assert slots.busy == 2
    assert slots.busy == 1
    second.release()
    assert slots.busy == 0


def test_waiter_slot_is_given_back_when_the_wait_fails() -> None:
    """A long poll that raises (the store went away) still returns its slot."""
    slots = WaiterSlots(1)
    with pytest.raises(RuntimeError), slots.take("long_poll"):
        raise RuntimeError("store unreachable")
    assert slots.busy == 0
    slots.take("long_poll").release()


def test_a_waiter_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        WaiterSlots(0)


def test_overload_warning_is_logged_at_most_once_per_interval_with_the_count() -> None:
    """Under a flood one line per interval, carrying how many were refused since the last."""
    now = [100.0]
    overload = OverloadLog("api_connection_limit_reached", interval=10, clock=lambda: now[0])
    with capture_logs() as logs:
        for step in range(25):  # 25 refusals over 2.4 s, then two more 10 s apart
            now[0] = 100.0 + step * 0.1
            overload.refused(limit=3)
        now[0] = 110.5
        overload.refused(limit=3)
        now[0] = 121.0
        overload.refused(limit=3)
    lines = [entry for entry in logs if entry["event"] == "api_connection_limit_reached"]
    assert [(e["refused"], e["refused_total"]) for e in lines] == [(1, 1), (25, 26), (1, 27)]
    assert all(entry["log_level"] == "warning" for entry in lines)
    assert overload.total == 27


def test_connection_limits_come_from_the_settings() -> None:
    settings = Settings(
        api_header_timeout_seconds=2.5,
        api_body_timeout_seconds=7,
        api_keepalive_seconds=3,
        api_max_connections=40,
        api_max_waiters=20,
    )
    assert ConnectionLimits.from_settings(settings) == ConnectionLimits(2.5, 7, 3, 40)


def test_each_server_gets_its_own_connection_gate() -> None:
    """Two servers in one process (tests do this) do not share their admitted counts."""
    one, two = protocol_class(ConnectionLimits()), protocol_class(ConnectionLimits())
    assert one.gate is not two.gate
    assert one.gate.admit()
    assert (one.gate.admitted, two.gate.admitted) == (1, 0)


def test_the_gate_refuses_past_max_connections_and_admits_after_a_leave() -> None:
    gate = protocol_class(ConnectionLimits(max_connections=2)).gate
    assert gate.admit()
    assert gate.admit()
    assert not gate.admit()
    gate.leave()
    assert gate.admit()
    assert gate.overload.total == 1


def test_openapi_describes_the_limits_and_the_503s_retry_after() -> None:
    """/openapi.json names every limit setting; each 503 declares Retry-After, and the
    waiting routes name the waiter cap."""
    from coldbrew.api.openapi import SPEC

    description = SPEC["info"]["description"]
    for name in (
        "COLDBREW_API_HEADER_TIMEOUT_SECONDS",
        "COLDBREW_API_BODY_TIMEOUT_SECONDS",
        "COLDBREW_API_KEEPALIVE_SECONDS",
        "COLDBREW_API_MAX_CONNECTIONS",
    ):
        assert name in description
    for path, operations in SPEC["paths"].items():
        for method, operation in operations.items():
            unavailable = operation["responses"].get("503", {})
            if "schemas/Error" in str(unavailable.get("content")):  # not /readyz's probe body
                assert "Retry-After" in unavailable.get("headers", {}), (method, path)
    for path in ("/jobs/{job_id}", "/jobs/{job_id}/events"):
        text = SPEC["paths"][path]["get"]["responses"]["503"]["description"]
        assert "COLDBREW_API_MAX_WAITERS" in text
    assert "408" in SPEC["paths"]["/jobs"]["post"]["responses"]
