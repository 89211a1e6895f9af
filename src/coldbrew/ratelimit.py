"""Rate limits, the pure part: parsing ``N/s``, the default burst, the GCRA arithmetic.

A rate limit is enforced as GCRA (the generic cell rate algorithm, as in
redis-cell or the ``throttled`` library): a bucket keeps one time, its
*theoretical arrival time* (TAT), and a job may start at ``now`` when
``TAT - now <= tau``, where the emission interval is ``T = 1 / rate`` and the
tolerance ``tau = (burst - 1) * T``; a start moves the TAT to
``max(TAT, now) + T``. So in any window of ``w`` seconds at most
``burst + w * rate`` jobs start, and a refused start learns exactly when the
next token is due (``TAT - tau``), which is how long its delivery waits.

The state lives in PostgreSQL (``rate_buckets``); here it is expressed as the
bucket's *backlog*, ``max(TAT - now, 0)`` in seconds, so that the arithmetic
does not depend on any clock but the database's. No I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coldbrew.errors import ConfigurationError, ContractViolation

__all__ = [
    "MAX_RATE",
    "Grant",
    "Rate",
    "RateKey",
    "default_burst",
    "format_rate",
    "gcra",
    "gcra_all",
    "parse_rate",
    "rate_key_value",
]

MAX_RATE = 100_000.0
"""The largest rate accepted (per second): one bucket row cannot go much faster."""
MAX_BURST = 100_000
MAX_KEY_CHARS = 200
"""A per-key limit's key value longer than this is refused (dead-lettered)."""
EPSILON = 1e-9
"""Float slack when comparing a backlog with the tolerance (seconds)."""

RateKey = str | Callable[[Mapping[str, Any]], Any]
"""``rate_key=``: the name of an argument, or a function of the job's arguments."""

_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*/\s*([a-z]+)\s*$")


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate limit: ``per_second`` starts per second, at most ``burst`` at once."""

    per_second: float
    burst: int

    @property
    def interval(self) -> float:
        """GCRA's emission interval ``T``: seconds between two starts at the steady rate."""
        return 1.0 / self.per_second

    def __str__(self) -> str:
        return f"{format_rate(self.per_second)} burst {self.burst}"


def default_burst(per_second: float) -> int:
    """A tenth of a second's worth of the rate, at least 1 (50/s: 5; 10/s or slower: 1).

    Enough to absorb a claim that comes a few milliseconds late (else the
    steady rate would lose that time for good), small enough that a burst
    stays a blip beside the steady rate."""
    return max(1, math.ceil(per_second / 10 - EPSILON))


def parse_rate(text: str, burst: int | None = None, *, what: str = "rate") -> Rate:
    """``N/s``, ``N/min`` or ``N/h`` (N a positive number, fractions allowed: ``0.5/s``),
    with ``burst`` (None: ``default_burst``). Raises ``ConfigurationError`` naming ``what``."""
    match = _RATE_RE.match(text.lower())
    if match is None or match.group(2) not in _UNITS:
        raise ConfigurationError(
            f"{what} must look like 10/s, 600/min or 2.5/h (a positive number per s, min or h),"
            f" not {text!r}"
        )
    per_second = float(match.group(1)) / _UNITS[match.group(2)]
    if not 0 < per_second <= MAX_RATE:
        raise ConfigurationError(f"{what} must be above 0 and at most {MAX_RATE:g}/s, not {text!r}")
    if burst is None:
        burst = default_burst(per_second)
    elif isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= MAX_BURST:
        raise ConfigurationError(f"burst must be a whole number in 1..{MAX_BURST}, not {burst!r}")
    return Rate(per_second, burst)


def format_rate(per_second: float) -> str:
    """The rate in the unit that reads best: ``50/s``, ``30/min``, ``2/h``."""
    if per_second >= 1:
        return f"{per_second:g}/s"
    if per_second * 60 >= 1:
        return f"{per_second * 60:g}/min"
    return f"{per_second * 3600:g}/h"


@dataclass(frozen=True, slots=True)
class Grant:
    """GCRA's answer for one bucket: whether a start conforms, the backlog to store if it
    starts, and (refused) how long until the next token is due."""

    allowed: bool
    backlog: float
    wait: float


def gcra(backlog: float, rate: Rate) -> Grant:
    """One bucket: ``backlog`` is ``max(TAT - now, 0)`` in seconds."""
    backlog = max(backlog, 0.0)
    tau = rate.interval * (rate.burst - 1)
    if backlog <= tau + EPSILON:
        return Grant(True, backlog + rate.interval, 0.0)
    return Grant(False, backlog, backlog - tau)


def gcra_all(backlogs: Sequence[float], rates: Sequence[Rate]) -> tuple[list[Grant], int | None]:
    """Several buckets, all or nothing: every bucket's grant, and the index of the
    refusing bucket whose token is due last (None: every bucket grants). Its ``wait``
    is the one that satisfies every bucket."""
    grants = [gcra(b, r) for b, r in zip(backlogs, rates, strict=True)]
    worst: int | None = None
    for i, grant in enumerate(grants):
        if not grant.allowed and (worst is None or grant.wait > grants[worst].wait):
            worst = i
    return grants, worst


def rate_key_value(job_type: str, rate_key: RateKey | None, args: Mapping[str, Any]) -> str:
    """The bucket a per-key limited job counts in: its type, then the key's value.

    Raises ``ContractViolation("rate_key", ...)`` when the key cannot be read
    from the arguments (missing, None, not a scalar, a function that fails, too long):
    such a delivery is dead-lettered with that reason, it cannot crash a worker."""
    if rate_key is None:
        return job_type
    try:
        value = args.get(rate_key) if isinstance(rate_key, str) else rate_key(args)
    except Exception as exc:  # noqa: BLE001 - the app's key function failed on this job's args
        raise ContractViolation(
            "rate_key", f"job {job_type!r}: the rate_key function failed: {exc!r}"
        ) from None
    if value is None or isinstance(value, bool) or not isinstance(value, str | int | float):
        what = f"argument {rate_key!r}" if isinstance(rate_key, str) else "the rate_key function"
        raise ContractViolation(
            "rate_key",
            f"job {job_type!r}: {what} must give a string or a number, not {value!r}",
        )
    text = str(value)
    if len(text) > MAX_KEY_CHARS:
        raise ContractViolation(
            "rate_key", f"job {job_type!r}: the rate key is longer than {MAX_KEY_CHARS} characters"
        )
    return f"{job_type}:{text}"
