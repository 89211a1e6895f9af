"""Durations and instants as people and producers write them: ``90s``, ``15m``, ISO 8601.

One parser for every place coldbrew reads a length of time from a human
(``coldbrew submit --delay 90s``, retention settings, rate windows) and one
for instants (``--at``, ``run_at`` over HTTP, the ``x-run-at`` header), so
that they agree on what they accept and say the same thing when they refuse.
Pure: no clock is read here; the caller passes ``now`` where one is needed.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

__all__ = [
    "MAX_SCHEDULE_SECONDS",
    "DurationError",
    "parse_duration",
    "parse_instant",
    "seconds_of",
]

MAX_SCHEDULE_SECONDS = 10 * 366 * 86400.0
"""The farthest ahead a job may be scheduled or snoozed (about ten years): further is
almost always a unit mistake (milliseconds given as seconds), refused rather than kept."""

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


class DurationError(ValueError):
    """A duration or instant that cannot be read; the message says what is accepted."""


def parse_duration(text: str) -> float:
    """``"90s"``, ``"15m"``, ``"2h"``, ``"1d"``, ``"1h30m"``, ``"250ms"`` or plain seconds
    (``"90"``, ``"1.5"``) → seconds, a finite number ≥ 0."""
    if not isinstance(text, str):
        raise DurationError(f"a duration must be text like 90s, 15m, 2h or 1d, not {text!r}")
    cleaned = text.strip().lower()
    try:
        plain: float | None = float(cleaned)
    except ValueError:
        plain = None
    if plain is not None:
        return _check_seconds(plain, f"duration {text!r}")
    if not cleaned or _DURATION_RE.sub("", cleaned):
        raise DurationError(
            f"{text!r} is not a duration: write a number of seconds or a number with a unit "
            "(ms, s, m, h, d, w), e.g. 90s, 15m, 2h, 1d or 1h30m"
        )
    total = sum(float(n) * _UNITS[unit] for n, unit in _DURATION_RE.findall(cleaned))
    return _check_seconds(total, f"duration {text!r}")


def seconds_of(value: object, what: str = "delay") -> float:
    """A delay given as seconds (int or float) or a ``timedelta`` → finite seconds ≥ 0."""
    if isinstance(value, timedelta):
        return _check_seconds(value.total_seconds(), what)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DurationError(f"{what} must be a number of seconds or a timedelta, not {value!r}")
    return _check_seconds(float(value), what)


def parse_instant(text: str) -> datetime:
    """An ISO 8601 instant with its UTC offset (``2026-12-01T20:00:00Z``,
    ``...+01:00``) → an aware datetime; a time without an offset is refused, since
    it would mean a different instant on every machine."""
    if not isinstance(text, str) or not text.strip():
        raise DurationError(f"{text!r} is not an ISO 8601 time")
    cleaned = text.strip()
    if cleaned[-1:] in ("z", "Z"):
        cleaned = cleaned[:-1] + "+00:00"
    if cleaned[10:11] == "t":  # RFC 3339 allows a lower-case separator
        cleaned = cleaned[:10] + "T" + cleaned[11:]
    try:
        moment = datetime.fromisoformat(cleaned)
    except ValueError:
        raise DurationError(
            f"{text!r} is not an ISO 8601 time (e.g. 2026-12-01T20:00:00Z)"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise DurationError(
            f"{text!r} has no UTC offset: add Z or +HH:MM (a naive time is a different "
            "instant on every machine)"
        )
    return moment


def _check_seconds(seconds: float, what: str) -> float:
    if not math.isfinite(seconds) or seconds < 0:
        raise DurationError(f"{what} must be a finite number of seconds >= 0, not {seconds!r}")
    return seconds
