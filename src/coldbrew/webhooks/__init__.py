"""Durable webhooks: a delivery is a job of the built-in type ``coldbrew.webhook``.

PostgreSQL enqueues it with the outcome (migration 0012's trigger), every worker
runs it (``WebhookSender.register``, added to the worker's copy of its app), and
it is signed (``signing``), guarded against SSRF (``coldbrew.urlguard``), retried
with the normal backoff, dead-lettered when it keeps failing, and visible like
any job.
"""

from __future__ import annotations

from coldbrew.webhooks.delivery import WEBHOOK_TYPE, WebhookConfig, WebhookSender
from coldbrew.webhooks.signing import SIGNATURE_HEADER, sign, verify

__all__ = ["SIGNATURE_HEADER", "WEBHOOK_TYPE", "WebhookConfig", "WebhookSender", "sign", "verify"]
