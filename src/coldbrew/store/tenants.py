"""``TenantStore``: tenant queues and the fleet-wide settings of tenants and job types.

Every change is written and announced (NOTIFY) in one transaction, so the
fleet hears of it exactly when it is visible.
"""

from __future__ import annotations

import asyncpg

from coldbrew.sql import QUERIES
from coldbrew.store.base import StoreBase
from coldbrew.store.records import JobTypeSettings, LaneSettings, TenantSettings

TENANTS_CHANGED = "tenants-changed"
"""NOTIFY payload that says: re-read the tenants table."""


class TenantStore(StoreBase):
    """Provisioned (lane, tenant) queues; tenants', lanes' and job types' settings."""

    async def list_tenant_queues(self) -> list[tuple[str, str]]:
        return [(row["queue"], row["tenant"]) for row in await self._fetch("list_tenant_queues")]

    async def add_tenant_queue(self, queue: str, tenant: str, channel: str) -> bool:
        """Record a provisioned queue and NOTIFY the fleet, in one transaction."""

        async def op(conn: asyncpg.Connection) -> bool:
            async with conn.transaction():
                added = bool(await conn.fetchval(QUERIES["add_tenant_queue"].text, queue, tenant))
                await conn.execute(QUERIES["notify"].text, channel, f"{queue}.{tenant}")
                return added

        return await self._run(op)

    async def list_tenants(self) -> list[TenantSettings]:
        return [TenantSettings.from_row(row) for row in await self._fetch("list_tenants")]

    async def set_tenant(
        self,
        name: str,
        *,
        weight: float | None = None,
        paused: bool | None = None,
        max_running: int | None = None,
        uncap: bool = False,
        channel: str,
    ) -> TenantSettings:
        """Create or change a tenant and tell the fleet (NOTIFY), in one transaction."""

        async def op(conn: asyncpg.Connection) -> TenantSettings:
            async with conn.transaction():
                row = await conn.fetchrow(
                    QUERIES["set_tenant"].text, name, weight, paused, max_running, uncap
                )
                await _notify_settings_changed(conn, channel)
                return TenantSettings.from_row(row)

        return await self._run(op)

    async def set_tenant_webhook(
        self, name: str, url: str | None, *, channel: str
    ) -> TenantSettings:
        """Set (None: remove) the tenant's webhook URL, for its jobs that name none; the
        trigger of migration 0012 reads it when each job ends, so it needs no NOTIFY to
        apply, but the fleet is told as for every tenant setting."""

        async def op(conn: asyncpg.Connection) -> TenantSettings:
            async with conn.transaction():
                row = await conn.fetchrow(QUERIES["set_tenant_webhook"].text, name, url)
                await _notify_settings_changed(conn, channel)
                return TenantSettings.from_row(row)

        return await self._run(op)

    async def list_lanes(self) -> list[LaneSettings]:
        """Every known lane (a state recorded, a type registered on it, or a tenant queue)."""
        return [LaneSettings.from_row(row) for row in await self._fetch("list_lanes")]

    async def set_lane_paused(self, name: str, paused: bool, *, channel: str) -> LaneSettings:
        """Pause or resume a lane fleet-wide and tell the fleet, in one transaction."""

        async def op(conn: asyncpg.Connection) -> LaneSettings:
            async with conn.transaction():
                row = await conn.fetchrow(QUERIES["set_lane_paused"].text, name, paused)
                await _notify_settings_changed(conn, channel)
                return LaneSettings.from_row(row)

        return await self._run(op)

    async def list_job_types(self) -> list[JobTypeSettings]:
        return [JobTypeSettings.from_row(row) for row in await self._fetch("list_job_types")]

    async def set_job_type(
        self, name: str, *, max_running: int | None, channel: str
    ) -> JobTypeSettings:
        """Set (or, with None, remove) a job type's fleet-wide cap and tell the fleet."""

        async def op(conn: asyncpg.Connection) -> JobTypeSettings:
            async with conn.transaction():
                row = await conn.fetchrow(QUERIES["set_job_type"].text, name, max_running)
                await _notify_settings_changed(conn, channel)
                return JobTypeSettings.from_row(row)

        return await self._run(op)

    async def set_tenant_rate(
        self, name: str, *, per_second: float | None, burst: int | None, clear: bool, channel: str
    ) -> TenantSettings:
        """Set a tenant's rate limit (None leaves that part as it is; ``clear`` removes the
        limit) and tell the fleet, in one transaction."""

        async def op(conn: asyncpg.Connection) -> TenantSettings:
            async with conn.transaction():
                row = await conn.fetchrow(
                    QUERIES["set_tenant_rate"].text, name, per_second, burst, clear
                )
                await _notify_settings_changed(conn, channel)
                return TenantSettings.from_row(row)

        return await self._run(op)

    async def set_job_type_rate(
        self, name: str, *, per_second: float | None, burst: int | None, clear: bool, channel: str
    ) -> JobTypeSettings:
        """Set a job type's rate limit (as ``set_tenant_rate``) and tell the fleet."""

        async def op(conn: asyncpg.Connection) -> JobTypeSettings:
            async with conn.transaction():
                row = await conn.fetchrow(
                    QUERIES["set_job_type_rate"].text, name, per_second, burst, clear
                )
                await _notify_settings_changed(conn, channel)
                return JobTypeSettings.from_row(row)

        return await self._run(op)


async def _notify_settings_changed(conn: asyncpg.Connection, channel: str) -> None:
    """NOTIFY ``tenants-changed`` (delivered when the caller's transaction commits)."""
    await conn.execute(QUERIES["notify"].text, channel, TENANTS_CHANGED)
