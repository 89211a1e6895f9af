"""``coldbrew api``: the HTTP API over the job store (DESIGN §1, "HTTP API").

It uses only ``Client`` and the store: it never runs jobs, so it scales and
restarts independently of the workers.
"""

from __future__ import annotations

from coldbrew.api.app import ApiConfig, create_app

__all__ = ["ApiConfig", "create_app"]
