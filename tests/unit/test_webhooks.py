"""Webhook URLs, the SSRF guard, the delivery's verdicts and body: pure logic, no network."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import httpx
import pytest

from coldbrew.api.errors import ApiError
from coldbrew.api.schemas import parse_submit
from coldbrew.errors import ContractViolation
from coldbrew.model import message_headers, parse_envelope
from coldbrew.urlguard import IPAddress, check_webhook_url, refused_address
from coldbrew.webhooks import WebhookConfig, WebhookSender, verify
from coldbrew.webhooks.delivery import (
    WebhookBlocked,
    WebhookFailed,
    WebhookRefused,
    _judge,
    event_body,
)

SECRET = "hook-secret-0123456789"
REFUSED = [
    "127.0.0.1",
    "127.8.9.10",
    "169.254.169.254",
    "10.0.0.1",
    "172.16.0.1",
    "192.168.1.1",
    "100.64.0.1",
    "0.0.0.0",
    "224.0.0.1",
    "255.255.255.255",
    "::1",
    "::",
    "fe80::1",
    "fc00::1",
    "fd12:3456::1",
    "ff02::1",
    "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
]
ALLOWED = ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", REFUSED)
def test_guard_refuses_internal_addresses(address: str) -> None:
    """Loopback, link-local, private, unique-local, multicast, unspecified (and IPv4 inside
    IPv6) are refused, each with a reason naming the address."""
    problem = refused_address(ipaddress.ip_address(address))
    assert problem is not None and " address" in problem


@pytest.mark.parametrize("address", ALLOWED)
def test_guard_allows_global_addresses(address: str) -> None:
    assert refused_address(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://example.com/", "http:// or https://"),
        ("javascript:alert(1)", "http:// or https://"),
        ("http://", "no host"),
        ("http://user:pw@example.com/", "credentials"),
        ("http://example.com:99999/", "not a URL"),
        ("http://example.com/a b", "printable ASCII"),
        ("http://exämple.com/", "printable ASCII"),
        ("http://[::1/", "not a URL"),
        ("http://example.com/" + "x" * 2048, "1-2048"),
        ("", "1-2048"),
        ("http://127.0.0.1/hook", "loopback"),
        ("http://[::ffff:127.0.0.1]/hook", "loopback"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://10.0.0.1/", "private"),
    ],
)
def test_bad_urls_are_refused_with_a_reason(url: str, says: str) -> None:
    with pytest.raises(ContractViolation) as caught:
        check_webhook_url(url, allow_private=False)
    assert caught.value.reason == "invalid_webhook_url"
    assert says in caught.value.detail


def test_literal_private_address_is_allowed_when_configured() -> None:
    """COLDBREW_WEBHOOK_ALLOW_PRIVATE=true: a receiver on this machine is fine."""
    target = check_webhook_url("http://127.0.0.1:8123/h?x=1", allow_private=True)
    assert (target.host, target.port, target.path) == ("127.0.0.1", 8123, "/h?x=1")
    assert target.url_for(ipaddress.ip_address("127.0.0.1")) == "http://127.0.0.1:8123/h?x=1"
    six = check_webhook_url("https://[::1]/", allow_private=True)
    assert six.host_header == "[::1]" and six.port == 443


def test_garbage_header_is_rejected_and_a_good_one_kept() -> None:
    """x-webhook-url: a producer's garbage (not a string, not UTF-8, not a URL, a literal
    private address) is a contract violation with reason invalid_webhook_url."""
    body = b'{"type": "echo", "args": {}}'

    def parse(value: Any, allow_private: bool = False) -> str | None:
        envelope = parse_envelope(
            body,
            routing_key="default.acme",
            message_id="m1",
            headers={"x-webhook-url": value},
            priority=None,
            max_body_bytes=1024,
            allow_private_webhooks=allow_private,
        )
        return envelope.webhook_url

    assert parse("https://hooks.example.com/x") == "https://hooks.example.com/x"
    assert parse(b"https://hooks.example.com/y") == "https://hooks.example.com/y"
    assert parse("http://127.0.0.1:1/", allow_private=True) == "http://127.0.0.1:1/"
    for garbage in (42, b"\xff\xfe", "not a url", "http://10.0.0.1/", ["http://a.example"]):
        with pytest.raises(ContractViolation) as caught:
            parse(garbage)
        assert caught.value.reason == "invalid_webhook_url"
    headers = message_headers(
        idempotency_key=None, max_attempts=None, timeout=None, webhook_url="https://a.example/"
    )
    assert headers == {"x-webhook-url": "https://a.example/"}


def test_http_body_takes_host_names_only() -> None:
    """POST /jobs: webhook_url is a URL whose host is a name; a literal address, another
    scheme or garbage is a 422 that names the field."""
    ok = parse_submit(b'{"type": "t", "webhook_url": "https://Hooks.example.com:8443/x?y=1"}')
    assert ok.webhook_url == "https://Hooks.example.com:8443/x?y=1"
    for url in ("http://127.0.0.1/", "http://10.0.0.1/x", "ftp://a.example/", "http://[::1]/"):
        with pytest.raises(ApiError) as caught:
            parse_submit(json.dumps({"type": "t", "webhook_url": url}).encode())
        assert caught.value.status == 422 and "webhook_url" in str(caught.value)


class NoNetwork:
    """A transport and resolver that fail the test if the delivery reaches them."""

    def __init__(self, answers: list[IPAddress] | None = None) -> None:
        self.answers = answers
        self.resolved: list[str] = []

    def transport(self) -> httpx.AsyncBaseTransport:
        raise AssertionError("httpx was called: a connection would have been attempted")

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        self.resolved.append(host)
        if self.answers is None:
            raise AssertionError("the resolver was called for a literal address")
        return self.answers


SNAPSHOT = {
    "id": "job-1",
    "type": "echo",
    "queue": "default",
    "tenant": "acme",
    "status": "succeeded",
    "priority": 0,
    "attempt": 1,
    "max_attempts": 3,
    "progress": 1,
    "progress_message": None,
    "result": {"ok": True},
    "error_kind": None,
    "error_message": None,
    "dead_reason": None,
    "created_at": "2026-12-01T23:00:00.5+01:00",
    "started_at": "2026-12-01T22:00:01+00:00",
    "finished_at": "2026-12-01T22:00:02+00:00",
    "run_at": "2026-12-01T22:00:00+00:00",
    "cancel_requested": False,
    "snoozes": 0,
    "some_future_column": "a column another feature added",
}


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
    ],
)
async def test_delivery_refuses_literal_addresses_before_any_connection(url: str) -> None:
    """The delivery refuses a literal internal address without resolving or connecting."""
    guard = NoNetwork()
    sender = WebhookSender(
        WebhookConfig(secret=SECRET), resolver=guard.resolve, transport=guard.transport
    )
    with pytest.raises(WebhookBlocked, match="refused"):
        await sender.send(url, SNAPSHOT, delivery_id="d1")
    assert guard.resolved == []


async def test_delivery_refuses_a_name_that_resolves_to_loopback() -> None:
    """``localhost`` resolves (for real) to loopback: refused before httpx is called."""
    guard = NoNetwork()
    sender = WebhookSender(WebhookConfig(secret=SECRET), transport=guard.transport)
    with pytest.raises(WebhookBlocked, match="loopback"):
        await sender.send("http://localhost:9/hook", SNAPSHOT, delivery_id="d1")


async def test_delivery_refuses_a_name_with_any_internal_address() -> None:
    """A rebinding-style answer (one public address, one internal) is refused as a whole."""
    guard = NoNetwork([ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("10.1.2.3")])
    sender = WebhookSender(
        WebhookConfig(secret=SECRET), resolver=guard.resolve, transport=guard.transport
    )
    with pytest.raises(WebhookBlocked, match="10.1.2.3"):
        await sender.send("https://hooks.example.com/x", SNAPSHOT, delivery_id="d1")
    assert guard.resolved == ["hooks.example.com"]


async def test_delivery_connects_to_the_checked_address_with_the_name_kept() -> None:
    """The request goes to the address that was checked; Host and TLS name stay the URL's;
    the body is signed; a redirect is not followed."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        moved = httpx.ByteStream(b"moved")
        return httpx.Response(302, headers={"location": "http://169.254.169.254/"}, stream=moved)

    guard = NoNetwork([ipaddress.ip_address("93.184.216.34")])
    sender = WebhookSender(
        WebhookConfig(secret=SECRET),
        resolver=guard.resolve,
        transport=lambda: httpx.MockTransport(answer),
        clock=lambda: 1_700_000_000,
    )
    with pytest.raises(WebhookRefused, match="redirects are not followed"):
        await sender.send("https://hooks.example.com:8443/x?y=1", SNAPSHOT, delivery_id="d1")
    (request,) = seen
    assert str(request.url) == "https://93.184.216.34:8443/x?y=1"
    assert request.headers["host"] == "hooks.example.com:8443"
    assert request.extensions["sni_hostname"] == "hooks.example.com"
    assert request.headers["coldbrew-delivery"] == "job-1"
    assert verify(SECRET, request.headers["coldbrew-signature"], request.content, now=1.7e9)


