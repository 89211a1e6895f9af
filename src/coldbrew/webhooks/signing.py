"""The webhook signature: what coldbrew sends and what a receiver checks.

``Coldbrew-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``,
unchanged since the first webhooks: the timestamp is signed with the body, so
a receiver that also checks its age (``verify``'s ``tolerance``) refuses a
replayed delivery.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "Coldbrew-Signature"


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
