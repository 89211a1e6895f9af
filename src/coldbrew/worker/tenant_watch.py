"""Tenant queues: provisioned on first use, announced to the fleet.

A job for a (lane, tenant) pair with no queue yet is unroutable on the jobs
exchange, so its alternate exchange drops it into ``<ns>.unrouted``. Any
worker takes it from there: declares and binds the queue, records the pair in
PostgreSQL with a NOTIFY in the same transaction, and republishes the message,
which now routes. Every worker LISTENs and also re-reads the table
periodically, because NOTIFY is a hint that is lost while disconnected.

The same connection LISTENs on ``<ns>.caps``, where completions name the
capped tenants and types that freed a place (``tenant:x``, ``type:y``), so
a worker holding deliveries of a full cap tries again at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from coldbrew.errors import BrokerUnavailable, ContractViolation, DatabaseUnavailable
from coldbrew.metrics import Metrics
from coldbrew.model import split_routing_key
from coldbrew.store import TENANTS_CHANGED, JobStore, JobTypeSettings, TenantSettings
from coldbrew.topology import Topology
from coldbrew.transport import Broker, Inbound
from coldbrew.worker.service import sleep_unless

log = structlog.get_logger("coldbrew.tenants")

OnQueue = Callable[[str, str], Awaitable[None]]
OnSettings = Callable[[list[TenantSettings], list[JobTypeSettings]], None]
OnReject = Callable[[Inbound, ContractViolation], None]
OnCapFreed = Callable[[str, int], None]
"""Told each ``<ns>.caps`` payload with the PID of the server process that sent it."""


class TenantQueues:
    """Provisions tenant queues and keeps this worker consuming every one of its lanes."""

    name = "tenant-watch"

    def __init__(
        self,
        *,
        resync_seconds: float,
        store: JobStore,
        broker: Broker,
        topology: Topology,
        metrics: Metrics,
        on_queue: OnQueue,
        on_reject: OnReject,
        on_settings: OnSettings | None = None,
        on_cap_freed: OnCapFreed | None = None,
    ) -> None:
        self.resync_seconds = resync_seconds
        self.store = store
        self.broker = broker
        self.topology = topology
        self.metrics = metrics
        self._on_queue = on_queue
        self._on_reject = on_reject
        self._on_settings = on_settings
        self._on_cap_freed = on_cap_freed
        self.cap_listening = False
        """Whether freed cap places are being heard (NOTIFY) right now."""
        self._hinted: asyncio.Queue[str] = asyncio.Queue()
        self._also: dict[str, Callable[[str], None]] = {}

    def also_listen(self, channel: str, callback: Callable[[str], None]) -> None:
        """LISTEN on ``channel`` too, on this service's connection (no connection of its
        own); ``callback`` gets each payload, and ``""`` at every (re)connect, since what
        was sent while the connection was down is lost (the relay's wake, flow)."""
        self._also[channel] = callback

    async def ensure(self, queue: str, tenant: str) -> None:
        """Declare, record and announce one (lane, tenant) queue (idempotent)."""
        await self.broker.declare_job_queue(queue, tenant)
        if await self.store.tenants.add_tenant_queue(queue, tenant, self.topology.tenant_channel):
            self.metrics.tenants_provisioned.inc()
            log.info("tenant_queue_provisioned", queue=queue, tenant=tenant)
        await self._on_queue(queue, tenant)

    async def on_unrouted(self, message: Inbound) -> None:
        """Consumer of ``<ns>.unrouted``: provision the queue, then republish the message."""
        try:
            queue, tenant = split_routing_key(message.routing_key or "")
        except ContractViolation as violation:
            self._on_reject(message, violation)
            return
        try:
            await self.ensure(queue, tenant)
            await self.broker.republish(message, self._routable_key(message, queue, tenant))
        except (BrokerUnavailable, DatabaseUnavailable) as exc:
            log.warning("provision_failed", queue=queue, tenant=tenant, error=str(exc))
            await asyncio.sleep(1.0)
            await message.requeue()
            return
        await message.ack()

    def _routable_key(self, message: Inbound, queue: str, tenant: str) -> str:
        """The key a provisioned message routes with in this layout: its own, except that a
        banded ``<lane>.<tenant>.<priority>`` (quorum's) has no binding in classic mode, where
        it becomes ``<lane>.<tenant>`` (else it would come back here, again and again)."""
        if self.topology.quorum:
            return message.routing_key or ""
        return self.topology.routing_key(queue, tenant, None)

    async def sync(self) -> int:
        """Consume every recorded queue of our lanes and apply tenant settings (the resync)."""
        pairs = await self.store.tenants.list_tenant_queues()
        for queue, tenant in pairs:
            await self._on_queue(queue, tenant)
        await self.sync_settings()
        return 0

    async def sync_settings(self) -> None:
        if self._on_settings is not None:
            tenants = await self.store.tenants.list_tenants()
            self._on_settings(tenants, await self.store.tenants.list_job_types())

    async def run(self, stop: asyncio.Event) -> None:
        """LISTEN for new queues; resync on every (re)connect and every ``resync_seconds``."""
        resync_seconds = self.resync_seconds
        while not stop.is_set():
            try:
                listening = self.store.listen(self.topology.tenant_channel, self._hinted.put_nowait)
                async with listening as conn:
                    if self._on_cap_freed is not None:
                        await conn.add_listener(self.store.caps.cap_channel(), self._cap_freed)
                    for channel, callback in self._also.items():
                        await conn.add_listener(channel, _payload_to(callback))
                        callback("")
                    try:
                        self.cap_listening = self._on_cap_freed is not None
                        await self.sync()
                        await self._follow(stop, resync_seconds, conn.is_closed)
                    finally:
                        self.cap_listening = False
            except (DatabaseUnavailable, BrokerUnavailable, OSError) as exc:
                log.warning("tenant_watch_interrupted", error=str(exc))
                await sleep_unless(stop, min(resync_seconds, 5.0))

    def _cap_freed(self, _conn: Any, pid: int, _channel: str, payload: str) -> None:
        if self._on_cap_freed is not None:
            self._on_cap_freed(payload, pid)

    async def _follow(
        self, stop: asyncio.Event, resync_seconds: float, closed: Callable[[], bool]
    ) -> None:
        loop = asyncio.get_running_loop()
        next_sync = loop.time() + resync_seconds
        while not stop.is_set():
            if closed():
                raise DatabaseUnavailable("the LISTEN connection closed")
            timeout = max(0.0, next_sync - loop.time())
            try:
                payload = await asyncio.wait_for(self._hinted.get(), timeout=min(timeout, 1.0))
            except TimeoutError:
                if loop.time() >= next_sync:
                    await self.sync()
                    next_sync = loop.time() + resync_seconds
                continue
            if payload == TENANTS_CHANGED:
                await self.sync_settings()
                continue
            try:
                queue, tenant = split_routing_key(payload)
            except ContractViolation:
                log.warning("tenant_notify_ignored", payload=payload[:200])
                continue
            await self._on_queue(queue, tenant)


def _payload_to(callback: Callable[[str], None]) -> Callable[[Any, int, str, str], None]:
    def on_notify(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        callback(payload)

    return on_notify
