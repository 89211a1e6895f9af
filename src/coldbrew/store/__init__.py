"""The job store: the only code that talks to PostgreSQL.

``JobStore.open(...)`` opens one pool; the stores over it are grouped by
concern, each with one method per named query in ``sql/queries.sql``:

- ``store.jobs`` (jobs.py): submissions, reads, cancels, an attempt's fenced writes;
- ``store.outbox`` (outbox.py): due publishes, for the relay;
- ``store.claims`` (claims.py): claims and outcomes through group commit, durability;
- ``store.leases`` (leases.py): heartbeats, progress, releases, expired leases;
- ``store.caps`` (caps.py): the capped claim's statements, cap NOTIFYs;
- ``store.tenants`` (tenants.py): tenant queues, tenant and job-type settings;
- ``store.dead`` (dead.py): dead jobs and rejected messages;
- ``store.stats`` (stats.py): counts per lane and tenant;
- ``store.rollup`` (rollup.py): the per-minute rollup of finished jobs (``stats --since``);
- ``store.cron`` (cron.py): cron schedules and the transaction that fires their ticks.
- ``store.types`` (types.py): the job types workers' apps registered (lanes for submitters).
- ``store.batches`` (batches.py): batches, their members' counts, cancels, added members.

``base.py`` holds the pool, the batch connections and the one place where
driver errors are translated (``DatabaseUnavailable``); ``records.py`` the
values that go in and out; ``schema.py`` the statements of ``coldbrew migrate``.
"""

from __future__ import annotations

from coldbrew.store.base import (
    CONNECTION_ERRORS,
    GATHER_TURNS,
    KEYED_BATCH_PLANS,
    Database,
    connection_settings,
)
from coldbrew.store.batches import BatchRows
from coldbrew.store.caps import CapClaim, CapStore
from coldbrew.store.claims import ClaimConfig, ClaimStore
from coldbrew.store.cron import (
    CronDeclared,
    CronDefinition,
    CronListed,
    CronRow,
    CronStore,
    Watermark,
)
from coldbrew.store.dashboard import (
    Attempt,
    AuditEntry,
    DashboardStore,
    JobSummary,
    SearchFilter,
    Session,
)
from coldbrew.store.dead import DeadLetterStore
from coldbrew.store.flow import ChainRecord, FlowStore
from coldbrew.store.history import JOB_TABLES, HistoryStore, PrunedBatch
from coldbrew.store.jobs import JobRows
from coldbrew.store.jobstore import JobStore
from coldbrew.store.leases import LeaseStore
from coldbrew.store.liveness import LivenessStore, WorkerBeat, WorkerInfo, WorkerLock, WorkerRow
from coldbrew.store.outbox import Outbox
from coldbrew.store.reconcile import (
    LookRecord,
    QueueLook,
    ReconcilePass,
    ReconcileStore,
    WaitingCount,
)
from coldbrew.store.records import (
    CapLocks,
    CapRoom,
    ClaimRequest,
    ClaimResult,
    CommitMark,
    DuePublish,
    JobTypeSettings,
    LaneSettings,
    Outcome,
    QueueStats,
    RawJSON,
    TenantSettings,
)
from coldbrew.store.rollup import FoldStep, RollupStore
from coldbrew.store.stats import FinishedStats, StatsStore
from coldbrew.store.tenants import TENANTS_CHANGED, TenantStore
from coldbrew.store.types import RegisteredType, TypeRegistration, TypeRegistry
from coldbrew.store.unique import Admission, UniqueKey, UniqueRows

__all__ = [
    "CONNECTION_ERRORS",
    "GATHER_TURNS",
    "JOB_TABLES",
    "KEYED_BATCH_PLANS",
    "TENANTS_CHANGED",
    "Admission",
    "Attempt",
    "AuditEntry",
    "BatchRows",
    "CapClaim",
    "CapLocks",
    "CapRoom",
    "CapStore",
    "ChainRecord",
    "ClaimConfig",
    "ClaimRequest",
    "ClaimResult",
    "ClaimStore",
    "CommitMark",
    "CronDeclared",
    "CronDefinition",
    "CronListed",
    "CronRow",
    "CronStore",
    "DashboardStore",
    "Database",
    "DeadLetterStore",
    "DuePublish",
    "FinishedStats",
    "FlowStore",
    "FoldStep",
    "HistoryStore",
    "JobRows",
    "JobStore",
    "JobSummary",
    "JobTypeSettings",
    "LaneSettings",
    "LeaseStore",
    "LivenessStore",
    "LookRecord",
    "Outbox",
    "Outcome",
    "PrunedBatch",
    "QueueLook",
    "QueueStats",
    "RawJSON",
    "ReconcilePass",
    "ReconcileStore",
    "RegisteredType",
    "RollupStore",
    "SearchFilter",
    "Session",
    "StatsStore",
    "TenantSettings",
    "TenantStore",
    "TypeRegistration",
    "TypeRegistry",
    "UniqueKey",
    "UniqueRows",
    "WaitingCount",
    "Watermark",
    "WorkerBeat",
    "WorkerInfo",
    "WorkerLock",
    "WorkerRow",
    "connection_settings",
]
