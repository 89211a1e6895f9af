"""Signed webhooks when a job the API accepted finishes.

The dispatcher remembers the ids of jobs submitted through this process and
checks them by primary key about once a second, so neither the workers nor
the job table's indexes pay for webhooks. That memory is lost with the
process: a webhook is a convenience, never the only way to learn a result —
``GET /jobs/{id}`` (or ``?wait=``) always is.

Each delivery is a POST of ``{"event": "job.finished", "job": <status JSON>}``
with ``Coldbrew-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
"<t>.<body>">``. Network errors, 408, 429 and 5xx are retried with
exponential backoff and full jitter; other answers end the delivery.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AsyncExitStack

import httpx
import structlog

from coldbrew.client import Client
from coldbrew.errors import ServiceUnavailable
from coldbrew.model import JobRecord
from coldbrew.retry import backoff_delay
from coldbrew.settings import mask_url

log = structlog.get_logger("coldbrew.api.webhooks")

SIGNATURE_HEADER = "Coldbrew-Signature"
RETRYABLE = frozenset({408, 425, 429})


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header's value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, header: str, body: bytes, *, now: float, tolerance: float = 300) -> bool:
    """What a receiver checks: a valid signature, made within ``tolerance`` seconds of ``now``."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance:
        return False
    expected = sign(secret, timestamp, body).partition(",v1=")[2]
    return hmac.compare_digest(expected, fields.get("v1", ""))


class WebhookDispatcher:
    """Watches accepted jobs and delivers one signed webhook when each finishes."""

    def __init__(
        self,
        url: str,
        secret: str,
        *,
        max_attempts: int = 8,
        timeout: float = 10.0,
        poll_interval: float = 1.0,
        retry_base: float = 1.0,
        retry_cap: float = 300.0,
        max_tracked: int = 100_000,
        concurrency: int = 16,
        http: httpx.AsyncClient | None = None,
        rand: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
        count: Callable[[str], None] | None = None,
    ) -> None:
        self.url, self._secret = url, secret
        self.max_attempts, self.timeout = max_attempts, timeout
        self.poll_interval, self.retry_base, self.retry_cap = poll_interval, retry_base, retry_cap
        self.max_tracked = max_tracked
        self._slots = asyncio.Semaphore(concurrency)
        self._http = http
        self._rand, self._clock = rand, clock
        # each outcome (metrics.WEBHOOK_OUTCOMES) as it happens: coldbrew_api_webhooks_total
        self._count: Callable[[str], None] = count or (lambda _outcome: None)
        self._pending: OrderedDict[str, None] = OrderedDict()

    def track(self, record: JobRecord) -> None:
        """Remember a submitted job (the API calls this on each 202)."""
        if record.status.terminal or record.id in self._pending:
            return  # a replayed idempotent submission of a finished job: already told
        self._pending[record.id] = None
        if len(self._pending) > self.max_tracked:
            dropped, _ = self._pending.popitem(last=False)
            self._count("untracked")
            log.warning("webhook_untracked", job_id=dropped, reason="max_tracked reached")

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def run(self, client: Client) -> None:
        """Poll and deliver until cancelled; a bug in a delivery ends it (and the API) loudly."""
        async with AsyncExitStack() as stack:
            http = self._http  # one passed in stays open: close only what we open
            if http is None:
                http = await stack.enter_async_context(httpx.AsyncClient(timeout=self.timeout))
            deliveries = await stack.enter_async_context(asyncio.TaskGroup())
            while True:
                for record in await self._finished(client):
                    del self._pending[record.id]
                    deliveries.create_task(self.deliver(http, record), name=f"webhook-{record.id}")
                await asyncio.sleep(self.poll_interval)

    async def _finished(self, client: Client) -> list[JobRecord]:
        if not self._pending:
            return []
        try:
            return await client.store.jobs.get_finished_jobs(list(self._pending))
        except ServiceUnavailable as exc:  # keep the ids; look again on the next turn
            log.warning("webhook_poll_failed", error=str(exc))
            return []

    async def deliver(self, http: httpx.AsyncClient, record: JobRecord) -> bool:
        """POST the event until it is accepted, refused, or the attempts are spent."""
        body = json.dumps(
            {"event": "job.finished", "job": record.to_status_json()}, separators=(",", ":")
        ).encode()
        async with self._slots:
            for attempt in range(1, self.max_attempts + 1):
                outcome = await self._post(http, record.id, body, attempt)
                if outcome is not None:
                    self._count("delivered" if outcome else "refused")
                    return outcome
                if attempt < self.max_attempts:
                    self._count("retried")
                    delay = backoff_delay(
                        attempt, base=self.retry_base, cap=self.retry_cap, rand=self._rand
                    )
                    await asyncio.sleep(delay)
        self._count("gave_up")
        log.error("webhook_gave_up", job_id=record.id, attempts=self.max_attempts)
        return False

    async def _post(
        self, http: httpx.AsyncClient, job_id: str, body: bytes, attempt: int
    ) -> bool | None:
        """True delivered, False refused for good, None worth another try."""
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(self._secret, int(self._clock()), body),
            "Coldbrew-Event": "job.finished",
            "Coldbrew-Delivery": job_id,
        }
        try:
            response = await http.post(
                self.url, content=body, headers=headers, timeout=self.timeout
            )
        except httpx.HTTPError as exc:
            log.warning(
                "webhook_failed", job_id=job_id, attempt=attempt, error=str(exc) or repr(exc)
            )
            return None
        if response.is_success:
            log.info("webhook_delivered", job_id=job_id, attempt=attempt)
            return True
        retry = response.status_code >= 500 or response.status_code in RETRYABLE
        log.warning(
            "webhook_rejected",
            job_id=job_id,
            attempt=attempt,
            status=response.status_code,
            url=mask_url(self.url),
            retry=retry,
        )
        return None if retry else False
