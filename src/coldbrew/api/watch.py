"""Following a job's status JSON by polling the store: long polls and event streams.

Polling (a primary-key read, backing off from 50 ms to 1 s) rather than a
``NOTIFY`` keeps the worker's per-job hot path free of extra work; the cost
falls on the API, only while someone is watching.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from coldbrew.api.etag import etag_of
from coldbrew.model import JobRecord

MIN_DELAY = 0.05
MAX_DELAY = 1.0

Fetch = Callable[[], Awaitable[JobRecord]]
Gone = Callable[[], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One reading of a job: its record, status JSON and ETag."""

    record: JobRecord
    status: dict[str, Any]
    etag: str

    @classmethod
    def of(cls, record: JobRecord) -> Snapshot:
        status = record.to_status_json()
        return cls(record, status, etag_of(status))

    @property
    def terminal(self) -> bool:
        return self.record.status.terminal


class Backoff:
    """Poll delays: start short (a change right after a request is common), double to a cap."""

    def __init__(self, low: float = MIN_DELAY, high: float = MAX_DELAY) -> None:
        self.low, self.high, self._next = low, high, low

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.high)
        return delay

    def reset(self) -> None:
        self._next = self.low


async def wait_for_change(
    fetch: Fetch, seen: Snapshot, *, timeout: float, gone: Gone | None = None
) -> Snapshot:
    """The first snapshot whose ETag differs from ``seen``, or the latest one at the deadline.

    Returns at once for a terminal job (it will not change), and early when
    ``gone`` says the client has left.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    backoff = Backoff()
    current = seen
    while not current.terminal:
        left = deadline - loop.time()
        if left <= 0 or (gone is not None and await gone()):
            break
        await asyncio.sleep(min(backoff.next(), left))
        current = Snapshot.of(await fetch())
        if current.etag != seen.etag:
            break
    return current


async def follow(
    fetch: Fetch,
    *,
    last_etag: str | None = None,
    gone: Gone | None = None,
    keepalive: float = 15.0,
) -> AsyncIterator[Snapshot | None]:
    """Each new snapshot of the job until it is terminal; ``None`` when idle for ``keepalive`` s.

    ``last_etag`` (an event stream's ``Last-Event-ID``) skips a state the
    client already has after a reconnect.
    """
    loop = asyncio.get_running_loop()
    backoff = Backoff()
    quiet_since = loop.time()
    while True:
        current = Snapshot.of(await fetch())
        if current.etag != last_etag:
            last_etag = current.etag
            quiet_since = loop.time()
            backoff.reset()
            yield current
        elif loop.time() - quiet_since >= keepalive:
            quiet_since = loop.time()
            yield None
        if current.terminal or (gone is not None and await gone()):
            return
        await asyncio.sleep(backoff.next())
