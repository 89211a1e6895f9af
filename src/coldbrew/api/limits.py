"""What one ``coldbrew api`` process admits: connection timeouts and caps, and waiter slots.

A client that holds a connection costs the process a file descriptor and a
little memory; one that waits on a job (a long poll, an event stream) also
costs a store read every second or so. Both are bounded here, and past a
bound a client is told so at once (503 with ``Retry-After``), never queued
out of sight or left hanging.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import structlog

from coldbrew.api.errors import RETRY_AFTER_SECONDS, ApiError
from coldbrew.settings import Settings

log = structlog.get_logger("coldbrew.api")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The per-connection bounds the HTTP protocol enforces (``api.protocol``)."""

    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 30.0
    keepalive_seconds: int = 5
    max_connections: int = 1000

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        return cls(
            header_timeout_seconds=settings.api_header_timeout_seconds,
            body_timeout_seconds=settings.api_body_timeout_seconds,
            keepalive_seconds=settings.api_keepalive_seconds,
            max_connections=settings.api_max_connections,
        )


class OverloadLog:
    """A warning when a limit refuses someone, at most once per ``interval`` seconds.

    Under a flood every refusal is the same news; one line with the count
    refused since the last line keeps the log readable and cheap.
    """

    def __init__(
        self, event: str, *, interval: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.event, self.interval, self.clock = event, interval, clock
        self.total = 0
        self._unlogged = 0
        self._last: float | None = None

    def refused(self, **context: object) -> None:
        self.total += 1
        self._unlogged += 1
        now = self.clock()
        if self._last is None or now - self._last >= self.interval:
            log.warning(self.event, refused=self._unlogged, refused_total=self.total, **context)
            self._unlogged, self._last = 0, now


class WaiterSlots:
    """At most ``limit`` long polls and event streams at once in this process.

    A waiter over the limit gets 503 with ``Retry-After`` rather than an
    immediate answer without waiting: a client that long-polls in a loop would
    turn such answers into a busy loop of requests, the opposite of relief;
    503 tells it to back off, and the event-stream and long-poll answers stay
    what the client asked for.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the waiter limit must be at least 1")
        self.limit = limit
        self.busy = 0
        self.open: dict[str, int] = {}  # by kind (long_poll, event_stream): the metrics' gauge
        self.overload = OverloadLog("api_waiter_limit_reached")

    def take(self, kind: str) -> WaiterSlot:
        """A slot of ``kind`` (release it, or use it as a context manager); 503 when all
        are taken."""
        if self.busy >= self.limit:
            self.overload.refused(limit=self.limit)
            raise ApiError(
                503,
                "too_many_waiters",
                f"this API process already serves {self.limit} long polls and event "
                f"streams (COLDBREW_API_MAX_WAITERS); retry after {RETRY_AFTER_SECONDS} s",
                headers={"Retry-After": RETRY_AFTER_SECONDS},
            )
        self.busy += 1
        self.open[kind] = self.open.get(kind, 0) + 1
        return WaiterSlot(self, kind)


class WaiterSlot:
    """One taken waiter slot; ``release`` is idempotent, so every exit path may call it."""

    def __init__(self, slots: WaiterSlots, kind: str) -> None:
        self._slots: WaiterSlots | None = slots
        self.kind = kind

    def release(self) -> None:
        if self._slots is not None:
            self._slots.busy -= 1
            self._slots.open[self.kind] -= 1
            self._slots = None

    def __enter__(self) -> WaiterSlot:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
