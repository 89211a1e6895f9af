"""``TypeRegistry``: the job types workers' apps register, for submitters without the app.

A worker writes its app's types at start-up (``register``); a producer that
has no app (``coldbrew submit``, ``Client.submit`` without ``app=``, ``POST
/jobs``) reads a type's lane and defaults here (``get``), so the job runs on
the lane its ``@app.job(queue=...)`` declares instead of ``default``. The
newest registration of a type wins; ``register`` returns what it overwrote
when another worker's app said otherwise, for the worker to warn about.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from coldbrew.store.base import StoreBase


@dataclass(frozen=True, slots=True)
class RegisteredType:
    """One job type as the fleet registered it (``model.Registered``: its defaults)."""

    name: str
    queue: str
    max_attempts: int | None
    timeout: float | None
    is_process: bool
    worker_id: str
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> RegisteredType:
        return cls(
            row["name"],
            row["queue"],
            row["max_attempts"],
            row["timeout_seconds"],
            row["is_process"],
            row["worker_id"],
            row["updated_at"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "queue": self.queue,
            "max_attempts": self.max_attempts,
            "timeout_seconds": self.timeout,
            "is_process": self.is_process,
            "worker_id": self.worker_id,
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class TypeRegistration:
    """What a worker registers for one job type of its app."""

    name: str
    queue: str
    max_attempts: int | None
    timeout: float | None
    is_process: bool


class TypeRegistry(StoreBase):
    """The ``registered_types`` table: written by workers, read by submitters."""

    async def register(
        self, types: Sequence[TypeRegistration], worker_id: str
    ) -> list[RegisteredType]:
        """Record ``types`` as this worker's; return the registrations by other workers
        that they replaced and that disagreed (lane, attempts, timeout or pool)."""
        rows = await self._fetch(
            "register_types",
            [t.name for t in types],
            [t.queue for t in types],
            [t.max_attempts for t in types],
            [t.timeout for t in types],
            [t.is_process for t in types],
            worker_id,
        )
        return [RegisteredType.from_row(row) for row in rows]

    async def get(self, name: str) -> RegisteredType | None:
        row = await self._fetchrow("registered_type", name)
        return None if row is None else RegisteredType.from_row(row)

    async def list_all(self) -> list[RegisteredType]:
        return [RegisteredType.from_row(row) for row in await self._fetch("list_registered_types")]
