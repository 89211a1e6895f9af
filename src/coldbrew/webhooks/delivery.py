"""The delivery job: one signed POST per attempt, to an address the SSRF guard let through.

Every worker registers ``coldbrew.webhook`` on its copy of the app
(``WebhookSender.register``); migration 0012's trigger enqueues one such job
per terminal transition of a job with a webhook URL, with a snapshot of the
job's record in its args, so the delivery reads nothing but its arguments and
the API keeps no webhook state at all.

One attempt: check the URL (``urlguard``), resolve its host and check every
address, connect to the one that passed (the Host header and TLS name stay
the URL's: DNS rebinding cannot switch the address after the check), POST
``{"event": "job.finished", "job": <status JSON>}`` signed as ever, and read at
most ``COLDBREW_WEBHOOK_MAX_RESPONSE_BYTES`` of the answer. Redirects are not
followed. A 2xx delivers; a network error, a time-out, 408, 425, 429 or a 5xx
raises ``WebhookFailed`` (the normal retry policy: backoff with jitter, then
dead); a 3xx or another 4xx, and a refused address, fail the job at once
(``Permanent``): its record says why.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import structlog

from coldbrew import __version__
from coldbrew.app import App
from coldbrew.context import Context
from coldbrew.errors import ContractViolation, Permanent
from coldbrew.model import JobRecord
from coldbrew.settings import Settings, mask_url
from coldbrew.urlguard import IPAddress, Target, check_webhook_url, refused_address
from coldbrew.webhooks.signing import SIGNATURE_HEADER, sign

log = structlog.get_logger("coldbrew.webhooks")

WEBHOOK_TYPE = "coldbrew.webhook"
EVENT = "job.finished"
RETRYABLE = frozenset({408, 425, 429})
_TIMES = ("created_at", "started_at", "finished_at", "run_at")

Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]
TransportFactory = Callable[[], httpx.AsyncBaseTransport]


class WebhookFailed(Exception):
    """An attempt failed in a way worth another attempt (the job is retried)."""


class WebhookBlocked(Permanent):
    """The SSRF guard refused the URL or an address its host resolves to."""


class WebhookRefused(Permanent):
    """The receiver answered with a redirect or a 4xx that another try will not change."""


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """The ``COLDBREW_WEBHOOK_*`` settings a delivery needs."""

    secret: str = ""
    max_attempts: int = 8
    timeout: float = 10.0
    connect_timeout: float = 5.0
    max_response_bytes: int = 64 * 1024
    allow_private: bool = False

    @classmethod
    def of(cls, settings: Settings) -> WebhookConfig:
        return cls(
            secret=settings.webhook_secret,
            max_attempts=settings.webhook_max_attempts,
            timeout=settings.webhook_timeout_seconds,
            connect_timeout=settings.webhook_connect_timeout_seconds,
            max_response_bytes=settings.webhook_max_response_bytes,
            allow_private=settings.webhook_allow_private,
        )

    @property
    def job_timeout(self) -> float:
        """The delivery job's own time-out: connect, write and read, with a margin."""
        return self.connect_timeout + 2 * self.timeout + 5.0


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (the system resolver, off the event loop)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if address not in found:
            found.append(address)
    return found


