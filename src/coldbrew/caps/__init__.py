"""Fleet-wide caps (``max_running`` per tenant and per job type), in one package.

- ``gate.py``: ``CapGate``, this worker's side -- which capped deliveries may
  try their claim now, and which wait (holding no job slot) for a wake. No I/O.
- ``decision.py``: what a capped claim's facts mean (busy lock, full cap,
  places left). Pure functions.
- ``claim.py``: ``claim_capped``, the claim itself, walking the statements of
  the store's ``CapStore`` (store/caps.py, the only place with their SQL).
"""

from __future__ import annotations

from coldbrew.caps.claim import claim_capped
from coldbrew.caps.decision import (
    Capped,
    ScopeKind,
    busy_scope,
    counted_scopes,
    full_scope,
    places_left,
)
from coldbrew.caps.gate import CAP_BUSY_RETRY, CAP_RETRY_FIRST, CAP_RETRY_MAX, CapGate, Scope

__all__ = [
    "CAP_BUSY_RETRY",
    "CAP_RETRY_FIRST",
    "CAP_RETRY_MAX",
    "CapGate",
    "Capped",
    "Scope",
    "ScopeKind",
    "busy_scope",
    "claim_capped",
    "counted_scopes",
    "full_scope",
    "places_left",
]
