"""Both sides of the message contract: what a worker refuses, a submitter refuses first.

``parse_envelope`` dead-letters what PostgreSQL could not store (a NUL, a lone
surrogate, NaN) with a reason; ``check_submission`` refuses the same before a
job is accepted; and whatever it accepts, ``parse_envelope`` reads back
exactly, through the AMQP wire encoding (a hypothesis property).
"""

from __future__ import annotations

import json
import math
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pamqp import decode, encode

from coldbrew.app import JOB_TYPE_RE
from coldbrew.errors import ContractViolation, InvalidRequest
from coldbrew.model import (
    JOB_ID_RE,
    MAX_TIMEOUT_SECONDS,
    MIN_TIMEOUT_SECONDS,
    NAME_RE,
    check_job_id,
    check_submission,
    job_id_for_key,
    message_body,
    message_headers,
    parse_envelope,
)

LIMIT = 4096


def parse(
    body: bytes | str = b'{"type": "echo", "args": {}}',
    *,
    key: str = "default.acme",
    message_id: str | None = "job-1",
    headers: dict[str, Any] | None = None,
    priority: int | None = None,
) -> Any:
    return parse_envelope(
        body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body,
        routing_key=key,
        message_id=message_id,
        headers=headers,
        priority=priority,
        max_body_bytes=1 << 16,
    )


def rejection(**call: Any) -> ContractViolation:
    with pytest.raises(ContractViolation) as caught:
        parse(**call)
    return caught.value


# --- the worker's side: what PostgreSQL cannot store is dead-lettered with a reason -----


@pytest.mark.parametrize(
    ("body", "reason", "mentions"),
    [
        ('{"type":"echo","args":{"text":"a\\u0000b"}}', "unstorable", "args.text contains NUL"),
        ('{"type":"echo","args":{"a\\u0000":1}}', "unstorable", "as a key contains NUL"),
        ('{"type":"echo","args":{"t":["\\ud800"]}}', "unstorable", "args.t[0] contains a lone"),
        ('{"type":"echo","args":{"t":"\ud800"}}', "unstorable", "lone surrogate"),  # raw bytes
        ('{"type":"echo","args":{"n":1e400}}', "unstorable", "args.n is inf"),
        ('{"type":"echo","args":{"n":-1e400}}', "unstorable", "args.n is -inf"),
        ('{"type":"echo","args":{"n":NaN}}', "not_json", "NaN is not a JSON number"),
        ('{"type":"echo","args":{"n":Infinity}}', "not_json", "Infinity is not a JSON number"),
        ('{"type":"echo","args":{"n":-Infinity}}', "not_json", "-Infinity"),
        ('{"type":"echo","args":{"d":' + "[" * 150 + "]" * 150 + "}}", "unstorable", "deeper"),
        ('{"type":"echo","args":{"d":' + "[" * 3000 + "]" * 3000 + "}}", "unstorable", "deeper"),
        ('{"type":"echo","args":{"n":' + "9" * 4400 + "}}", "not_json", "4300"),
        ('{"type":"echo","args":{"t":"\xff"}}', "not_json", "not JSON"),
    ],
)
def test_bodies_postgresql_cannot_store_are_rejected_with_a_reason(
    body: str, reason: str, mentions: str
) -> None:
    """Each is valid to Python's json, or nearly; none may reach a claim statement."""
    raw = body.encode("latin-1") if "\xff" in body else body
    error = rejection(body=raw)
    assert (error.reason, mentions in error.detail) == (reason, True), error.detail


@pytest.mark.parametrize(
    ("headers", "mentions"),
    [
        ({"x-idempotency-key": "a\x00b"}, "x-idempotency-key contains NUL"),
        ({"x-idempotency-key": "a\ud800"}, "x-idempotency-key contains a lone surrogate"),
        ({"x-idempotency-key": bytearray(b"\xff\xfe")}, "not UTF-8"),
        ({"x-idempotency-key": b"\xc3"}, "not UTF-8"),
        ({"x-idempotency-key": ""}, "1-256 characters"),
        ({"x-timeout-seconds": 1e-300}, "at least 0.001"),
        ({"x-timeout-seconds": "1e-300"}, "at least 0.001"),
        ({"x-timeout-seconds": 0.0}, "at least 0.001"),
        ({"x-timeout-seconds": "1e308"}, "below 1e+07"),
        ({"x-timeout-seconds": True}, "number of seconds"),
        ({"x-timeout-seconds": b"\xff"}, "number of seconds"),
        ({"x-max-attempts": 10**30}, "1..1000"),
    ],
)
def test_headers_postgresql_or_the_contract_refuse_are_rejected(
    headers: dict[str, Any], mentions: str
) -> None:
    error = rejection(message_id=None, headers=headers)
    assert error.reason == "invalid_header"
    assert mentions in error.detail, error.detail


