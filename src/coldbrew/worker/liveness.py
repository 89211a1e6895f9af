"""Worker liveness: a dead worker's jobs run elsewhere within about a second, not a lease.

Each worker keeps a ``workers`` row and holds a session-level advisory lock
(key: schema and worker id) on a dedicated connection, never a pooled one
(the pool's reset query unlocks everything). When the worker's process dies,
the kernel closes that connection, PostgreSQL ends the session and the lock is
free at once. Every ``COLDBREW_LIVENESS_SECONDS`` each worker runs one
statement that refreshes its own heartbeat and lists the workers that look
dead; one worker then removes their rows and releases their running jobs
(``retrying``, due now, fenced by attempt as the reaper does) and publishes
them straight away instead of waiting for the relay's next tick.

A worker looks dead only when all three hold:

- no session holds its lock (a hung worker, SIGSTOP or a blocked loop, keeps
  its session and its lock: it stays bounded by its lease, as before);
- its heartbeat is older than ``COLDBREW_LIVENESS_GRACE_SECONDS`` (a live
  worker whose session broke reconnects, refreshes its row and re-takes its
  lock well within that);
- it took its lock on this run of the server. A PostgreSQL restart ends every
  session, so for a moment every worker looks dead; their rows still carry the
  old server start time until each reconnects, and a row that never does is
  taken for dead only a lease after the restart.

A worker that reconnects after an outage releases nobody's jobs for a lease
(nor does its reaper): the others were cut off as well, and need the time to
come back. A worker that starts under the id of one that died (a container
restarted in place) waits for its lock, then releases its predecessor's jobs
before it takes any work.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

import asyncpg
import structlog

from coldbrew.errors import (
    BrokerUnavailable,
    ConfigurationError,
    DatabaseUnavailable,
    TransientDatabaseError,
)
from coldbrew.jobstate import InFlight
from coldbrew.metrics import Metrics, coldbrew_version
from coldbrew.settings import Settings
from coldbrew.store import JobStore, WorkerInfo
from coldbrew.worker.service import Backoff, sleep_unless

log = structlog.get_logger("coldbrew.liveness")

LOCK_RETRY_SECONDS = 1.0


class Liveness:
    """Registers this worker, keeps its lock, and releases the jobs of workers that died."""

    name = "liveness"

    # (namespace, worker id) of every worker registered by this process
    _held_here: ClassVar[set[tuple[str, str]]] = set()

    def __init__(
        self,
        *,
        settings: Settings,
        store: JobStore,
        lanes: Sequence[str],
        inflight: InFlight,
        metrics: Metrics,
        publish_due: Callable[[], Awaitable[int]],
        on_released: Callable[[Sequence[Any], str], Awaitable[None]],
    ) -> None:
        self.store = store
        self.inflight = inflight
        self.metrics = metrics
        self.publish_due = publish_due
        self.on_released = on_released
        self.interval = settings.liveness_seconds
        self.grace = settings.liveness_grace_seconds
        self.lease = settings.lease_seconds
        self.enabled = settings.liveness_seconds > 0
        self.info = WorkerInfo(
            id=settings.worker_id,
            instance=secrets.token_hex(8),
            host=socket.gethostname(),
            pid=os.getpid(),
            version=coldbrew_version(),
            lanes=tuple(lanes),
            concurrency=settings.concurrency,
        )
        self._conn: asyncpg.Connection | None = None
        # the session that held our lock when it broke: kept open (not closed, no FIN)
        # until a new session holds the lock, so the lock is never free in between
        self._left_behind: asyncpg.Connection | None = None
        self._own_backend: int | None = None  # server pid of the session holding our lock
        self._hold_until = 0.0  # monotonic: release nobody before (a lease after a reconnect)
        self._warned_hold = False
        self._key: tuple[str, str] | None = None  # in _held_here while registered

    # --- start and stop -------------------------------------------------------------

    async def open(self) -> None:
        """Register before the worker takes any work (``open_parts`` awaits this)."""
        if not self.enabled:
            return
        key = (self.store.namespace, self.info.id)
        if key in Liveness._held_here:
            raise ConfigurationError(
                f"COLDBREW_WORKER_ID {self.info.id!r} is taken by another worker in this "
                "process; every worker needs an id of its own"
            )
        conn = await self.store.liveness.open_liveness_session(
            self.info.id, keepalive_seconds=self.lease
        )
        try:
            await self._wait_for_lock(conn)
            # we hold the id's lock and have claimed nothing: running jobs under our id
            # are a dead predecessor's (the same container restarted, say)
            released = await self.store.liveness.release_worker_jobs(conn, [self.info.id])
            started = await self.store.liveness.register_worker(conn, self.info, 0)
        except BaseException:
            conn.terminate()
            raise
        self._conn = conn
        self._key = key
        Liveness._held_here.add(key)
        log.info(
            "worker_registered",
            worker_id=self.info.id,
            instance=self.info.instance,
            started_at=started.isoformat(),
        )
        if released:
            log.warning("predecessor_jobs_released", worker_id=self.info.id, jobs=len(released))
            await self._settle(released)

    async def _wait_for_lock(self, conn: asyncpg.Connection) -> None:
        """Take our id's lock; another session holding it is a live worker with our id,
        or a dead one whose session the server has not ended yet: wait, then refuse."""
        give_up = time.monotonic() + 2 * self.lease
        while True:
            lock = await self.store.liveness.take_worker_lock(conn, self.info.id)
            if lock.locked:
                self._own_backend = lock.backend_pid
                return
            if time.monotonic() >= give_up:
                raise ConfigurationError(
                    f"COLDBREW_WORKER_ID {self.info.id!r} is in use: another PostgreSQL "
                    f"session (server pid {lock.holder}) has held its liveness lock for "
                    f"{2 * self.lease:g} s; every worker needs an id of its own"
                )
            log.warning(
                "worker_id_in_use",
                worker_id=self.info.id,
                holder=lock.holder,
                retry_in=LOCK_RETRY_SECONDS,
            )
            await asyncio.sleep(LOCK_RETRY_SECONDS)

    async def close(self) -> None:
        """A clean stop: remove our row; closing the session frees the lock."""
        conn, self._conn = self._conn, None
        if self._key is not None:
            Liveness._held_here.discard(self._key)
            self._key = None
        try:
            if conn is not None and not conn.is_closed():
                await self.store.liveness.unregister_worker(conn, self.info)
                log.info("worker_unregistered", worker_id=self.info.id)
        except DatabaseUnavailable as exc:  # the fleet removes the row once the lock is free
            log.warning("worker_not_unregistered", worker_id=self.info.id, error=str(exc))
        finally:
            for session in (conn, self._left_behind):
                if session is not None and not session.is_closed():
                    session.terminate()
            self._left_behind = None

    # --- the loop ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        if not self.enabled:
            return
        backoff = Backoff(first=0.1, cap=1.0)
        while not stop.is_set():
            try:
                await self.tick()
            except DatabaseUnavailable as exc:
                if not isinstance(exc, TransientDatabaseError):
                    self._session_broke()
                delay = backoff.next_delay()
                log.warning("liveness_failed", error=str(exc), retry_in=delay)
                await sleep_unless(stop, delay)
                continue
            backoff.reset()
            await sleep_unless(stop, self.interval)

    async def tick(self) -> None:
        """One heartbeat of ours and one look at the others."""
        conn = self._conn
        if conn is None or conn.is_closed():
            conn = await self._reconnect()
        beat = await self.store.liveness.worker_heartbeat(
            conn, self.info, len(self.inflight), grace=self.grace, lease_seconds=self.lease
        )
        if not beat.registered:  # the fleet took us for dead: our jobs were released
            log.warning("worker_row_missing", worker_id=self.info.id)
            await self.store.liveness.register_worker(conn, self.info, len(self.inflight))
        if not beat.locked:
            await self._retake_lock(conn)
        if beat.dead:
            await self._release(conn, beat.dead)

    def _session_broke(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None or conn.is_closed():
            return
        if conn.get_server_pid() == self._own_backend:
            if self._left_behind is not None and not self._left_behind.is_closed():
                self._left_behind.terminate()
            self._left_behind = conn  # its server session may still hold our lock
        else:
            conn.terminate()

    async def _reconnect(self) -> asyncpg.Connection:
        conn = await self.store.liveness.open_liveness_session(
            self.info.id, keepalive_seconds=self.lease
        )
        try:
            # a fresh heartbeat first, so the fleet does not take us for dead while we
            # get our lock back (after a restart it is free; after a network outage our
            # old session may still hold it)
            await self.store.liveness.register_worker(conn, self.info, len(self.inflight))
            await self._retake_lock(conn)
        except BaseException:
            conn.terminate()
            raise
        self._conn = conn
        # our session broke (a failure, or the server closed it): the others may have been
        # cut off as well, and need the time to come back
        self._hold_until = time.monotonic() + self.lease
        self._warned_hold = False
        log.info("liveness_reconnected", worker_id=self.info.id, holds_releases_s=self.lease)
        return conn

    async def _retake_lock(self, conn: asyncpg.Connection) -> None:
        for _ in range(10):
            lock = await self.store.liveness.take_worker_lock(conn, self.info.id)
            if lock.locked:
                self._own_backend = lock.backend_pid
                left, self._left_behind = self._left_behind, None
                if left is not None and not left.is_closed():
                    left.terminate()
                return
            if lock.holder is None or lock.holder != self._own_backend:
                break
            # our own earlier session, which the server still keeps: end it, then retry
            log.info("ending_own_stale_session", worker_id=self.info.id, backend=lock.holder)
            await self.store.liveness.terminate_backend(conn, lock.holder)
            await asyncio.sleep(0.1)  # the backend exits, and frees the lock, a moment later
        log.error("worker_lock_held_elsewhere", worker_id=self.info.id, holder=lock.holder)

    async def _release(self, conn: asyncpg.Connection, dead: Sequence[str]) -> None:
        if time.monotonic() < self._hold_until:
            if not self._warned_hold:
                self._warned_hold = True
                log.info("liveness_release_held", look_dead=list(dead))
            return
        removed, released = await self.store.liveness.release_dead_workers(
            conn, dead, grace=self.grace, lease_seconds=self.lease
        )
        for row in removed:
            self.metrics.workers_lost.inc()
            log.warning(
                "worker_lost",
                worker_id=row["id"],
                host=row["host"],
                pid=row["pid"],
                last_heartbeat=row["heartbeat_at"].isoformat(),
            )
        if released:
            log.warning("dead_workers_jobs_released", jobs=len(released))
            await self._settle(released)

    async def _settle(self, released: Sequence[Any]) -> None:
        """Count and log the released jobs and publish them now (else the relay will)."""
        await self.on_released(released, "worker_lost")
        try:
            await self.publish_due()
        except (BrokerUnavailable, DatabaseUnavailable) as exc:
            log.warning("released_jobs_publish_deferred", error=str(exc))
