"""Durations as people write them: ``90``, ``90s``, ``15m``, ``1h``, ``7d``, ``1h30m``.

One parser for every flag and setting that takes a length of time, so ``1h``
means the same everywhere; it does no I/O and knows nothing of jobs.
"""

from __future__ import annotations

import math
import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a plain number of seconds or parts like ``1h30m``.

    Raises ``ValueError`` naming the text and the accepted forms; a duration is
    never negative, and zero is allowed (callers that need more say so).
    """
    cleaned = text.strip().lower()
    if _NUMBER_RE.fullmatch(cleaned):
        seconds = float(cleaned)
    else:
        parts = _PART_RE.findall(cleaned)
        if not cleaned or "".join(n + u for n, u in parts) != cleaned:
            raise ValueError(
                f"{text!r} is not a duration: use seconds (90) or units ms/s/m/h/d/w "
                "(90s, 15m, 1h30m, 7d)"
            )
        seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is not a finite duration")
    return seconds
