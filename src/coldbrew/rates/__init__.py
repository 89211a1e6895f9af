"""Fleet-wide rate limits (per tenant, per job type, per key of a job's arguments).

- ``claim.py``: the claim that takes a token of each GCRA bucket (the SQL is in
  store/rates.py, the arithmetic in ratelimit.py).
- ``gate.py``: ``RateGate``, this worker's side -- which limited deliveries may
  try their claim now, and which wait (holding no job slot) for their token.
"""

from __future__ import annotations

from coldbrew.rates.claim import (
    Bucket,
    RateKind,
    RateLimited,
    claim_limited,
    claim_one_token,
    claim_with_tokens,
    record_refusal,
)
from coldbrew.rates.gate import RATE_JITTER, RateGate

__all__ = [
    "RATE_JITTER",
    "Bucket",
    "RateGate",
    "RateKind",
    "RateLimited",
    "claim_limited",
    "claim_one_token",
    "claim_with_tokens",
    "record_refusal",
]
