"""Acks of asynchronously committed claims, sent once each claim is known durable.

With ``COLDBREW_CLAIM_COMMIT=async`` the claim batch commits without waiting
for PostgreSQL to flush its WAL, so a job starts about one fsync sooner. A
PostgreSQL crash (not a clean restart) can then lose the claims of its last
few hundred milliseconds, and a delivery acked at such a claim would be a
lost job. So the job starts at once, but its delivery is held (unacked, so
RabbitMQ gives it to nobody else) until the claim is known durable:

* a later synchronous commit that wrote WAL on the same server start, sent
  after the claim committed, flushed the WAL past it: in practice the next
  completion batch, whose written outcomes return its ``CommitMark``, which
  the runner hands to ``completed`` -- "covered";
* otherwise, once a held claim has waited ``delay`` (idle, long jobs) plus
  its own ``patience``, one barrier -- a tiny synchronous transaction that
  writes a commit record -- covers every claim held so far -- "barrier". A
  process-pool job queued for a child gets the pool's linger as patience
  (worker/runner.py): its delivery waits that much longer for its ack, and
  a lingering completion batch covers it instead of a barrier of its own;
* a claim made on an earlier server start (PostgreSQL restarted, maybe
  crashed, in between) is verified against its row once the database
  answers: the row still at this attempt and this worker (or finished) means
  it survived -- "verified", acked; a row at a later attempt or another
  worker means the job moved on -- "superseded", the job is stopped
  (fenced) and the delivery acked as a duplicate; no row or an earlier
  attempt means the claim was lost -- "lost", the job is stopped and the
  delivery requeued, so the job runs again (at least once, as after a
  crashed worker). Its outcome write, fenced by attempt, changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import structlog

from coldbrew.errors import DatabaseUnavailable
from coldbrew.jobstate import JobState
from coldbrew.metrics import Metrics
from coldbrew.store import ClaimStore, CommitMark
from coldbrew.transport import Inbound

log = structlog.get_logger("coldbrew.claimacks")


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


Verdict = Literal["verified", "superseded", "lost"]


@dataclass(slots=True, eq=False)
class HeldAck:
    """A claimed job's delivery, held until its claim is known durable."""

    job_id: str
    attempt: int
    mark: CommitMark
    message: Inbound
    state: JobState | None = None
    since: float = field(default=0.0)
    patience: float = 0.0
    """Seconds beyond the barrier delay this ack may wait for a completion to cover it."""


def split_covered(
    held: Iterable[HeldAck], server: datetime, seq: int
) -> tuple[list[HeldAck], list[HeldAck]]:
    """``(covered, rest)``: a synchronous commit on ``server`` sent after claim batch ``seq``
    returned covers the claims of that server start up to ``seq``, and no others."""
    covered: list[HeldAck] = []
    rest: list[HeldAck] = []
    for item in held:
        (covered if item.mark.server == server and item.mark.seq <= seq else rest).append(item)
    return covered, rest


def needs_verifying(held: Iterable[HeldAck], server: datetime, seq: int) -> list[HeldAck]:
    """Claims made before a commit on ``server`` up to ``seq`` but on another server start:
    PostgreSQL restarted in between, and only their rows can tell whether they survived."""
    return [item for item in held if item.mark.server != server and item.mark.seq <= seq]


def verdict(item: HeldAck, row: Mapping[str, Any] | None, worker_id: str) -> Verdict:
    """What a restart left of ``item``'s claim, read from its job row (None: no row).

    Only a claim increments ``attempt``, so a row below our attempt (or none)
    means ours was lost. At our attempt, our worker id (or none: the outcome was
    written, which fenced writes allow only to the attempt holding the row)
    means ours survived. Anything else is another claim's: ours is fenced.
    """
    if row is None or row["attempt"] < item.attempt:
        return "lost"
    if row["attempt"] == item.attempt and row["worker_id"] in (worker_id, None):
        return "verified"
    return "superseded"