def test_the_smallest_and_largest_timeouts_are_accepted() -> None:
    low = parse(headers={"x-timeout-seconds": "0.001"})
    high = parse(headers={"x-timeout-seconds": 9_999_999.5})
    assert (low.timeout, high.timeout) == (MIN_TIMEOUT_SECONDS, 9_999_999.5)


def test_storable_unicode_and_extreme_numbers_are_accepted() -> None:
    body = json.dumps({"type": "echo", "args": {"t": "café 𝄞 \u2028", "f": 1e308, "g": 5e-324}})
    assert parse(body=body.encode()).args == {"t": "café 𝄞 \u2028", "f": 1e308, "g": 5e-324}


# --- the submitter's side ------------------------------------------------------------


def submission(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "job_id": None,
        "type": "echo",
        "args": {"value": 1},
        "queue": "default",
        "tenant": "acme",
        "priority": 0,
        "idempotency_key": None,
        "max_attempts": 5,
        "timeout": None,
        "max_body_bytes": LIMIT,
    }
    fields.update(overrides)
    return fields


@pytest.mark.parametrize(
    ("overrides", "reason", "mentions"),
    [
        ({"args": {"text": "a\x00b"}}, "unstorable", "args.text contains NUL"),
        ({"args": {"t": "\udfff"}}, "unstorable", "lone surrogate"),
        ({"args": {"n": math.nan}}, "unstorable", "args.n is nan"),
        ({"args": {"n": math.inf}}, "unstorable", "args.n is inf"),
        ({"args": {"n": 10**5000}}, "unstorable", "4300 digits"),
        ({"args": {1: "x"}}, "invalid_args", "keys must be strings"),
        ({"args": {"s": {1, 2}}}, "invalid_args", "not JSON"),
        ({"args": ["x"]}, "invalid_args", "must be an object"),
        ({"args": {"v": "x" * LIMIT}}, "too_large", f"refuse more than {LIMIT}"),
        ({"timeout": 1e-300}, "invalid_request", "timeout must be at least 0.001"),
        ({"timeout": 0}, "invalid_request", "at least 0.001"),
        ({"timeout": -1.0}, "invalid_request", "at least 0.001"),
        ({"timeout": math.nan}, "invalid_request", "at least 0.001"),
        ({"timeout": math.inf}, "invalid_request", "below 1e+07"),
        ({"timeout": 1e7}, "invalid_request", "below 1e+07"),
        ({"timeout": True}, "invalid_request", "number of seconds"),
        ({"timeout": "5"}, "invalid_request", "number of seconds"),
        ({"max_attempts": True}, "invalid_request", "1..1000"),
        ({"max_attempts": 0}, "invalid_request", "1..1000"),
        ({"max_attempts": 1001}, "invalid_request", "1..1000"),
        ({"priority": 10}, "invalid_request", "0..9"),
        ({"priority": -1}, "invalid_request", "0..9"),
        ({"priority": True}, "invalid_request", "integer"),
        ({"priority": 2.0}, "invalid_request", "integer"),
        ({"idempotency_key": "k\x00"}, "invalid_request", "idempotency key contains NUL"),
        ({"idempotency_key": "\ud800"}, "invalid_request", "lone surrogate"),
        ({"idempotency_key": "k" * 257}, "invalid_request", "1-256"),
        ({"idempotency_key": ""}, "invalid_request", "1-256"),
        ({"job_id": "a\x00b"}, "invalid_request", "printable ASCII"),
        ({"job_id": "x" * 129}, "invalid_request", "printable ASCII"),
        ({"type": "no spaces allowed"}, "invalid_request", "job type"),
        ({"type": "a\x00"}, "invalid_request", "job type"),
        ({"tenant": "Acme"}, "invalid_request", "tenant"),
        ({"queue": "q\x00"}, "invalid_request", "queue"),
    ],
)
def test_submitters_refuse_what_a_worker_would_reject(
    overrides: dict[str, Any], reason: str, mentions: str
) -> None:
    """The 1e-300 timeout that went out as 0.0 is refused, as is every other mismatch."""
    with pytest.raises(InvalidRequest) as caught:
        check_submission(**submission(**overrides))
    assert caught.value.reason == reason
    assert mentions in caught.value.detail, caught.value.detail


