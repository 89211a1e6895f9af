"""Entity tags of a job's status JSON, and ``If-None-Match`` matching (RFC 9110 §13.1.2).

The tag is a hash of the whole status JSON, so any visible change (status,
progress, attempt, result) gives a new tag: that is what long polls and the
event stream wait for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def etag_of(status_json: Mapping[str, Any]) -> str:
    """A strong ETag (quoted) for one rendering of the status JSON."""
    canonical = json.dumps(status_json, sort_keys=True, separators=(",", ":"), default=str)
    return '"' + hashlib.sha256(canonical.encode()).hexdigest()[:32] + '"'


def if_none_match(header: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header matches ``etag`` (weak comparison, as GET uses)."""
    if header is None:
        return False
    header = header.strip()
    if header == "*":
        return True
    wanted = etag.removeprefix("W/")
    return any(part.strip().removeprefix("W/") == wanted for part in header.split(","))
