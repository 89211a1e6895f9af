"""Unique jobs: which submissions of a type count as the same job, and for how long.

``@app.job(unique_for=3600, unique_by=("args", "tenant"))`` (or the same
options on one submission) makes a second submission of the type with the
same key, while a job with that key is in one of ``unique_states`` and was
created less than ``unique_for`` seconds ago, return that job instead of a
new one -- whoever submits it: a ``Client``, ``coldbrew submit``,
``POST /jobs``, or a raw AMQP producer (the worker applies the rule when it
creates the row). The semantics follow Oban's unique jobs:

- **key**: a SHA-256 of the type and the chosen parts (``unique_by``): the
  args as canonical JSON (sorted keys, no spaces; ``unique_keys`` narrows them
  to some top-level keys), the tenant, the lane (``queue``).
- **window**: a *period* from the existing job's creation (Oban's ``period``),
  not a time bucket: two submissions one second apart across a bucket edge
  would both run, which is the surprise a window is there to prevent. A
  duplicate does not extend the window. ``"infinity"`` never expires.
- **states**: the existing job's statuses in which a submission is a
  duplicate; by default every status but ``failed``, ``dead`` and
  ``cancelled`` (Oban: all but cancelled and discarded), so a job that
  succeeded within the window is not run again, and one that failed may be.

This module is pure: the store keeps the key's holder (``job_unique``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from coldbrew.durations import parse_duration

KNOWN_STATES = (
    "queued",
    "running",
    "retrying",
    "succeeded",
    "failed",
    "dead",
    "cancelled",
    "scheduled",
)
"""Every job status (``model.Status``; tests/unit/test_unique.py keeps them equal)."""
DEFAULT_STATES = tuple(s for s in KNOWN_STATES if s not in ("failed", "dead", "cancelled"))
PARTS = ("args", "tenant", "queue")
"""What ``unique_by`` may name; the type is always part of the key."""
DEFAULT_BY = ("args", "tenant")
INFINITY = "infinity"
MAX_PERIOD_SECONDS = 10 * 365 * 86400.0
"""Longer periods are refused (use ``"infinity"``): PostgreSQL intervals stay exact."""


class UniqueError(ValueError):
    """A unique option is invalid; the message names the option and what it accepts."""


@dataclass(frozen=True, slots=True)
class UniqueOpts:
    """How one job type (or one submission) is unique. ``period`` None: for ever."""

    period: float | None
    by: tuple[str, ...] = DEFAULT_BY
    states: tuple[str, ...] = DEFAULT_STATES
    keys: tuple[str, ...] | None = None

    def key(self, type: str, args: Mapping[str, Any], tenant: str, queue: str) -> str:
        """The key a job with these fields holds; equal keys mean duplicates."""
        parts: dict[str, Any] = {"type": type}
        if "args" in self.by:
            chosen = args if self.keys is None else {k: args.get(k) for k in self.keys}
            parts["args"] = chosen
        if "tenant" in self.by:
            parts["tenant"] = tenant
        if "queue" in self.by:
            parts["queue"] = queue
        canonical = json.dumps(
            parts, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


def unique_opts(
    unique_for: object,
    unique_by: object = None,
    unique_states: object = None,
    unique_keys: object = None,
) -> UniqueOpts | None:
    """Check the options as a user gives them; None when ``unique_for`` is None.

    Raises ``UniqueError`` naming the bad option. ``unique_by``, ``unique_states``
    and ``unique_keys`` without ``unique_for`` are refused: they would do nothing.
    """
    if unique_for is None:
        for name, value in (("unique_by", unique_by), ("unique_states", unique_states)):
            if value is not None:
                raise UniqueError(f"{name} needs unique_for (the window) to be set")
        if unique_keys is not None:
            raise UniqueError("unique_keys needs unique_for (the window) to be set")
        return None
    by = _names("unique_by", unique_by, PARTS) if unique_by is not None else DEFAULT_BY
    states = (
        _names("unique_states", unique_states, KNOWN_STATES)
        if unique_states is not None
        else DEFAULT_STATES
    )
    keys = None
    if unique_keys is not None:
        if "args" not in by:
            raise UniqueError('unique_keys narrows the args: unique_by must include "args"')
        keys = _strings("unique_keys", unique_keys)
    return UniqueOpts(period=parse_period(unique_for), by=by, states=states, keys=keys)


def parse_period(value: object) -> float | None:
    """``unique_for``: seconds (> 0), a duration text (``"1h"``), or ``"infinity"``."""
    if isinstance(value, str):
        if value.strip().lower() in (INFINITY, "inf"):
            return None
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise UniqueError(f"unique_for: {exc}, or 'infinity'") from None
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise UniqueError(
            f"unique_for must be a number of seconds, a duration like '1h' or 'infinity', "
            f"not {type(value).__name__}"
        )
    else:
        seconds = float(value)
        if math.isinf(seconds) and seconds > 0:
            return None
    if not math.isfinite(seconds) or seconds <= 0:
        raise UniqueError(f"unique_for must be positive, not {value!r}")
    if seconds > MAX_PERIOD_SECONDS:
        raise UniqueError(
            f"unique_for {value!r} is over 10 years; use 'infinity' for a key that never expires"
        )
    return seconds


def _names(option: str, value: object, allowed: tuple[str, ...]) -> tuple[str, ...]:
    names = _strings(option, value)
    unknown = [name for name in names if name not in allowed]
    if unknown:
        raise UniqueError(
            f"{option}: unknown {', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}"
        )
    return tuple(dict.fromkeys(names))  # in order, once each


def _strings(option: str, value: object) -> tuple[str, ...]:
    """A non-empty list of non-empty strings; one string alone, or comma-separated, too."""
    if isinstance(value, str):
        items: Iterable[object] = [part.strip() for part in value.split(",")]
    elif isinstance(value, list | tuple | set | frozenset):
        items = value
    else:
        raise UniqueError(f"{option} must be a list of names, not {type(value).__name__}")
    names = tuple(items)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise UniqueError(f"{option} must name at least one thing, each a non-empty string")
    return tuple(str(n) for n in names)


def merged(
    base: UniqueOpts | None,
    unique_for: object,
    unique_by: object,
    unique_states: object,
    unique_keys: object,
) -> UniqueOpts | None:
    """A submission's options over its type's: what the submission names wins.

    Without ``unique_for`` on the submission, its other options refine the
    type's (an error if the type is not unique).
    """
    if unique_for is None and unique_by is None and unique_states is None and unique_keys is None:
        return base
    if unique_for is None:
        if base is None:
            unique_opts(None, unique_by, unique_states, unique_keys)  # raises: needs unique_for
            return None
        unique_for = INFINITY if base.period is None else base.period
    if base is not None:
        same_by = unique_by is None or _names("unique_by", unique_by, PARTS) == base.by
        unique_keys = base.keys if unique_keys is None and same_by else unique_keys
        unique_by = base.by if unique_by is None else unique_by
        unique_states = base.states if unique_states is None else unique_states
    return unique_opts(unique_for, unique_by, unique_states, unique_keys)
