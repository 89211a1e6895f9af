"""Deprecated home of the webhook signature: use ``coldbrew.webhooks``.

Webhooks are no longer delivered by the API process (its in-memory dispatcher
is gone): a delivery is a job, enqueued with the outcome and run by every
worker (``coldbrew.webhooks``). ``sign``, ``verify`` and ``SIGNATURE_HEADER``
stay importable from here for receivers written against the old path.
"""

from __future__ import annotations

from coldbrew.webhooks.signing import SIGNATURE_HEADER, sign, verify

__all__ = ["SIGNATURE_HEADER", "sign", "verify"]
