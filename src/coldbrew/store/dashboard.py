"""``DashboardStore``: what only the web dashboard reads and writes.

Sessions (hashed tokens, expiry, revocation), the audit log of actions taken
from the dashboard, each job's ended attempts (kept by a trigger, see
migration 0014), the keyset-paged job search, the last hour's chart series,
and the two actions the CLI has no statement for: retrying a *failed* job and
replaying one tenant's dead jobs by reason (``dlq_replay`` spans tenants).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from coldbrew.sql import QUERIES
from coldbrew.store.base import StoreBase


@dataclass(frozen=True, slots=True)
class Session:
    """A live dashboard session: whose (``tenant`` None: every tenant), until when."""

    tenant: str | None
    actor: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: datetime
    actor: str
    tenant: str | None
    action: str
    job_id: str | None
    target: str
    detail: dict[str, Any]
    outcome: str

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> AuditEntry:
        return cls(
            row["id"],
            row["at"],
            row["actor"],
            row["tenant"],
            row["action"],
            row["job_id"],
            row["target"],
            row["detail"],
            row["outcome"],
        )


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt that ended without success: how, with which error, when."""

    attempt: int
    outcome: str
    error_kind: str | None
    error_message: str | None
    started_at: datetime | None
    ended_at: datetime
    worker_id: str | None


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One row of the job search: what the results table shows."""

    id: str
    type: str
    queue: str
    tenant: str
    status: str
    attempt: int
    max_attempts: int
    progress: float | None
    created_at: datetime
    finished_at: datetime | None
    error_kind: str | None
    error_message: str | None
    dead_reason: str | None

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> JobSummary:
        return cls(**{name: row[name] for name in cls.__slots__})


@dataclass(frozen=True, slots=True)
class SearchFilter:
    """The search form, checked (``api.search`` parses it); None: not filtered on."""

    tenant: str | None = None
    status: str | None = None
    type: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    error_text: str | None = None


TRIGRAM = 3
"""The shortest error text the trigram index can look up (pg_trgm's trigrams)."""
RECENT_ROWS = 5000
"""Rows of a scope the error-text search reads newest first before it asks the index."""


def like_escape(text: str) -> str:
    """``text`` as a literal inside a LIKE pattern: backslash, ``%`` and ``_`` escaped."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class DashboardStore(StoreBase):
    """Sessions, audit, attempts, search, charts, and the dashboard-only actions."""

    async def create_session(
        self, token_hash: bytes, tenant: str | None, actor: str, lifetime_seconds: float
    ) -> datetime:
        """Store a new session (and forget long-expired ones); its expiry."""
        await self._execute("session_prune")
        expires: datetime = await self._fetchval(
            "session_create", token_hash, tenant, actor, lifetime_seconds
        )
        return expires

    async def session(self, token_hash: bytes) -> Session | None:
        row = await self._fetchrow("session_get", token_hash)
        if row is None:
            return None
        return Session(row["tenant"], row["actor"], row["created_at"], row["expires_at"])

    async def revoke_session(self, token_hash: bytes) -> bool:
        return bool(await self._fetchval("session_revoke", token_hash))

    async def shared_secret(self, name: str) -> bytes:
        """The namespace's secret ``name`` (32 random bytes), drawn by whichever API replica
        asks first and the same for every replica after it (the CSRF key)."""
        await self._execute("secret_offer", name, secrets.token_bytes(32))
        secret: bytes = await self._fetchval("secret_get", name)
        return secret

    async def record(
        self,
        *,
        actor: str,
        tenant: str | None,
        action: str,
        job_id: str | None,
        target: str,
        detail: dict[str, Any],
        outcome: str,
    ) -> None:
        """Append one action to the audit log."""
        await self._fetchrow(
            "audit_insert",
            actor,
            tenant,
            action,
            job_id,
            target,
            json.loads(json.dumps(detail, default=str)),  # datetimes and the like as text
            outcome,
        )

    async def audit_for_job(self, job_id: str, limit: int = 200) -> list[AuditEntry]:
        return [AuditEntry.from_row(r) for r in await self._fetch("audit_for_job", job_id, limit)]

    async def audit_recent(self, tenant: str | None, limit: int = 100) -> list[AuditEntry]:
        return [AuditEntry.from_row(r) for r in await self._fetch("audit_recent", tenant, limit)]

    async def attempts(self, job_id: str) -> list[Attempt]:
        rows = await self._fetch("job_attempts_of", job_id)
        return [Attempt(**dict(row)) for row in rows]

    async def job_extras(self, job_id: str) -> tuple[Any, str | None]:
        """A job's checkpoint and worker id (the status JSON carries neither)."""
        row = await self._fetchrow("job_page_extras", job_id)
        return (None, None) if row is None else (row["checkpoint"], row["worker_id"])

    async def children(self, parent_id: str, limit: int) -> list[tuple[str, str, str]]:
        """The first ``limit`` children of a job: ``(id, type, status)``, oldest first."""
        rows = await self._fetch("children_page", parent_id, limit)
        return [(row["id"], row["type"], row["status"]) for row in rows]

    async def search(
        self, where: SearchFilter, cursor: tuple[datetime, str] | None, limit: int
    ) -> list[JobSummary]:
        """A page of jobs, newest first, after ``cursor`` (the last row's created_at and id).

        One statement per access path, so each has a plan on its own index: an error text
        of three characters or more, the trigram index (``jobs_search_error``: a rare text
        is found without walking the history; shorter ones have no trigram), else a
        status's (``jobs_search_status``: a status is rarer than a tenant's whole
        history), else a tenant's (``jobs_search_tenant``), else every job's
        (``jobs_search_created``).
        """
        t, st, ty = where.tenant, where.status, where.type
        since, until, text = where.created_from, where.created_to, where.error_text
        at, last = cursor if cursor is not None else (None, "")
        if text is not None and len(text) >= TRIGRAM:
            rows = await self._search_error(where, like_escape(text), at, last, limit)
        elif st is not None:
            rows = await self._fetch(
                "search_jobs_status", t, st, ty, since, until, text, at, last, limit
            )
        elif t is not None:
            rows = await self._fetch(
                "search_jobs_tenant", t, st, ty, since, until, text, at, last, limit
            )
        else:
            rows = await self._fetch(
                "search_jobs_all", t, st, ty, since, until, text, at, last, limit
            )
        return [JobSummary.from_row(row) for row in rows]

    async def _search_error(
        self, where: SearchFilter, pattern: str, at: datetime | None, last: str, limit: int
    ) -> list[asyncpg.Record]:
        """An error-text page in two steps, each planned for its own parameters (custom
        plans: a generic plan cannot tell a rare text from a common one).

        First the newest ``RECENT_ROWS`` rows of the scope (``search_jobs_error_recent``):
        a common text fills the page there, and then that page is the answer (every
        newer row was looked at). Else the trigram index (``search_jobs_error``) finds
        the rare matches wherever they are. The planner alone misjudged a common text
        as rare and fetched and sorted all 40,000 of its matches (216 ms, where the walk
        takes 3: bench/dashboard_search.py)."""
        t, st, ty = where.tenant, where.status, where.type
        since, until = where.created_from, where.created_to

        async def op(conn: asyncpg.Connection) -> list[asyncpg.Record]:
            async with conn.transaction():
                await conn.execute(QUERIES["custom_plans"].text)
                rows: list[asyncpg.Record] = await conn.fetch(
                    QUERIES["search_jobs_error_recent"].text,
                    t,
                    st,
                    ty,
                    since,
                    until,
                    pattern,
                    at,
                    last,
                    limit,
                    RECENT_ROWS,
                )
                if len(rows) >= limit:
                    return rows
                return list(
                    await conn.fetch(
                        QUERIES["search_jobs_error"].text,
                        t,
                        st,
                        ty,
                        since,
                        until,
                        pattern,
                        at,
                        last,
                        limit,
                    )
                )

        return await self._run(op)

    async def retry_job(self, job_id: str, budget: int, tenant: str | None) -> bool:
        """Run a failed or dead job again with ``budget`` fresh attempts; False: it is neither
        (or of another tenant)."""
        return bool(await self._fetchval("retry_job", job_id, budget, tenant))

    async def replay_dead(
        self, reason_contains: str, tenant: str | None, limit: int, budget: int
    ) -> list[str]:
        rows = await self._fetch("replay_dead_of_tenant", reason_contains, tenant, limit, budget)
        return [row["id"] for row in rows]

    async def throughput(self, since: datetime, tenant: str | None) -> list[tuple[str, int, int]]:
        """``(lane, minute index from since, jobs finished)``."""
        rows = await self._fetch("chart_throughput", since, tenant)
        return [(row["queue"], row["minute"], row["count"]) for row in rows]

    async def backlog_edges(
        self, since: datetime, tenant: str | None
    ) -> list[tuple[str, int, int]]:
        """``(lane, minute index from since, change of the waiting count)``."""
        rows = await self._fetch("chart_backlog_edges", since, tenant)
        return [(row["queue"], row["minute"], row["delta"]) for row in rows]
