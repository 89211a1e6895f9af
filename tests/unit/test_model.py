"""The message contract (``parse_envelope``), the status JSON and the status enum."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import pytest

from coldbrew.errors import ContractViolation
from coldbrew.model import (
    Envelope,
    JobRecord,
    Status,
    job_id_for_key,
    parse_envelope,
    routing_key,
)

LIMIT = 4096
GOOD_BODY = json.dumps({"type": "thumbnail", "args": {"video_id": "v1"}}).encode()
STATUS_JSON_KEYS = {
    "id", "type", "queue", "tenant", "status", "priority", "attempt", "max_attempts",
    "progress", "progress_message", "result", "error", "created_at", "started_at",
    "finished_at", "run_at", "cancel_requested", "snoozes", "batch_id",
    "parent_id", "chain_id", "chain_step", "children",  # flow (issue #16)
}  # fmt: skip


def parse(
    body: bytes = GOOD_BODY,
    *,
    key: str = "default.acme",
    message_id: str | None = "job-1",
    headers: dict[str, Any] | None = None,
    priority: int | None = None,
    max_body_bytes: int = LIMIT,
) -> Envelope:
    return parse_envelope(
        body,
        routing_key=key,
        message_id=message_id,
        headers=headers,
        priority=priority,
        max_body_bytes=max_body_bytes,
    )


# --- valid deliveries -----------------------------------------------------------------


def test_valid_body_becomes_an_envelope() -> None:
    """A well-formed delivery yields its id, type, args, lane, tenant and defaults."""
    envelope = parse()
    assert envelope == Envelope(
        id="job-1",
        type="thumbnail",
        args={"video_id": "v1"},
        queue="default",
        tenant="acme",
        priority=0,
        idempotency_key=None,
        max_attempts=None,
        timeout=None,
        priority_clamped=False,
    )


def test_args_default_to_an_empty_object() -> None:
    """A body without ``args`` means no arguments."""
    assert parse(b'{"type": "noop"}').args == {}


def test_body_at_the_limit_is_accepted() -> None:
    """The size limit is inclusive: a body of exactly max_body_bytes passes."""
    body = GOOD_BODY
    assert parse(body, max_body_bytes=len(body)).type == "thumbnail"


def test_routing_key_helper_round_trips() -> None:
    """``routing_key(queue, tenant)`` is what parse_envelope splits back."""
    envelope = parse(key=routing_key("slow", "tenant_9-x"))
    assert (envelope.queue, envelope.tenant) == ("slow", "tenant_9-x")


def test_headers_are_read() -> None:
    """x-idempotency-key, x-max-attempts and x-timeout-seconds land in the envelope."""
    envelope = parse(
        headers={
            "x-idempotency-key": "upload-9931",
            "x-max-attempts": 3,
            "x-timeout-seconds": 90,
        }
    )
    assert envelope.idempotency_key == "upload-9931"
    assert envelope.max_attempts == 3
    assert envelope.timeout == 90.0


def test_bytes_headers_are_decoded() -> None:
    """AMQP long strings may arrive as bytes; they count like text."""
    envelope = parse(
        headers={
            "x-idempotency-key": b"k-1",
            "x-max-attempts": b"4",
            "x-timeout-seconds": b"2.5",
        }
    )
    assert (envelope.idempotency_key, envelope.max_attempts, envelope.timeout) == ("k-1", 4, 2.5)


# --- contract violations, each with its exact reason ------------------------------------


def _body(document: Any) -> bytes:
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    ("case", "call", "reason"),
    [
        ("bytes that are not UTF-8", {"body": b"\xff"}, "not_json"),
        ("truncated JSON", {"body": b"{"}, "not_json"),
        ("empty body", {"body": b""}, "not_json"),
        ("JSON array", {"body": b"[1, 2]"}, "not_object"),
        ("JSON string", {"body": b'"thumbnail"'}, "not_object"),
        ("JSON null", {"body": b"null"}, "not_object"),
        ("no type", {"body": _body({"args": {}})}, "no_type"),
        ("empty type", {"body": _body({"type": ""})}, "no_type"),
        ("type not a string", {"body": _body({"type": 7})}, "no_type"),
        ("args a list", {"body": _body({"type": "t", "args": [1]})}, "invalid_args"),
        ("args a string", {"body": _body({"type": "t", "args": "x=1"})}, "invalid_args"),
        ("args null", {"body": _body({"type": "t", "args": None})}, "invalid_args"),
        ("too large", {"body": b" " * (LIMIT + 1)}, "too_large"),
        ("routing key without dot", {"key": "default"}, "invalid_routing_key"),
        ("empty routing key", {"key": ""}, "invalid_routing_key"),
        ("invalid tenant", {"key": "default.Acme!"}, "invalid_tenant"),
        ("empty tenant", {"key": "default."}, "invalid_tenant"),
        ("tenant with a dot", {"key": "default.acme.eu"}, "invalid_tenant"),
        ("tenant too long", {"key": "default." + "a" * 65}, "invalid_tenant"),
        ("invalid queue", {"key": "Fast.acme"}, "invalid_queue"),
        ("empty queue", {"key": ".acme"}, "invalid_queue"),
        ("message_id too long", {"message_id": "m" * 129}, "invalid_message_id"),
        ("message_id with a space", {"message_id": "job 1"}, "invalid_message_id"),
        (
            "idempotency key too long",
            {"headers": {"x-idempotency-key": "k" * 257}},
            "invalid_header",
        ),
        ("idempotency key not text", {"headers": {"x-idempotency-key": 5}}, "invalid_header"),
        ("x-max-attempts not a number", {"headers": {"x-max-attempts": "many"}}, "invalid_header"),
        ("x-max-attempts zero", {"headers": {"x-max-attempts": 0}}, "invalid_header"),
        ("x-max-attempts above 1000", {"headers": {"x-max-attempts": 1001}}, "invalid_header"),
        ("x-max-attempts a float", {"headers": {"x-max-attempts": 2.5}}, "invalid_header"),
        ("x-max-attempts a boolean", {"headers": {"x-max-attempts": True}}, "invalid_header"),
        ("x-timeout-seconds text", {"headers": {"x-timeout-seconds": "soon"}}, "invalid_header"),
        ("x-timeout-seconds zero", {"headers": {"x-timeout-seconds": 0}}, "invalid_header"),
        ("x-timeout-seconds negative", {"headers": {"x-timeout-seconds": -5}}, "invalid_header"),
        ("x-timeout-seconds NaN", {"headers": {"x-timeout-seconds": "nan"}}, "invalid_header"),
        ("x-timeout-seconds inf", {"headers": {"x-timeout-seconds": "inf"}}, "invalid_header"),
        ("x-timeout-seconds a list", {"headers": {"x-timeout-seconds": [1]}}, "invalid_header"),
    ],
)
def test_contract_violations_have_exact_reasons(
    case: str, call: dict[str, Any], reason: str
) -> None:
    """Every way to break the contract raises ContractViolation with its stable reason code."""
    with pytest.raises(ContractViolation) as caught:
        parse(**call)
    assert caught.value.reason == reason, case
    assert caught.value.detail
    assert str(caught.value).startswith(f"{reason}: ")


def test_routing_key_is_checked_before_the_body() -> None:
    """A bad routing key is reported even when the body is bad too."""
    with pytest.raises(ContractViolation) as caught:
        parse(b"{", key="nodot")
    assert caught.value.reason == "invalid_routing_key"


def test_message_id_of_128_characters_is_accepted() -> None:
    """128 printable ASCII characters is the longest job id."""
    assert parse(message_id="m" * 128).id == "m" * 128


# --- job ids ------------------------------------------------------------------------------


def test_message_id_is_the_job_id_even_with_a_key() -> None:
    """An explicit message_id wins over the idempotency key."""
    envelope = parse(message_id="abc", headers={"x-idempotency-key": "k"})
    assert envelope.id == "abc"
    assert envelope.idempotency_key == "k"


def test_idempotency_key_derives_a_stable_id() -> None:
    """Without message_id the same key and tenant give the same job id, every time."""
    first = parse(message_id=None, headers={"x-idempotency-key": "upload-9931"})
    second = parse(message_id=None, headers={"x-idempotency-key": "upload-9931"})
    assert first.id == second.id == job_id_for_key("acme", "upload-9931")
    assert job_id_for_key("acme", "upload-9931") == job_id_for_key("acme", "upload-9931")


def test_idempotency_key_id_is_tenant_scoped() -> None:
    """The same key under two tenants names two different jobs."""
    acme = parse(key="default.acme", message_id=None, headers={"x-idempotency-key": "k"})
    other = parse(key="default.other", message_id=None, headers={"x-idempotency-key": "k"})
    assert acme.id != other.id


def test_idempotency_key_id_does_not_depend_on_the_lane() -> None:
    """A key identifies a job per tenant, whichever lane the message came on."""
    fast = parse(key="fast.acme", message_id=None, headers={"x-idempotency-key": "k"})
    slow = parse(key="slow.acme", message_id=None, headers={"x-idempotency-key": "k"})
    assert fast.id == slow.id


def test_without_id_or_key_each_delivery_gets_a_new_id() -> None:
    """With neither message_id nor key, every parse makes a fresh UUID."""
    first, second = parse(message_id=None), parse(message_id=None)
    assert first.id != second.id
    assert re.fullmatch(r"[0-9a-f-]{36}", first.id)


def test_empty_message_id_counts_as_absent() -> None:
    """An empty message_id falls back to the idempotency key."""
    envelope = parse(message_id="", headers={"x-idempotency-key": "k"})
    assert envelope.id == job_id_for_key("acme", "k")


# --- headers and priority -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, 1), (1000, 1000), ("7", 7), (b"7", 7)],
)
def test_max_attempts_header_as_int_or_text(value: Any, expected: int) -> None:
    """x-max-attempts may be an integer or its text, within 1..1000."""
    assert parse(headers={"x-max-attempts": value}).max_attempts == expected


@pytest.mark.parametrize(
    ("priority", "expected", "clamped"),
    [
        (None, 0, False),
        (0, 0, False),
        (5, 5, False),
        (9, 9, False),
        (-1, 0, True),
        (10, 9, True),
        (255, 9, True),
    ],
)
def test_priority_is_clamped_to_0_9(priority: int | None, expected: int, clamped: bool) -> None:
    """Priorities outside 0..9 are clamped, and the envelope says so."""
    envelope = parse(priority=priority)
    assert envelope.priority == expected
    assert envelope.priority_clamped is clamped


# --- job records --------------------------------------------------------------------------


def _row(**changes: Any) -> dict[str, Any]:
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    row: dict[str, Any] = {
        "id": "job-1",
        "type": "thumbnail",
        "queue": "default",
        "tenant": "acme",
        "status": "running",
        "priority": 5,
        "attempt": 1,
        "max_attempts": 5,
        "progress": 0.123456,
        "progress_message": "rendering",
        "result": None,
        "error_kind": None,
        "error_message": None,
        "dead_reason": None,
        "created_at": moment,
        "started_at": moment,
        "finished_at": None,
        "run_at": moment,
        "cancel_requested": False,
        "args": {"video_id": "v1"},
    }
    row.update(changes)
    return row


def test_status_json_has_exactly_the_design_keys() -> None:
    """to_status_json returns the DESIGN §1 keys, no more and no fewer."""
    status = JobRecord.from_row(_row()).to_status_json()
    assert set(status) == STATUS_JSON_KEYS


def test_status_json_values_are_json_ready() -> None:
    """Status is its string, times are ISO 8601, progress is rounded, and it dumps as JSON."""
    status = JobRecord.from_row(_row()).to_status_json()
    assert status["status"] == "running"
    assert status["created_at"] == "2026-01-02T03:04:05+00:00"
    assert status["finished_at"] is None
    assert status["progress"] == 0.1235
    assert status["error"] is None
    json.dumps(status)


def test_status_json_error_has_kind_and_message() -> None:
    """A failed job's error is ``{kind, message}``, plus the dead reason when dead."""
    failed = JobRecord.from_row(
        _row(status="failed", error_kind="Permanent", error_message="bad input")
    )
    assert failed.to_status_json()["error"] == {"kind": "Permanent", "message": "bad input"}
    dead = JobRecord.from_row(
        _row(
            status="dead", error_kind="RuntimeError", error_message="x", dead_reason="max_attempts"
        )
    )
    error = dead.to_status_json()["error"]
    assert (error["kind"], error["message"]) == ("RuntimeError", "x")
    assert error["dead_reason"] == "max_attempts"


def test_status_enum_mirrors_the_sql_enum() -> None:
    """Status values equal the job_status enum of sql/schema.sql, in order."""
    schema = resources.files("coldbrew.sql").joinpath("schema.sql").read_text(encoding="utf-8")
    match = re.search(r"CREATE TYPE job_status AS ENUM \((?P<values>[^)]*)\)", schema)
    assert match is not None, "schema.sql has no job_status enum"
    sql_values = re.findall(r"'([a-z_]+)'", match["values"])
    # values added later: ALTER TYPE ... ADD VALUE appends them, in file order
    sql_values += re.findall(r"ALTER TYPE job_status ADD VALUE '([a-z_]+)'", schema)
    assert [status.value for status in Status] == sql_values


def test_terminal_statuses() -> None:
    """Succeeded, failed, dead and cancelled are terminal; the rest are not."""
    assert {s for s in Status if s.terminal} == {
        Status.SUCCEEDED,
        Status.FAILED,
        Status.DEAD,
        Status.CANCELLED,
    }
