"""The database probe: is PostgreSQL reachable, for the readiness probe.

Jobs and loops report outages as they meet them; this service also notices
one while the worker is idle, and notices the end of one.
"""

from __future__ import annotations

import asyncio

from coldbrew.errors import DatabaseUnavailable
from coldbrew.store import JobStore
from coldbrew.worker.lifecycle import Lifecycle
from coldbrew.worker.service import sleep_unless

PING_SECONDS = 5.0


class DatabaseHealth:
    """Pings PostgreSQL every ``PING_SECONDS`` and records the answer in the lifecycle."""

    name = "db-health"

    def __init__(self, store: JobStore, lifecycle: Lifecycle) -> None:
        self.store = store
        self.lifecycle = lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                node = await self.store.ping()
                self.lifecycle.set_database_ok(True)
                self.lifecycle.set_database_node(node)
            except DatabaseUnavailable:
                self.lifecycle.set_database_ok(False)
            await sleep_unless(stop, PING_SECONDS)