def test_verdicts() -> None:
    """2xx delivers; network-ish answers (408, 425, 429, 5xx) retry; 3xx and other 4xx fail."""
    assert _judge(204, b"") == 204
    for status in (408, 425, 429, 500, 503):
        with pytest.raises(WebhookFailed):
            _judge(status, b"busy")
    for status in (301, 400, 401, 404, 410):
        with pytest.raises(WebhookRefused):
            _judge(status, b"no")


def test_event_body_is_the_status_json_at_the_transition() -> None:
    """The snapshot becomes the status JSON of DESIGN §1 (times in UTC), under job.finished."""
    event = json.loads(event_body(SNAPSHOT))
    assert event["event"] == "job.finished"
    job = event["job"]
    assert job["id"] == "job-1" and job["status"] == "succeeded" and job["result"] == {"ok": True}
    assert job["created_at"] == "2026-12-01T22:00:00.500000+00:00"
    assert "some_future_column" not in job and "args" not in job
    omitted = json.loads(event_body(dict(SNAPSHOT, result=None, result_omitted=True)))
    assert omitted["job"]["result_omitted"] is True


async def test_a_worker_without_the_secret_retries() -> None:
    """Unsigned webhooks are never sent: without COLDBREW_WEBHOOK_SECRET an attempt fails
    (and is retried, so a deploy that adds the secret delivers it)."""
    guard = NoNetwork()
    sender = WebhookSender(WebhookConfig(), resolver=guard.resolve, transport=guard.transport)
    with pytest.raises(WebhookFailed, match="COLDBREW_WEBHOOK_SECRET"):
        await sender.send("https://hooks.example.com/", SNAPSHOT, delivery_id="d1")


def test_tenant_option_is_checked_like_a_submission() -> None:
    """`coldbrew tenants set T --webhook-url`: none removes it; a literal internal address is
    a configuration error (exit 2) unless COLDBREW_WEBHOOK_ALLOW_PRIVATE."""
    from coldbrew.cli.fleet import parse_webhook_option
    from coldbrew.errors import ConfigurationError
    from coldbrew.settings import load_settings

    settings = load_settings()
    assert parse_webhook_option(None, settings) is None
    assert parse_webhook_option("none", settings) == "none"
    assert parse_webhook_option("https://a.example/h", settings) == "https://a.example/h"
    with pytest.raises(ConfigurationError, match="--webhook-url .* link-local"):
        parse_webhook_option("http://169.254.169.254/", settings)
    private = load_settings(webhook_allow_private=True)
    assert parse_webhook_option("http://10.0.0.1/", private) == "http://10.0.0.1/"
