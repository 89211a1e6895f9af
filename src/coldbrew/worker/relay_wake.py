"""``RelayWake``: LISTEN on ``<ns>.relay`` and wake the relay when a commit made rows due.

A job submitted in the caller's transaction (``submit(connection=)``), the
children written with a parent's outcome, and a chain's next step inserted
by the trigger all have ``publish_after = now()`` and a NOTIFY on this
channel in the same transaction. PostgreSQL delivers it only at commit (a
rollback sends nothing), so the relay publishes them within one pass of the
commit instead of at its next tick. The NOTIFY is a hint: a lost one (the
listening connection was down) costs at most one relay interval.
"""

from __future__ import annotations

import asyncio

import structlog

from coldbrew.errors import DatabaseUnavailable
from coldbrew.store import JobStore
from coldbrew.topology import Topology
from coldbrew.worker.relay import Relay
from coldbrew.worker.service import Backoff, sleep_unless

log = structlog.get_logger("coldbrew.relay")

CHECK_SECONDS = 1.0
"""How often the listening connection is checked for a server-side close."""


class RelayWake:
    """Holds a LISTEN connection; each notification sets the relay's ``woken``."""

    name = "relay-wake"

    def __init__(self, store: JobStore, relay: Relay, topology: Topology) -> None:
        self.store = store
        self.relay = relay
        self.channel = topology.relay_channel
        self.listening = False

    def _notified(self, _payload: str) -> None:
        self.relay.woken.set()

    async def run(self, stop: asyncio.Event) -> None:
        backoff = Backoff(first=0.5, cap=5.0)
        while not stop.is_set():
            try:
                async with self.store.listen(self.channel, self._notified) as conn:
                    self.listening = True
                    backoff.reset()
                    self.relay.woken.set()  # what committed while we were not listening
                    while not stop.is_set() and not conn.is_closed():
                        await sleep_unless(stop, CHECK_SECONDS)
            except (DatabaseUnavailable, OSError) as exc:
                delay = backoff.next_delay()
                log.warning("relay_wake_interrupted", error=str(exc), retry_in=delay)
                await sleep_unless(stop, delay)
            finally:
                self.listening = False