def test_a_submission_at_the_body_limit_is_accepted() -> None:
    padding = LIMIT - len(message_body("echo", {"v": ""}))
    check_submission(**submission(args={"v": "x" * padding}))
    with pytest.raises(InvalidRequest, match="too_large"):
        check_submission(**submission(args={"v": "x" * (padding + 1)}))


def test_the_timeout_goes_as_exact_text() -> None:
    """A float header is a 32-bit float on the wire: 1e-300 became 0.0, 0.1 became 0.100000001."""
    headers = message_headers(idempotency_key="k", max_attempts=3, timeout=0.1)
    assert headers == {"x-idempotency-key": "k", "x-max-attempts": 3, "x-timeout-seconds": "0.1"}
    assert message_headers(idempotency_key=None, max_attempts=None, timeout=None) == {}
    _, wire = decode.field_table(encode.field_table({"f": 0.1, "tiny": 1e-300}))
    assert wire["f"] != 0.1 and wire["tiny"] == 0.0  # why it is not sent as a float


def test_check_job_id() -> None:
    check_job_id("6f1c0d3e-1111-4a2b-9c3d-000000000000")
    for bad in ("a\x00b", "", "x" * 129, "with space", "\ud800"):
        with pytest.raises(InvalidRequest) as caught:
            check_job_id(bad)
        assert caught.value.reason == "invalid_job_id"


# --- the property: accepted by a submitter => accepted by a worker, and read back exactly --

_text = st.text(st.characters(codec=None), max_size=12)  # surrogates, NUL, anything
_nasty_text = _text | st.sampled_from(["", "\x00", "a\x00b", "\ud800", "\udfff x", "é" * 300])
_names = st.from_regex(NAME_RE, fullmatch=True) | _nasty_text
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.builds(pow, st.sampled_from([10, -10]), st.sampled_from([4300, 4400]))
    | st.floats()  # NaN and infinities included
    | _nasty_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_nasty_text, inner, max_size=3),
    max_leaves=12,
)
_deep = st.integers(min_value=95, max_value=105).map(lambda n: json.loads("[" * n + "]" * n))


_storable_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
_storable_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**4299), max_value=10**4299)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _storable_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_storable_text, inner, max_size=3),
    max_leaves=12,
)


@st.composite
def valid_submissions(draw: st.DrawFn) -> dict[str, Any]:
    """Jobs a worker must accept: any storable args, every header at its edges."""
    return {
        "job_id": draw(st.none() | st.from_regex(JOB_ID_RE, fullmatch=True)),
        "type": draw(st.from_regex(JOB_TYPE_RE, fullmatch=True)),
        "args": draw(st.dictionaries(_storable_text, _storable_json, max_size=4)),
        "queue": draw(st.from_regex(NAME_RE, fullmatch=True)),
        "tenant": draw(st.from_regex(NAME_RE, fullmatch=True)),
        "priority": draw(st.integers(0, 9)),
        "idempotency_key": draw(st.none() | _storable_text.filter(bool)),
        "max_attempts": draw(st.none() | st.integers(1, 1000)),
        "timeout": draw(
            st.none()
            | st.floats(
                min_value=MIN_TIMEOUT_SECONDS, max_value=MAX_TIMEOUT_SECONDS, exclude_max=True
            )
            | st.integers(1, MAX_TIMEOUT_SECONDS - 1)
        ),
        "max_body_bytes": 10**7,
    }


NASTY: dict[str, st.SearchStrategy[Any]] = {
    "job_id": _nasty_text,
    "type": _nasty_text,
    "args": st.dictionaries(_nasty_text, _json | _deep, max_size=4) | _json,
    "queue": _names,
    "tenant": _names,
    "priority": st.integers(-2, 12) | st.booleans() | st.floats(0, 9),
    "idempotency_key": _nasty_text | st.text(min_size=250, max_size=260),
    "max_attempts": st.integers(-1, 1002) | st.booleans(),
    "timeout": st.floats()
    | st.sampled_from([1e-300, 5e-324, 0.0009, 0.001, 1e7, 1e308, 9_999_999.99])
    | st.integers(-1, 10**8),
    "max_body_bytes": st.sampled_from([300, LIMIT]),
}