class WebhookSender:
    """Delivers webhooks as the ``coldbrew.webhook`` job; counts each attempt's outcome.

    ``resolver`` and ``transport`` are for tests (a resolver that answers what a
    rebinding DNS would; a transport that proves no connection was attempted).
    """

    def __init__(
        self,
        config: WebhookConfig,
        *,
        count: Callable[[str], None] | None = None,
        resolver: Resolver = resolve,
        transport: TransportFactory | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        # coldbrew_webhook_deliveries_total{outcome} (metrics.WEBHOOK_OUTCOMES)
        self._count: Callable[[str], None] = count or (lambda _outcome: None)
        self._resolver = resolver
        self._transport = transport
        self._clock = clock

    def register(self, app: App) -> None:
        """Add the delivery job to ``app`` (the worker's copy of the user's app), on the app's
        default lane; the registration the worker publishes tells the trigger that lane."""
        app.job(
            WEBHOOK_TYPE,
            max_attempts=self.config.max_attempts,
            timeout=self.config.job_timeout,
        )(self.deliver)

    async def deliver(self, ctx: Context, url: str, job: dict[str, Any]) -> dict[str, Any]:
        """The job: one attempt at delivering ``job`` (a record snapshot) to ``url``."""
        last = ctx.attempt >= ctx.max_attempts
        try:
            status = await self.send(url, job, delivery_id=ctx.job_id)
        except WebhookBlocked:
            self._count("blocked")
            raise
        except WebhookRefused:
            self._count("refused")
            raise
        except WebhookFailed:
            self._count("gave_up" if last else "retried")
            raise
        self._count("delivered")
        return {"status": status, "attempt": ctx.attempt}

    async def send(self, url: str, job: dict[str, Any], *, delivery_id: str) -> int:
        """POST the signed event once; the receiver's status, or one of this module's errors."""
        if not self.config.secret:
            raise WebhookFailed(
                "this worker has no COLDBREW_WEBHOOK_SECRET (webhooks are always signed)"
            )
        try:
            target = check_webhook_url(url, allow_private=self.config.allow_private)
        except ContractViolation as exc:
            raise WebhookBlocked(exc.detail) from None
        address = await self._address(target)
        body = event_body(job)
        headers = {
            "Host": target.host_header,
            "Content-Type": "application/json",
            "User-Agent": f"coldbrew/{__version__}",
            SIGNATURE_HEADER: sign(self.config.secret, int(self._clock()), body),
            "Coldbrew-Event": EVENT,
            "Coldbrew-Delivery": str(job.get("id", "")),
            "Coldbrew-Webhook-Id": delivery_id,
        }
        status = await self._post(target, address, body, headers)
        log.info("webhook_delivered", url=mask_url(url), status=status, webhook_id=delivery_id)
        return status

    async def _address(self, target: Target) -> IPAddress:
        """The address to connect to: the literal one, or the first the host resolves to,
        each of them checked (a name with one refused address is refused)."""
        literal = target.literal
        if literal is not None:
            return literal  # check_webhook_url judged it already
        try:
            addresses = await self._resolver(target.host, target.port)
        except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
            raise WebhookFailed(f"cannot resolve {target.host!r}: {exc}") from None
        if not addresses:
            raise WebhookFailed(f"{target.host!r} resolves to no address")
        if not self.config.allow_private:
            for address in addresses:
                if (problem := refused_address(address)) is not None:
                    raise WebhookBlocked(
                        f"{target.host!r} resolves to {address}: {problem} "
                        "(COLDBREW_WEBHOOK_ALLOW_PRIVATE=true allows it)"
                    )
        return addresses[0]

    async def _post(
        self, target: Target, address: IPAddress, body: bytes, headers: dict[str, str]
    ) -> int:
        config = self.config
        timeout = httpx.Timeout(config.timeout, connect=config.connect_timeout)
        transport = self._transport() if self._transport is not None else None
        extensions = {}
        if target.scheme == "https" and target.literal is None:
            extensions["sni_hostname"] = target.host  # TLS checks the name, not the address
        async with httpx.AsyncClient(
            transport=transport, timeout=timeout, follow_redirects=False, trust_env=False
        ) as http:
            try:
                async with http.stream(
                    "POST",
                    target.url_for(address),
                    content=body,
                    headers=headers,
                    extensions=extensions,
                ) as response:
                    answer = await _read_capped(response, config.max_response_bytes)
            except httpx.HTTPError as exc:
                raise WebhookFailed(f"POST to {address}: {exc!r}") from None
        return _judge(response.status_code, answer)


async def _read_capped(response: httpx.Response, cap: int) -> bytes:
    """At most ``cap`` bytes of the answer; the rest is never read (the stream closes)."""
    kept = bytearray()
    async for chunk in response.aiter_raw():
        kept += chunk[: cap - len(kept)]
        if len(kept) >= cap:
            break
    return bytes(kept)


def _judge(status: int, answer: bytes) -> int:
    """The status when it delivers; else the error that says what comes next."""
    if 200 <= status < 300:
        return status
    said = answer[:200].decode("utf-8", "replace")
    if status >= 500 or status in RETRYABLE or status < 200:
        raise WebhookFailed(f"the receiver answered {status}: {said!r}")
    if 300 <= status < 400:
        raise WebhookRefused(f"the receiver answered {status} (redirects are not followed)")
    raise WebhookRefused(f"the receiver answered {status}: {said!r}")


def event_body(job: dict[str, Any]) -> bytes:
    """The signed body: the event and the job's status JSON at its transition."""
    status = record_of(job).to_status_json()
    if job.get("result_omitted"):
        status["result_omitted"] = True  # over 64 KiB: GET /jobs/{id} has it
    document = {"event": EVENT, "job": status}
    return json.dumps(document, separators=(",", ":")).encode()


def record_of(snapshot: dict[str, Any]) -> JobRecord:
    """The ``JobRecord`` of the trigger's snapshot (``to_jsonb`` of the row: times as text)."""
    row = dict(snapshot, args={})
    for name in _TIMES:
        if isinstance(row.get(name), str):
            row[name] = datetime.fromisoformat(row[name]).astimezone(UTC)
    try:
        return JobRecord.from_row(row)
    except (KeyError, ValueError) as exc:
        raise Permanent(f"the delivery's job snapshot is incomplete: {exc!r}") from None