class ClaimAcks:
    """Holds the deliveries of asynchronously committed claims until they are durable."""

    def __init__(
        self,
        store: ClaimStore,
        metrics: Metrics,
        *,
        delay: float,
        worker_id: str,
        stop_job: Callable[[JobState], None],
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._delay = delay
        self._worker_id = worker_id
        self._stop_job = stop_job
        self._held: dict[HeldAck, None] = {}  # insertion (claim) order
        self._task: asyncio.Task[None] | None = None
        self._urgent = False  # the drain, or a restart seen: no more waiting for a commit
        self._sleeping: asyncio.Future[None] | None = None
        self._closed = False
        self._closing = False  # the drain has begun: barriers without delay until the end
        self._last_completion: CommitMark | None = None
        self._patient = False  # some held claim may have patience (reset once none is held)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, item: HeldAck) -> None:
        """Ack ``item``'s delivery once its claim is durable (or settle it as its row says)."""
        if self._closed:  # too late to learn anything: RabbitMQ gets it back
            item.message.requeue_soon()
            return
        item.since = asyncio.get_running_loop().time()
        self._held[item] = None
        if item.patience > 0:
            self._patient = True
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="claim-barrier")

    def completed(self, mark: CommitMark) -> None:
        """A written outcome's ``CommitMark``: its completion batch committed synchronously.
        The outcomes of one batch share one mark, so a batch is acted on once."""
        if mark is self._last_completion:
            return
        self._last_completion = mark
        self.committed(mark.server, mark.seq)

    def committed(self, server: datetime, seq: int) -> None:
        """A synchronous commit that wrote WAL on ``server``, sent after claim batch ``seq``."""
        self._ack_covered(server, seq, "covered")
        if self._held and needs_verifying(self._held, server, seq):
            self._barrier_now()  # PostgreSQL restarted: verify without waiting out the delay

    def _barrier_now(self) -> None:
        self._urgent = True
        _wake(self._sleeping)

    async def _sleep(self, seconds: float) -> None:
        """Sleep until a barrier is due, or ``_barrier_now`` (no task per sleep: this is
        on the hot path, once per few claims at a steady rate)."""
        loop = asyncio.get_running_loop()
        self._sleeping = loop.create_future()
        timer = loop.call_later(seconds, _wake, self._sleeping)
        try:
            await self._sleeping
        finally:
            timer.cancel()
            self._sleeping = None

    def _ack_covered(self, server: datetime, seq: int, how: str) -> None:
        if not self._held:
            return
        covered, _ = split_covered(self._held, server, seq)
        for item in covered:
            del self._held[item]
            item.message.ack_soon()
        if covered:
            self._metrics.claim_acks.labels(how).inc(len(covered))
        if not self._held:
            self._patient = False

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = 0.2
        try:
            while self._held:
                wait = self._next_due() - loop.time()
                if wait > 0 and not self._urgent:
                    await self._sleep(wait)
                    continue  # a completion may have covered it meanwhile
                self._urgent = self._closing  # set again if a restart shows meanwhile
                try:
                    server, seq = await self._store.durability_barrier()
                    self._ack_covered(server, seq, "barrier")
                    if stale := needs_verifying(self._held, server, seq):
                        await self._verify(stale)
                except DatabaseUnavailable as exc:
                    log.warning(
                        "claim_barrier_failed",
                        error=str(exc),
                        held=len(self._held),
                        retry_in=backoff,
                    )
                    await asyncio.sleep(backoff)  # the drain's own timeout bounds this
                    backoff = min(backoff * 2, 5.0)
                    self._urgent = True  # retry at once: the held claims are overdue already
                    continue
                backoff = 0.2
        finally:
            self._task = None

    def _next_due(self) -> float:
        """When the first held claim is due for a barrier (loop time). The oldest held claim,
        unless some held claim has patience: then the earliest of all (claims with patience
        are those of pool jobs queued for a child, held a few at a time)."""
        if self._patient:
            return min(item.since + item.patience for item in self._held) + self._delay
        return next(iter(self._held)).since + self._delay

    async def _verify(self, stale: list[HeldAck]) -> None:
        rows = await self._store.verify_claims([item.job_id for item in stale])
        for item in stale:
            if item not in self._held:
                continue
            del self._held[item]
            how = verdict(item, rows.get(item.job_id), self._worker_id)
            self._metrics.claim_acks.labels(how).inc()
            if how == "verified":
                item.message.ack_soon()
                continue
            log.warning(
                "claim_lost" if how == "lost" else "claim_superseded",
                job_id=item.job_id,
                attempt=item.attempt,
                found=dict(rows[item.job_id]) if item.job_id in rows else None,
            )
            if item.state is not None:
                self._stop_job(item.state)
            if how == "lost":
                item.message.requeue_soon()
            else:
                item.message.ack_soon()

    async def settle_all(self, timeout: float) -> None:
        """The drain: settle every held delivery now, by a barrier (or a verification) if
        PostgreSQL answers within ``timeout``; requeue the rest (the job runs again)."""
        self._closing = True
        self._barrier_now()
        task = self._task
        if task is not None:
            await asyncio.wait({task}, timeout=timeout)
        await self.close()

    async def close(self) -> None:
        """Stop holding: requeue whatever is still held (its claim's fate is unknown)."""
        self._closed = True
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        left = list(self._held)
        self._held.clear()
        for item in left:
            log.warning("claim_unsettled", job_id=item.job_id, attempt=item.attempt)
            await item.message.requeue()
        if left:
            self._metrics.claim_acks.labels("unsettled").inc(len(left))