@st.composite
def submissions(draw: st.DrawFn) -> dict[str, Any]:
    """A valid job with each field, one time in four, replaced by garbage."""
    job = draw(valid_submissions())
    for field, nasty in NASTY.items():
        if draw(st.integers(0, 3)) == 0:
            job[field] = draw(nasty)
    return job


def roundtrip(job: dict[str, Any]) -> None:
    """The message ``job`` describes, through AMQP's own encoding, parses to exactly ``job``."""
    headers = message_headers(
        idempotency_key=job["idempotency_key"],
        max_attempts=job["max_attempts"],
        timeout=job["timeout"],
    )
    _, wire_headers = decode.field_table(encode.field_table(headers))
    _, wire_id = decode.short_str(encode.short_string(job["job_id"] or ""))
    envelope = parse_envelope(
        message_body(job["type"], job["args"]),
        routing_key=f"{job['queue']}.{job['tenant']}",
        message_id=wire_id or None,
        headers=wire_headers,
        priority=job["priority"],
        max_body_bytes=job["max_body_bytes"],
    )
    if job["job_id"] is not None:
        assert envelope.id == job["job_id"]
    elif job["idempotency_key"] is not None:
        assert envelope.id == job_id_for_key(job["tenant"], job["idempotency_key"])
    assert (envelope.type, envelope.queue, envelope.tenant) == (
        job["type"],
        job["queue"],
        job["tenant"],
    )
    assert envelope.args == job["args"]
    assert (envelope.priority, envelope.priority_clamped) == (job["priority"], False)
    assert envelope.idempotency_key == job["idempotency_key"]
    assert envelope.max_attempts == job["max_attempts"]
    assert envelope.timeout == (None if job["timeout"] is None else float(job["timeout"]))


PROPERTY = settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@PROPERTY
@given(submissions())
def test_whatever_a_submitter_accepts_a_worker_accepts_and_reads_back(job: dict[str, Any]) -> None:
    """Garbage in every field: check_submission refuses it (InvalidRequest, never another
    exception), or the worker accepts the message and reads back exactly the job."""
    try:
        check_submission(**job)
    except InvalidRequest as refused:
        if not (refused.reason and refused.detail):
            raise AssertionError(f"a refusal without a reason: {refused!r}") from None
        event(f"refused: {refused.reason}")  # --hypothesis-show-statistics
        return
    event("accepted")
    roundtrip(job)


@PROPERTY
@given(valid_submissions())
def test_a_submitter_accepts_every_valid_job_and_a_worker_reads_it_back(
    job: dict[str, Any],
) -> None:
    """The other direction: nothing valid is refused (the broad property could pass by
    refusing everything), and all of it round-trips."""
    check_submission(**job)
    roundtrip(job)


def test_the_property_sees_accepted_jobs_too() -> None:
    """A guard against a vacuous property: a plain valid submission passes both sides."""
    job = submission(job_id="j-1", idempotency_key="k" + string.ascii_letters, timeout=0.1)
    check_submission(**job)
    envelope = parse(
        body=message_body(job["type"], job["args"]),
        message_id="j-1",
        headers=message_headers(
            idempotency_key=job["idempotency_key"], max_attempts=5, timeout=0.1
        ),
    )
    assert (envelope.timeout, envelope.max_attempts) == (0.1, 5)


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        ({"key": "slow.x\n"}, "invalid_tenant"),
        ({"key": "slow\n.x"}, "invalid_queue"),
        ({"message_id": "job-1\n"}, "invalid_message_id"),
    ],
)
def test_a_trailing_newline_is_not_a_name(call: dict[str, Any], reason: str) -> None:
    """``$`` matches before a final newline: a tenant "x\\n" passed, and its queue name broke
    the queue declaration (found by tests/faults/test_garbage_generated.py)."""
    assert rejection(**call).reason == reason


def test_a_submitter_refuses_a_trailing_newline_too() -> None:
    for overrides in (
        {"tenant": "acme\n"},
        {"queue": "default\n"},
        {"job_id": "j\n"},
        {"type": "echo\n"},
    ):
        with pytest.raises(InvalidRequest):
            check_submission(**submission(**overrides))
