"""What a worker knows about each job it holds (claimed, not yet settled)."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any, Literal

from coldbrew.app import JobSpec
from coldbrew.model import Envelope
from coldbrew.transport import Inbound


class Stop(enum.Enum):
    """Why a running job is being stopped before it finished by itself."""

    CANCELLED = "cancelled"
    """Cancel requested (``coldbrew cancel``, ``DELETE /jobs/{id}``): recorded as cancelled."""
    FENCED = "fenced"
    """Its lease was lost: another attempt owns the row, nothing of this one is written."""
    RELEASED = "released"
    """The worker drains: the job is handed back to run again elsewhere at once."""


Unwritten = Literal[Stop.FENCED, Stop.RELEASED]
"""A stopped attempt that writes no outcome of its own."""


@dataclass(slots=True)
class Delivery:
    """A delivery that passed the contract checks, waiting for a job slot."""

    message: Inbound
    envelope: Envelope
    spec: JobSpec
    args: dict[str, Any]
    rate_key: str | None = None
    """The per-key rate limit's bucket (``<type>:<value>``), when the type has one."""
    waiting_recorded: bool = False
    """A rate-limited claim refused it and recorded its job as waiting: a later refusal
    need not record it again (rates/claim.py)."""


@dataclass(slots=True, eq=False)
class JobState:
    """A claimed job: its attempt, progress not yet written, and how to stop it."""

    id: str
    attempt: int
    delivery: Delivery
    started: float
    progress: tuple[float | None, str | None] | None = None
    stop: Stop | None = None
    cancel_reason: str = ""
    """With ``Stop.CANCELLED``: the reason given with the cancel request."""
    scope: asyncio.Timeout | None = None
    in_process: bool = False

    def report_progress(self, fraction: float | None, message: str | None) -> None:
        self.progress = (fraction, message)


class InFlight:
    """The jobs one worker holds, keyed by id; the heartbeat and the drain read it."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobState] = {}

    def add(self, state: JobState) -> None:
        self._jobs[state.id] = state

    def remove(self, state: JobState) -> None:
        if self._jobs.get(state.id) is state:
            del self._jobs[state.id]

    def get(self, job_id: str) -> JobState | None:
        return self._jobs.get(job_id)

    def held(self) -> list[tuple[str, int]]:
        return [(s.id, s.attempt) for s in self._jobs.values()]

    def states(self) -> list[JobState]:
        return list(self._jobs.values())

    def take_progress(self) -> list[tuple[str, int, float | None, str | None]]:
        """Progress reported since the last call, one entry per job."""
        updates = []
        for state in self._jobs.values():
            if state.progress is not None:
                fraction, message = state.progress
                updates.append((state.id, state.attempt, fraction, message))
                state.progress = None
        return updates

    def __len__(self) -> int:
        return len(self._jobs)
