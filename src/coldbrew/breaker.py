"""Circuit breakers per named dependency (``ctx.breaker("storage")``).

After ``failure_threshold`` consecutive failures a breaker opens: calls fail at
once with ``BreakerOpen`` (a ``Retry`` whose delay is the time left until a
probe) without touching the dependency. After ``reset_seconds`` one call is let
through as a probe; its success closes the breaker, its failure opens it
again. Breakers live per worker process; the clock is injected for tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Literal

from coldbrew.errors import Retry

State = Literal["closed", "half_open", "open"]


class BreakerOpen(Retry):
    """The dependency's breaker is open: retry after ``delay`` seconds."""


class CircuitBreaker:
    """Counts consecutive failures of one dependency; use as ``async with breaker:``."""

    def __init__(
        self,
        name: str,
        *,
        failure_threshold: int = 5,
        reset_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_state: Callable[[str, State], None] | None = None,
    ) -> None:
        if failure_threshold < 1 or reset_seconds <= 0:
            raise ValueError("failure_threshold must be >= 1 and reset_seconds > 0")
        self.name = name
        self.failure_threshold = failure_threshold
        self.reset_seconds = reset_seconds
        self._clock = clock
        self._on_state = on_state
        self.state: State = "closed"
        self.failures = 0
        self._opened_at = 0.0
        self._probing = False

    def _set(self, state: State) -> None:
        if state != self.state:
            self.state = state
            if self._on_state is not None:
                self._on_state(self.name, state)

    def before_call(self) -> None:
        """Raise ``BreakerOpen`` unless a call may go through now."""
        if self.state == "closed":
            return
        remaining = self._opened_at + self.reset_seconds - self._clock()
        if self.state == "open" and remaining <= 0:
            self._set("half_open")
        if self.state == "half_open" and not self._probing:
            self._probing = True
            return
        raise BreakerOpen(
            f"circuit breaker {self.name!r} is open after {self.failures} failures",
            delay=max(remaining, 0.0) or self.reset_seconds,
        )

    def record_success(self) -> None:
        self.failures = 0
        self._probing = False
        self._set("closed")

    def record_failure(self) -> None:
        self.failures += 1
        self._probing = False
        if self.state == "half_open" or self.failures >= self.failure_threshold:
            self._opened_at = self._clock()
            self._set("open")

    async def __aenter__(self) -> CircuitBreaker:
        self.before_call()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.record_success()
        elif isinstance(exc, Exception) and not isinstance(exc, BreakerOpen):
            self.record_failure()
        else:  # cancelled mid-call: neither a success nor the dependency's failure
            self._probing = False


class Breakers:
    """The breakers of one worker, created on first use with shared defaults."""

    def __init__(
        self,
        *,
        failure_threshold: int = 5,
        reset_seconds: float = 30.0,
        on_state: Callable[[str, State], None] | None = None,
    ) -> None:
        self._defaults = (failure_threshold, reset_seconds)
        self._on_state = on_state
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, name: str) -> CircuitBreaker:
        breaker = self._breakers.get(name)
        if breaker is None:
            threshold, reset = self._defaults
            breaker = CircuitBreaker(
                name, failure_threshold=threshold, reset_seconds=reset, on_state=self._on_state
            )
            self._breakers[name] = breaker
        return breaker
