"""Batches' values: a job description, a batch's callbacks, and a batch's status JSON.

A batch (issue #16, Sidekiq Pro's batches) is a group of member jobs with
callback jobs that run once when the group is done: ``on_complete`` when every
member is terminal, ``on_success`` when every member succeeded, ``on_death``
when a member is dead. The counting happens in PostgreSQL (migration 0011's
trigger); this module only describes and renders. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = [
    "BATCH_ID_RE",
    "CALLBACK_EVENTS",
    "MAX_BATCH_MEMBERS",
    "MAX_DESCRIPTION",
    "BatchRecord",
    "Job",
    "added_member_id",
    "callback_job_id",
    "member_job_id",
]

BATCH_ID_RE = re.compile(r"^[\x21-\x7e]{1,100}$")
"""A batch id: printable ASCII, at most 100 characters (its callbacks' job ids add
``:on_complete``, and a job id has at most 128)."""

MAX_BATCH_MEMBERS = 10_000
"""Most members one ``client.batch`` call inserts (one statement); add more with
``ctx.batch.add`` or several batches."""

MAX_DESCRIPTION = 500
"""Longest batch description, in characters."""

CALLBACK_EVENTS = ("success", "complete", "death")
"""The events a batch calls back on, as in ``on_<event>`` and the callback's job id."""


@dataclass(frozen=True, slots=True)
class Job:
    """A job to submit later: a batch member or a callback (``coldbrew.Job``).

    ``Job("transcode", {"video_id": "v1"}, queue="slow")``. Unset options take
    the type's defaults (its app's ``@app.job``, or what the fleet's workers
    registered) when the batch is created, not when the job runs.
    """

    type: str
    args: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int = 0
    max_attempts: int | None = None
    timeout: float | None = None
    job_id: str | None = None
    """A member's own id; by default ``<batch id>.<index>`` (a callback's is fixed:
    ``<batch id>:on_<event>``)."""

    @classmethod
    def of(cls, value: Job | tuple[str, Mapping[str, Any]] | str) -> Job:
        """A ``Job`` from a ``Job``, a ``(type, args)`` pair or a bare type name."""
        if isinstance(value, Job):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
            return cls(value[0], dict(value[1]))
        raise TypeError(f"a batch job is a coldbrew.Job or a (type, args) pair, not {value!r}")


def member_job_id(batch_id: str, index: int) -> str:
    """The default id of a batch's ``index``-th member (0-based)."""
    return f"{batch_id}.{index}"


def callback_job_id(batch_id: str, event: str) -> str:
    """The one id a batch's callback for ``event`` can have: it is inserted once."""
    return f"{batch_id}:on_{event}"


def added_member_id(adder_id: str, name: str) -> str:
    """The id of a member added by ``ctx.batch.add(..., name=name)`` from job ``adder_id``:
    derived, so a retry of the adding job adds nothing twice."""
    return f"{adder_id}+{name}"


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A batch's row, its members' counts by status and their mean progress."""

    id: str
    tenant: str
    description: str | None
    total: int
    pending: int
    counts: Mapping[str, int]
    """Members by status (every status, 0 where none)."""
    progress: float
    """Mean of the members' progress: a terminal member counts 1, one without progress 0."""
    callbacks: Mapping[str, Mapping[str, Any]]
    """``on_<event>`` → the stored callback (type, args, queue, tenant, ...)."""
    collect_results: bool
    cancel_requested: bool
    created_at: datetime
    finished_at: datetime | None
    fired: Mapping[str, str] = field(default_factory=dict)
    """``on_<event>`` → the status of its callback job, for the callbacks that were enqueued."""
    member_ids: tuple[str, ...] = ()
    """The members' ids, in the order given, on what ``client.batch`` returns (not on reads)."""

    @property
    def status(self) -> str:
        """``running`` until every member is terminal; then ``succeeded`` (all of them did),
        ``cancelled`` (the batch was cancelled) or ``completed`` (some did not succeed)."""
        if self.pending > 0:
            return "running"
        if self.counts.get("succeeded", 0) == self.total:
            return "succeeded"
        return "cancelled" if self.cancel_requested else "completed"

    def to_status_json(self) -> dict[str, Any]:
        """What ``GET /batches/{id}`` and ``coldbrew batch status`` show."""
        callbacks = {
            name: {
                "type": cb.get("type"),
                "job_id": callback_job_id(self.id, name.removeprefix("on_")),
                "status": self.fired.get(name),
            }
            for name, cb in self.callbacks.items()
        }
        return {
            "id": self.id,
            "tenant": self.tenant,
            "description": self.description,
            "status": self.status,
            "total": self.total,
            "pending": self.pending,
            "counts": dict(self.counts),
            "progress": round(self.progress, 4),
            "callbacks": callbacks,
            "collect_results": self.collect_results,
            "cancel_requested": self.cancel_requested,
            "created_at": self.created_at.isoformat(),
            "finished_at": None if self.finished_at is None else self.finished_at.isoformat(),
        }
