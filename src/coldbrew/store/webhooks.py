"""``WebhookRows``: a raw delivery's webhook URL, written before its claim.

The delivery jobs themselves are inserted by PostgreSQL (the trigger of
migration 0012, in the outcome's transaction); the one thing Python must write
is the URL of a job whose row a raw AMQP producer left to the worker
(``x-webhook-url``), so that the trigger finds it when the job ends.
"""

from __future__ import annotations

from coldbrew.store.base import StoreBase
from coldbrew.store.records import ClaimRequest


class WebhookRows(StoreBase):
    """The URL of a raw delivery's job, recorded with (or onto) its row."""

    async def record(self, request: ClaimRequest, *, relay_grace: float) -> None:
        """Insert the job's row with ``request.webhook_url`` as ``insert_job`` would
        (queued, or scheduled at its ``run_at``), or give an unfinished row without a URL
        this one; the claim that follows finds the row."""
        await self._execute(
            "record_webhook_job",
            *request.row_fields(),
            request.idempotency_key,
            relay_grace,
            request.run_at,
            request.delay,
            request.webhook_url,
            request.traceparent,
            request.tracestate,
        )

    async def attach(self, job_id: str, url: str) -> None:
        """Give an admitted (unique) job's unfinished row the URL, unless it has one."""
        await self._execute("attach_webhook", job_id, url)
