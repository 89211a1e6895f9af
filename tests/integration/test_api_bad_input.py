"""Bad input over HTTP: a specific 4xx with the JSON error, never a 500 (issue #13).

Before: NUL in args or in a job id path answered 500 (PostgreSQL refused the
statement), and ``"timeout_seconds": 1e-300`` answered 202 for a job no
worker would ever run. A property test sends generated garbage and checks
that whatever is accepted is a message a worker accepts, read off the broker.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import httpx
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from coldbrew.client import Client
from coldbrew.model import parse_envelope
from coldbrew.settings import Settings
from coldbrew.topology import Topology
from tests.integration.test_api import ACME, api_client, error_of


@pytest.fixture
async def http(client: Client) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(client, max_wait_seconds=1) as connected:
        yield connected


async def post(http: httpx.AsyncClient, content: bytes, **headers: str) -> httpx.Response:
    return await http.post(
        "/jobs", content=content, headers={**ACME, "Content-Type": "application/json", **headers}
    )


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("content", "status", "kind", "mentions"),
    [
        (
            rb'{"type":"echo","args":{"value":"a\u0000b"}}',
            422,
            "unstorable",
            "args.value contains NUL",
        ),  # noqa: E501
        (
            rb'{"type":"echo","args":{"value":{"a\u0000":1}}}',
            422,
            "unstorable",
            "as a key contains NUL",
        ),
        (rb'{"type":"echo","args":{"value":NaN}}', 422, "unstorable", "args.value is nan"),
        (rb'{"type":"echo","args":{"value":-Infinity}}', 422, "unstorable", "is -inf"),
        (rb'{"type":"echo","args":{"value":1e400}}', 422, "unstorable", "args.value is inf"),
        (rb'{"type":"echo","args":{"value":"\ud800"}}', 400, "invalid_json", "not JSON"),
        (b'{"type":"echo","args":{"value":"\xed\xa0\x80"}}', 400, "invalid_json", "not JSON"),
        (b'{"type":"echo","args":{"value":"\xff"}}', 400, "invalid_json", "not JSON"),
        (
            b'{"type":"echo","args":{"value":' + nested(120).encode() + b"}}",
            422,
            "unstorable",
            "deeper than 100",
        ),  # noqa: E501
        (
            b'{"type":"echo","args":{"value":' + nested(3000).encode() + b"}}",
            400,
            "invalid_json",
            "recursion",
        ),  # noqa: E501
        (b'{"type":"echo","timeout_seconds":1e-300}', 422, "invalid_body", "timeout_seconds"),
        (b'{"type":"echo","timeout_seconds":0}', 422, "invalid_body", "timeout_seconds"),
        (b'{"type":"echo","timeout_seconds":10000000}', 422, "invalid_body", "timeout_seconds"),
        (b'{"type":"echo","timeout_seconds":NaN}', 422, "invalid_body", "timeout_seconds"),
        (b'{"type":"echo","max_attempts":true}', 422, "invalid_body", "max_attempts"),
        (b'{"type":"echo\\u0000"}', 422, "invalid_body", "type"),
        (b'{"type":"echo","tenant":"acme\\u0000"}', 422, "invalid_body", "tenant"),
    ],
    ids=[
        "nul-in-args",
        "nul-in-a-key",
        "nan",
        "minus-infinity",
        "1e400",
        "escaped-surrogate",
        "raw-surrogate",
        "not-utf8",
        "nested-120",
        "nested-3000",
        "timeout-1e-300",
        "timeout-0",
        "timeout-1e7",
        "timeout-nan",
        "max-attempts-bool",
        "nul-in-type",
        "nul-in-tenant",
    ],
)
async def test_bad_submissions_are_4xx_with_the_reason(
    http: httpx.AsyncClient, client: Client, content: bytes, status: int, kind: str, mentions: str
) -> None:
    """Each is refused before anything is written: no row, no message."""
    response = await post(http, content)
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["kind"] == kind
    assert mentions in error["message"], error["message"]
    rows = await client.store._fetch("queue_stats", None)
    assert rows == [], "a refused submission left a job row"


async def test_a_body_the_api_takes_but_a_worker_would_not_is_413(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    """Raw UTF-8 over HTTP, \\uXXXX escapes on the wire: up to 6 bytes a character. The
    HTTP body is under COLDBREW_MAX_BODY_BYTES, the message it becomes is not."""
    text = "é" * (settings.max_body_bytes // 4)
    body = json.dumps({"type": "echo", "args": {"value": text}}, ensure_ascii=False).encode()
    assert len(body) < settings.max_body_bytes
    response = await post(http, body)
    assert response.status_code == 413, response.text
    error = error_of(response)
    assert error["kind"] == "too_large"
    assert "workers refuse more than" in error["message"]


async def test_the_smallest_timeout_a_worker_takes_is_accepted(http: httpx.AsyncClient) -> None:
    response = await post(http, b'{"type":"echo","timeout_seconds":0.001}')
    assert response.status_code == 202, response.text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/jobs/a%00b"),
        ("GET", "/jobs/a%00b?wait=1"),
        ("GET", "/jobs/a%00b/events"),
        ("DELETE", "/jobs/a%00b"),
        ("GET", "/jobs/" + "x" * 129),
        ("GET", "/jobs/%ED%A0%80"),
        ("GET", "/dashboard/jobs/a%00b"),
    ],
)
async def test_a_job_id_no_job_can_have_is_422_not_500(
    http: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await http.request(method, path, headers=ACME)
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert error["kind"] == "invalid_job_id"
    assert "not a job id" in error["message"]


async def test_a_cancel_reason_with_nul_is_422(http: httpx.AsyncClient) -> None:
    job = (await post(http, b'{"type":"echo"}')).json()
    response = await http.delete(f"/jobs/{job['id']}?reason=stop%00now", headers=ACME)
    assert response.status_code == 422, response.text
    assert "cancel reason contains NUL" in error_of(response)["message"]
    still = await http.get(f"/jobs/{job['id']}", headers=ACME)
    assert still.json()["status"] == "queued"


async def test_an_idempotency_key_with_nul_is_422(http: httpx.AsyncClient) -> None:
    response = await post(http, b'{"type":"echo"}', **{"Idempotency-Key": "k\x00"})
    assert response.status_code == 422, response.text
    assert error_of(response)["kind"] == "invalid_idempotency_key"


# --- the property: no garbage is a 500, and whatever is accepted, a worker accepts -------

_text = st.text(st.characters(codec=None), max_size=8) | st.sampled_from(
    ["\x00", "a\x00", "\ud800", "\udfff", "é" * 40]
)
_value = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()
    | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=10,
)
_field = st.sampled_from(["args", "timeout_seconds", "max_attempts", "priority", "queue"])


@st.composite
def submit_bodies(draw: st.DrawFn) -> bytes:
    body: dict[str, Any] = {"type": "echo", "args": {"value": draw(_value)}}
    for field in draw(st.lists(_field, max_size=2, unique=True)):
        body[field] = draw(_value | st.floats(min_value=-1, max_value=2e7))
    text = json.dumps(body, ensure_ascii=draw(st.booleans()), allow_nan=True)
    return text.encode("utf-8", "surrogatepass")


SEEN: dict[int, int] = {}


@hsettings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=submit_bodies())
async def test_generated_garbage_is_never_a_500_and_what_is_accepted_a_worker_accepts(
    http: httpx.AsyncClient, amqp: aio_pika.abc.AbstractChannel, settings: Settings, body: bytes
) -> None:
    """No worker runs: an accepted job's message waits in <ns>.unrouted, and parse_envelope
    (the worker's own check) must accept it. (The fixtures serve every example.)"""
    response = await post(http, body)
    SEEN[response.status_code] = SEEN.get(response.status_code, 0) + 1
    assert response.status_code in (202, 400, 413, 422), (response.status_code, response.text)
    if response.status_code != 202:
        assert set(response.json()) == {"error"}
        return
    unrouted = await amqp.get_queue(Topology(settings.namespace).unrouted_queue)
    message = await unrouted.get(timeout=5)
    await message.ack()
    envelope = parse_envelope(
        message.body,
        routing_key=message.routing_key or "",
        message_id=message.message_id,
        headers=message.headers,
        priority=message.priority,
        max_body_bytes=settings.max_body_bytes,
    )
    assert envelope.id == response.json()["id"]


def test_the_property_saw_both_accepted_and_refused_bodies() -> None:
    """Runs after the property (file order): it was not vacuous either way."""
    if not SEEN:
        pytest.skip("the property did not run in this session")
    assert SEEN.get(202, 0) > 0, SEEN
    assert sum(n for status, n in SEEN.items() if status != 202) > 0, SEEN
