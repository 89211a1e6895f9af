"""What the dashboard shows, gathered for one principal: lanes, tenants, dead jobs, rejections,
and the live workers.

Every read is scoped to the caller's tenant in SQL (or, for the small tenants
table, filtered right after the read), so another tenant's rows never reach
the renderer. Workers serve every tenant: a tenant's key sees which are alive,
but not how many jobs each runs (that would tell it the other tenants' load).
The drain rate is the change of the finished-jobs counters between dashboard
loads (``stats.DrainRates``), so it appears from the second load on, as with
``coldbrew stats --sample``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from coldbrew.api.auth import Principal
from coldbrew.model import JobRecord
from coldbrew.stats import DrainRates
from coldbrew.store import JobStore, LaneSettings, QueueStats, TenantSettings, WorkerRow

RECENT_DEAD_LIMIT = 20
ERROR_TEXT_LIMIT = 300


@dataclass(frozen=True, slots=True)
class Lane:
    """One (lane, tenant) row: counts, oldest waiting age, drain rate, estimated wait."""

    stats: QueueStats
    drain_rate: float | None  # jobs/s; None until two loads have been seen
    estimated_wait: float | None  # seconds; inf when waiting jobs do not drain

    @property
    def depth(self) -> int:
        return self.stats.queued + self.stats.retrying

    def to_json(self) -> dict[str, Any]:
        wait = self.estimated_wait
        return asdict(self.stats) | {
            "depth": self.depth,
            "drain_rate_per_second": self.drain_rate,
            "estimated_wait_seconds": None if wait is None or math.isinf(wait) else wait,
        }


@dataclass(frozen=True, slots=True)
class DeadJob:
    id: str
    type: str
    queue: str
    tenant: str
    reason: str
    error: str
    attempt: int
    max_attempts: int
    finished_at: datetime | None

    @classmethod
    def of(cls, job: JobRecord) -> DeadJob:
        error = f"{job.error_kind}: {job.error_message or ''}" if job.error_kind else ""
        return cls(
            job.id,
            job.type,
            job.queue,
            job.tenant,
            job.dead_reason or "",
            error[:ERROR_TEXT_LIMIT],
            job.attempt,
            job.max_attempts,
            job.finished_at,
        )

    def to_json(self) -> dict[str, Any]:
        finished = None if self.finished_at is None else self.finished_at.isoformat()
        return asdict(self) | {"finished_at": finished}


@dataclass(frozen=True, slots=True)
class Overview:
    """One dashboard load; ``tenant`` is the caller's, or None when every tenant is shown."""

    tenant: str | None
    generated_at: datetime
    lanes: list[Lane]
    tenants: list[TenantSettings]
    dead_jobs: list[DeadJob]
    rejected: dict[str, int]
    workers: list[WorkerRow] = field(default_factory=list)
    """The live workers (a session holds their liveness lock), oldest first."""
    lane_states: list[LaneSettings] = field(default_factory=list)
    """The known lanes and whether each is paused (every lane for every-tenant access; for
    a key, the lanes of its rows and the paused ones: why its jobs wait)."""

    @property
    def shows_load(self) -> bool:
        """Whether each worker's jobs in flight are shown (only to a principal of every tenant)."""
        return self.tenant is None

    def workers_json(self) -> list[dict[str, Any]]:
        hidden = () if self.shows_load else ("jobs_in_flight",)
        return [
            {k: v for k, v in worker.to_json().items() if k not in hidden}
            for worker in self.workers
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "generated_at": self.generated_at.isoformat(),
            "lanes": [lane.to_json() for lane in self.lanes],
            "tenants": [
                {
                    "name": t.name,
                    "weight": t.weight,
                    "paused": t.paused,
                    "max_running": t.max_running,
                }
                for t in self.tenants
            ],
            "dead_jobs": [job.to_json() for job in self.dead_jobs],
            "rejected": self.rejected,
            "workers": self.workers_json(),
            "paused_lanes": [lane.name for lane in self.lane_states if lane.paused],
        }


async def collect(
    store: JobStore,
    principal: Principal,
    rates: DrainRates,
    *,
    dead_limit: int = RECENT_DEAD_LIMIT,
) -> Overview:
    """Read everything the principal may see, and fold this load into the drain rates."""
    tenant = principal.tenant
    rows = await store.stats.queue_stats(tenant)
    now = time.monotonic()
    lanes = []
    for row in rows:
        key = (row.queue, row.tenant)
        rates.observe(key, row.finished, now)
        rate = rates.rates.get(key)
        depth = row.queued + row.retrying
        wait = None if rate is None else rates.estimated_wait(key, depth)
        lanes.append(Lane(row, rate, wait))
    tenants = [t for t in await store.tenants.list_tenants() if principal.may_see(t.name)]
    dead = [DeadJob.of(job) for job in await store.dead.recent_dead(tenant, dead_limit)]
    rejected = await store.dead.rejected_counts(tenant)
    workers = [worker for worker in await store.liveness.list_workers() if worker.alive]
    own = {row.queue for row in rows}
    known = await store.tenants.list_lanes()
    unrecorded = own - {lane.name for lane in known}  # jobs wait there, no worker came yet
    known += [LaneSettings(name, paused=False, changed_at=None) for name in unrecorded]
    lane_states = sorted(
        (lane for lane in known if tenant is None or lane.paused or lane.name in own),
        key=lambda lane: lane.name,
    )
    return Overview(tenant, datetime.now(UTC), lanes, tenants, dead, rejected, workers, lane_states)
