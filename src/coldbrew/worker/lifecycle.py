"""A worker's lifecycle, shared by every part that must know where it stands.

One object instead of flags read through lambdas: the intake stops taking
deliveries when the phase is ``DRAINING``, the runner hands back a job
claimed during the drain, the probes read ``ready`` and ``database_ok``.
The phases only move forward: starting -> ready -> draining -> stopped.
"""

from __future__ import annotations

import asyncio
import enum

import structlog

log = structlog.get_logger("coldbrew.worker")


class Phase(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


class Lifecycle:
    """Where the worker stands, whether PostgreSQL answers, and what killed it."""

    def __init__(self) -> None:
        self.phase = Phase.STARTING
        self.ready = asyncio.Event()
        """Set while the worker consumes and serves; waited on by ``Worker.wait_ready``."""
        self.stop_requested = asyncio.Event()
        """Set by ``Worker.stop()``: begin the drain."""
        self.services_stop = asyncio.Event()
        """Set after the drain: the background services return."""
        self.database_ok = True
        self.database_node = ""
        """The PostgreSQL host:port of ``COLDBREW_DATABASE_URL`` that last answered."""
        self.fatal: BaseException | None = None

    @property
    def draining(self) -> bool:
        """Whether the worker no longer takes work (draining or stopped)."""
        return self.phase in (Phase.DRAINING, Phase.STOPPED)

    def mark_ready(self) -> None:
        if self.phase is Phase.STARTING:
            self.phase = Phase.READY
            self.ready.set()

    def begin_drain(self) -> None:
        if not self.draining:
            self.phase = Phase.DRAINING
        self.ready.clear()

    def mark_stopped(self) -> None:
        self.phase = Phase.STOPPED
        self.ready.clear()

    def set_database_ok(self, ok: bool) -> None:
        """Record PostgreSQL's reachability (the readiness probe reports it)."""
        if ok != self.database_ok:
            log.info("database_health", ok=ok)
        self.database_ok = ok

    def set_database_node(self, node: str) -> None:
        """Record which PostgreSQL host answered (a change is a failover)."""
        if node != self.database_node:
            log.info("database_node", node=node, previous=self.database_node or None)
        self.database_node = node

    def die(self, exc: BaseException) -> None:
        """A part failed in a way the worker cannot go on from: drain, then raise ``exc``."""
        if self.fatal is None:
            self.fatal = exc
        self.stop_requested.set()

    def health(self) -> tuple[bool, str]:
        """The liveness probe: alive unless a part failed fatally."""
        if self.fatal is not None:
            return False, f"fatal: {self.fatal!r}"
        return True, "ok"
