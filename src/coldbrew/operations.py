"""The operators' inputs, checked once for every front end: the CLI and the dashboard.

``coldbrew tenants set --weight``, ``--max-running``, ``coldbrew dlq replay
--reason-contains`` and the dashboard's forms for the same actions call these
functions, so a value one refuses the other refuses too, with the same
message (it names the CLI flag, which is also the form field's label).
"""

from __future__ import annotations

import math

from coldbrew.errors import ConfigurationError

MAX_WEIGHT = 1000.0
MAX_CAP = 1_000_000
MAX_REASON_TEXT = 200


def check_weight(weight: float) -> float:
    """A tenant's weight: in (0, 1000]."""
    if not 0 < weight <= MAX_WEIGHT:  # also false for nan
        raise ConfigurationError(f"--weight must be in (0, 1000], not {weight:g}")
    return weight


def parse_weight(text: str) -> float:
    """``--weight`` as typed into a form: a number in (0, 1000]."""
    try:
        weight = float(text)
    except ValueError:
        raise ConfigurationError(f"--weight must be a number, not {text!r}") from None
    if math.isnan(weight):
        raise ConfigurationError(f"--weight must be in (0, 1000], not {text!r}")
    return check_weight(weight)


def parse_cap(text: str) -> int | None:
    """``--max-running``: a whole number 0..1,000,000, or ``none`` for no cap."""
    if text.strip().lower() in ("none", "unlimited"):
        return None
    try:
        cap = int(text)
    except ValueError:
        raise ConfigurationError(
            f"--max-running must be a whole number or 'none', not {text!r}"
        ) from None
    if not 0 <= cap <= MAX_CAP:
        raise ConfigurationError(f"--max-running must be in 0..1000000, not {cap}")
    return cap


def check_reason_text(text: str | None) -> str:
    """``dlq replay --reason-contains``: which dead jobs to replay, said by their reason."""
    if text is None or not text.strip():
        raise ConfigurationError("say which dead jobs to replay: --job-id or --reason-contains")
    if len(text) > MAX_REASON_TEXT or "\x00" in text:
        raise ConfigurationError(
            f"--reason-contains must be 1-{MAX_REASON_TEXT} characters without NUL"
        )
    return text


def check_budget(budget: int) -> int:
    """``dlq replay --attempts``: fresh attempts, 1..1000."""
    if not 1 <= budget <= 1000:
        raise ConfigurationError("--attempts must be 1..1000")
    return budget
