"""Reconciliation: PostgreSQL is the truth, so a waiting job whose message is gone runs again.

A broker can lose a queue's messages (a purge, a deleted queue, a node that
lost a classic queue): the rows say ``queued`` and nothing would ever deliver
them. Every ``COLDBREW_RECONCILE_SECONDS`` / 3 one worker of the fleet (the
holder of an advisory lock, for that pass; the others skip a pass that
another just made) looks at each tenant queue that has waiting rows, and
makes due again -- for the relay, the one way anything is (re)published --
only rows whose message *cannot* be in the queue. A loss is found at the
second look after it: within about two thirds of the setting, plus the relay.

**Why a backlog is never republished.** A look reads, in this order:

1. ``T0``, PostgreSQL's clock;
2. the queue's ready count ``M`` and consumers ``C`` (a passive ``queue.declare``);
3. ``E``: rows waiting, with no publish mark, whose publish was confirmed
   before ``T0`` (``published_at``, set when the confirm cleared the mark).

Each row counted in ``E`` had a message in the queue before ``M`` was read;
by then that message was ready (in ``M``), delivered and unacked, or lost
(acked messages belong to rows that were claimed or failed, and a row that
waits again after that has a new publish mark or a later ``published_at``).
Unacked deliveries are at most ``C`` x the largest prefetch any worker reported
(RabbitMQ enforces the prefetch per consumer; a worker raises its prefetch only
once a report says so), plus the prefetch of every reporting worker and the
deliveries workers reported holding unclaimed (a saturated worker cancels its
consumers, which the broker then no longer counts, and keeps what they
delivered: ``unacked_bound``), plus, for a queue whose rows
have a priority above 0 (the only ones an aging sweep ever takes from), what
a sweep kept, plus what the aging sweeps begun around the look may take
(each records that in ``queue_sweeps`` before it takes anything). So
``E - M - unacked bound`` is a lower bound of the messages lost, and with
nothing lost it is never positive, however long the backlog. Two rules act
on it, and only on rows confirmed before the *previous* look (at least half
a pass earlier):

- **count**: that bound was positive at this look and at the previous one
  (a draining worker's deliveries, handed back, do not persist): make
  that many rows due, those confirmed longest ago first (a lost queue lost
  its oldest messages: everything published before the loss).
- **idle**: the queue had no ready message at either look. Then every row
  confirmed before the previous look and still waiting is held unclaimed by
  a worker (in its scheduler: no free slot, a paused tenant, a full cap) or
  lost (or, for a moment, taken by an aging sweep: subtracted as above);
  each worker reports what it holds per queue every quarter of a pass
  (``queue_holds``, with its prefetch in ``reconcile_workers``), and the held
  set of such rows can only shrink after the first look counted the queue,
  so with each worker's latest report made since then, ``E_before - held``
  is again a lower bound of the loss. This finds a loss smaller than the
  prefetch bound once the queue empties.

Which rows: a look that finds ``n`` missing records up to when its ``n``
oldest confirmed rows were confirmed (``suspects``); the next look makes due
only rows confirmed by then that still wait, oldest first. A row that was
merely held by a worker at the first look (held deliveries are the oldest: they
were at the queue's head) has been claimed by the second; a lost one has not.
A wrong pick (a row held across both looks) costs one duplicate delivery,
which the claim acks as a duplicate; the count it adds to ``M`` lowers the
next bound, so picks never snowball.

**A deleted queue** cancels our consumers (basic.cancel): aio-pika re-declares
the queue and re-consumes, and this service declares and binds it again at once
(a queue aio-pika re-declares has no binding: new messages would detour through
``<ns>.unrouted``) and looks right away; a look that finds a queue missing
does the same. A worker whose consumers are paused (worker/consumer_hold.py) gets
no basic.cancel; its probe of the paused queues reports a missing one through
the same ``QueueCancels``. What the deleted queue held is then found by the
rules above.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog

from coldbrew.holdsize import PrefetchPermit
from coldbrew.metrics import Metrics
from coldbrew.stats import lane_consumers
from coldbrew.store import JobStore, LookRecord, QueueLook, ReconcilePass, WaitingCount
from coldbrew.topology import Topology
from coldbrew.transport import Broker, QueueCancels, QueueCounts
from coldbrew.worker.service import UNAVAILABLE, Backoff, sleep_unless

log = structlog.get_logger("coldbrew.reconcile")

Pair = tuple[str, str]
Ensure = Callable[[str, str], Awaitable[None]]
Holdings = Callable[[], dict[Pair, int]]

BATCH = 10_000
"""Rows one pass makes due per queue at most (the relay publishes them in batches of 500)."""
COUNT_MARGIN = 0.25
"""Seconds added to a queue's count instant, for the clock's reading and a report's
computation just before its statement."""
ASKED_REPORT_GAP = 0.1
"""Seconds between reports made early because the hold asked for a larger prefetch."""
SWEEP_SECONDS = 10.0
"""Longer than any aging sweep holds what it took (``Broker.sweep_queue``: 2 s, then requeues)."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a look needs to judge: when the previous look counts, and the unacked bound."""

    prefetch: int
    """Unacked deliveries one consumer of this worker can hold (its prefetch, as reported)."""
    keep: int
    """...and how many more an aging sweep of that queue may have kept (0: sweeps are off)."""
    min_gap: float
    """The previous look must be at least this old (seconds): holding reports came between."""
    max_age: float
    """...and at most this old: an older one says nothing about the queue now."""
    limit: int = BATCH


@dataclass(frozen=True, slots=True)
class Verdict:
    """One queue's look: its count bound and how many rows it suspects (both kept for the
    next look), and how many of the previous look's suspects to make due now."""

    deficit: int | None
    republish: int = 0
    rule: str | None = None
    suspects: int = 0
    confirmed_by: datetime | None = None
    """Republish only rows confirmed by then: the previous look's suspects."""


def judge(
    counts: QueueCounts | None, waiting: WaitingCount | None, *, started: datetime, bounds: Bounds
) -> Verdict:
    """How many of a queue's waiting rows cannot have a message in it (see the module doc).

    ``counts`` None: the queue is missing (no bound; it is declared again).
    ``waiting`` None: no waiting row was confirmed (nothing to find).
    """
    if counts is None:
        return Verdict(None)
    if waiting is None:
        return Verdict(-counts.ready)
    unacked = unacked_bound(counts, waiting, bounds)
    deficit = waiting.waiting - counts.ready - unacked
    unheld = waiting.waiting - waiting.held - waiting.sweeping if counts.ready == 0 else 0
    suspects = min(max(deficit, unheld, 0), bounds.limit)
    if waiting.previous_look is None or waiting.previous_ready is None:
        return Verdict(deficit, suspects=suspects)
    age = (started - waiting.previous_look).total_seconds()
    if not bounds.min_gap <= age <= bounds.max_age or waiting.previous_suspects is None:
        return Verdict(deficit, suspects=suspects)
    confirmed_by = min(waiting.previous_look, waiting.previous_suspects)
    if counts.ready == 0 and waiting.previous_ready == 0:
        lost = waiting.waiting_before - waiting.held - waiting.sweeping
        if lost > 0:
            return Verdict(deficit, min(lost, bounds.limit), "idle", suspects, confirmed_by)
    previous = waiting.previous_deficit
    if deficit > 0 and previous is not None and previous > 0:
        count = min(deficit, previous, bounds.limit)
        return Verdict(deficit, count, "count", suspects, confirmed_by)
    return Verdict(deficit, suspects=suspects)


def unacked_bound(counts: QueueCounts, waiting: WaitingCount, bounds: Bounds) -> int:
    """The most deliveries of the queue that can be unacked in workers' hands at the count.

    Three parts. The broker's consumers, each holding at most the largest
    prefetch the fleet reported (a worker's prefetch rises only after a
    report says so: ``PrefetchPermit``). Consumers the broker does not
    count: a saturated worker cancels its consumers (worker/consumer_hold.py)
    and keeps what they delivered, up to its prefetch each, those in flight
    at the cancel included; every reporting worker's prefetch is added for
    them, whether paused at the count or not (it may have paused since its
    report). And what the workers reported holding unclaimed (a consumer
    that paused and resumed holds its old deliveries beyond the new
    prefetch), plus what aging sweeps took. Counting a running worker twice
    only makes the bound looser: a loss below it waits for the idle rule.
    """
    live = counts.consumers * per_consumer(waiting, bounds)
    paused = max(waiting.fleet_prefetch_sum or 0, bounds.prefetch)
    return live + paused + waiting.held + waiting.sweeping


def per_consumer(waiting: WaitingCount, bounds: Bounds) -> int:
    """Unacked deliveries one consumer of the queue can hold, the largest in the fleet.

    RabbitMQ enforces the prefetch per consumer. What an aging sweep kept
    (up to a prefetch) is held beyond it; sweeps only ever run on a queue
    whose messages have a priority above 0 (a queue of priority-0 messages
    clears every level with each delivery, aging.py), so that allowance is
    only made for such a queue. What a sweep takes for its moment is
    recorded as it begins (``WaitingCount.sweeping``).
    """
    prefetch = max(bounds.prefetch, waiting.fleet_prefetch or 0)
    if waiting.top_priority <= 0:
        return prefetch
    return prefetch + max(bounds.keep, waiting.fleet_keep or 0)


@dataclass(frozen=True, slots=True)
class PassResult:
    republished: dict[str, int]
    """Rows made due, by rule."""
    missing: list[Pair]
    """Queues that were not there: declared again after the pass."""
    looked: int


class Reconciler:
    """Looks for lost messages (one worker of the fleet per pass), reports this worker's
    holdings, and declares deleted queues again."""

    name = "reconcile"

    def __init__(
        self,
        *,
        store: JobStore,
        broker: Broker,
        topology: Topology,
        metrics: Metrics,
        worker_id: str,
        reconcile_seconds: float,
        prefetch: int,
        keep: int,
        holdings: Holdings,
        ensure: Ensure,
        cancels: QueueCancels,
        permit: PrefetchPermit | None = None,
    ) -> None:
        self.store = store
        self.broker = broker
        self.topology = topology
        self.metrics = metrics
        self.worker_id = worker_id
        self.interval = reconcile_seconds / 3
        self.report_interval = self.interval / 4
        self.bounds = Bounds(
            prefetch=prefetch, keep=keep, min_gap=self.interval / 2, max_age=self.interval * 3
        )
        self.holdings = holdings
        self.permit = permit
        """The consumers' prefetch, reported here (None: ``prefetch`` is fixed)."""
        self.ensure = ensure
        self.cancels = cancels
        self._cancelled: set[Pair] = set()
        self._topology_lost = False
        self._wake = asyncio.Event()
        self._lanes_shown: set[str] = set()

    # --- the broker's cancel ------------------------------------------------------------

    def queue_cancelled(self, queue_name: str) -> None:
        """The broker cancelled our consumer of ``queue_name`` (deleted): declare it again and
        look at once (reported through ``Broker.queue_cancels``)."""
        if queue_name == self.topology.unrouted_queue:
            self._topology_lost = True  # unbound, new tenants' messages would be dropped
            self._wake.set()
            return
        pair = self.topology.job_queue_pair(queue_name)
        if pair is None:
            return
        self._cancelled.add(pair)
        self._wake.set()

    # --- the loop -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_pass = next_report = loop.time()
        last_report = next_pass - ASKED_REPORT_GAP
        backoff = Backoff(first=1.0, cap=30.0)
        while not stop.is_set():
            wake_at = min(next_pass, next_report)
            if self._asked():  # the hold waits for a report to raise its prefetch
                wake_at = min(wake_at, last_report + ASKED_REPORT_GAP)
            await self._sleep(stop, max(0.0, wake_at - loop.time()))
            if stop.is_set():
                break
            woken = self._wake.is_set()
            self._wake.clear()
            try:
                await self._redeclare_cancelled()
                now = loop.time()
                if self._asked() and now >= last_report + ASKED_REPORT_GAP:
                    next_report = now
                if now >= next_report:
                    last_report = now
                    next_report = now + self.report_interval
                    await self.report_holdings()
                if woken or now >= next_pass:
                    next_pass = now + self.interval
                    await self.reconcile_once(force=woken)
            except UNAVAILABLE as exc:
                delay = backoff.next_delay()
                log.warning("reconcile_failed", error=str(exc), retry_in=delay)
                await sleep_unless(stop, delay)
                continue
            backoff.reset()
        await self._clear_report()

    async def _sleep(self, stop: asyncio.Event, seconds: float) -> None:
        """Sleep ``seconds``, or less if ``stop`` is set or a cancelled queue wakes us."""
        waits = [
            asyncio.ensure_future(stop.wait()),
            asyncio.ensure_future(self._wake.wait()),
            asyncio.ensure_future(self.cancels.arrived.wait()),
        ]
        if self.permit is not None and not self.permit.asked.is_set():  # set: the gap's timeout
            waits.append(asyncio.ensure_future(self.permit.asked.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        for queue_name in self.cancels.take():
            self.queue_cancelled(queue_name)

    async def _redeclare_cancelled(self) -> None:
        if self._topology_lost:
            await self.broker.redeclare_topology()
            self._topology_lost = False
            self.metrics.queues_redeclared.labels("cancelled").inc()
            log.warning("topology_redeclared", queue=self.topology.unrouted_queue)
        while self._cancelled:
            pair = next(iter(self._cancelled))
            await self._redeclare(pair, "cancelled")
            self._cancelled.discard(pair)

    async def _redeclare(self, pair: Pair, cause: str) -> None:
        await self.ensure(*pair)
        self.metrics.queues_redeclared.labels(cause).inc()
        log.warning("tenant_queue_redeclared", queue=pair[0], tenant=pair[1], cause=cause)

    def _asked(self) -> bool:
        return self.permit is not None and self.permit.pending

    async def report_holdings(self, holds: dict[Pair, int] | None = None) -> None:
        """Tell the fleet how many deliveries this worker holds unclaimed per queue, and
        what its consumers can hold (every report, so a look knows the fleet's bound);
        the hold may use a larger prefetch only once this is committed."""
        prefetch = self.bounds.prefetch
        if self.permit is not None:
            self.permit.asked.clear()
            prefetch = self.permit.claim()
            self.bounds = dataclasses.replace(self.bounds, prefetch=prefetch)
        await self.store.reconcile.report_holds(
            self.worker_id,
            self.holdings() if holds is None else holds,
            prefetch=prefetch,
            keep=self.bounds.keep,
        )
        if self.permit is not None:
            self.permit.confirmed(prefetch)

    async def sweep_starting(self, queue: str, tenant: str, taking: int) -> None:
        """An aging sweep here is about to take up to ``taking`` ready messages of the queue
        for a moment: recorded first, so no look counts them lost (``QueueSweeper.on_sweep``)."""
        await self.store.reconcile.record_sweep(
            self.worker_id, queue, tenant, taking, window=SWEEP_SECONDS + self.bounds.max_age
        )

    async def _clear_report(self) -> None:
        try:
            await self.report_holdings({})
        except UNAVAILABLE as exc:  # it ages out: passes ignore reports older than a look
            log.info("holdings_report_not_cleared", error=str(exc))

    # --- one pass -------------------------------------------------------------------------

    async def reconcile_once(self, *, force: bool = False) -> PassResult | None:
        """One look at every queue with waiting jobs, unless another worker is at it or looked
        less than most of an interval ago (``force``: look anyway, a queue was deleted); the
        gauges follow the latest looks either way."""

        async def work(tx: ReconcilePass) -> PassResult | None:
            if not force and tx.last_look is not None:
                since = (tx.started - tx.last_look).total_seconds()
                if since < self.interval * 0.8:
                    return None
            return await self._pass(tx)

        result = await self.store.reconcile.run_pass(work)
        if result is None:
            self.metrics.reconcile_passes.labels("skipped").inc()
        else:
            self.metrics.reconcile_passes.labels("reconciled").inc()
            for pair in result.missing:
                await self._redeclare(pair, "missing")
        self._set_lane_gauge(await self.store.reconcile.list_queue_looks())
        return result

    async def _pass(self, tx: ReconcilePass) -> PassResult:
        pairs = await tx.pairs()
        loop = asyncio.get_running_loop()
        began = loop.time()
        measured: dict[Pair, QueueCounts | None] = {}
        counted_at: dict[Pair, datetime] = {}
        for pair in pairs:
            measured[pair] = await self._queue_counts(*pair)
            # on PostgreSQL's clock: the pass's start plus the time since (a report must be
            # computed after the count to cover what the count missed)
            counted_at[pair] = tx.started + timedelta(seconds=loop.time() - began + COUNT_MARGIN)
        # after the broker's counts: see the module doc
        counts = await tx.counts(report_age=self.bounds.max_age, sweep_seconds=SWEEP_SECONDS)
        records: list[LookRecord] = []
        republished: dict[str, int] = {}
        for pair, found in measured.items():
            waiting = counts.get(pair)
            verdict = judge(found, waiting, started=tx.started, bounds=self.bounds)
            if not self._history_kept(waiting, tx.started):
                record = await self._record(tx, pair, found, waiting, verdict)
                records.append(dataclasses.replace(record, counted_at=counted_at[pair]))
            if waiting is not None and verdict.rule is not None:
                made_due = await self._republish(tx, pair, found, waiting, verdict)
                republished[verdict.rule] = republished.get(verdict.rule, 0) + made_due
        await tx.save(records, forget_after=self.bounds.max_age * 4)
        missing = [pair for pair, found in measured.items() if found is None]
        return PassResult(republished, missing, len(measured))

    async def _queue_counts(self, queue: str, tenant: str) -> QueueCounts | None:
        """A (lane, tenant)'s ready messages and consumers: in quorum mode, summed over its
        priority bands' queues (each consumer holds up to its prefetch, so the unacked bound
        is the sum's consumers x prefetch); None if any band queue is missing (all are
        declared again)."""
        ready = consumers = 0
        for name in self.topology.job_queues(queue, tenant):
            counts = await self.broker.queue_counts(name)
            if counts is None:
                return None
            ready += counts.ready
            consumers += counts.consumers
        return QueueCounts(ready, consumers)

    @staticmethod
    async def _record(
        tx: ReconcilePass,
        pair: Pair,
        found: QueueCounts | None,
        waiting: WaitingCount | None,
        verdict: Verdict,
    ) -> LookRecord:
        """This look, for the next one: its counts and up to when its suspects were confirmed."""
        suspects = await tx.suspects(*pair, verdict.suspects) if verdict.suspects > 0 else None
        return LookRecord(
            queue=pair[0],
            tenant=pair[1],
            ready=None if found is None else found.ready,
            consumers=None if found is None else found.consumers,
            waiting=0 if waiting is None else waiting.waiting,
            deficit=verdict.deficit,
            suspects=suspects,
        )

    async def _republish(
        self,
        tx: ReconcilePass,
        pair: Pair,
        found: QueueCounts | None,
        waiting: WaitingCount,
        verdict: Verdict,
    ) -> int:
        if not verdict.republish or verdict.confirmed_by is None or verdict.rule is None:
            return 0
        ids = await tx.republish(*pair, confirmed_by=verdict.confirmed_by, limit=verdict.republish)
        if ids:
            self.metrics.reconcile_republished.labels(verdict.rule).inc(len(ids))
            log.warning(
                "reconcile_republished",
                queue=pair[0],
                tenant=pair[1],
                rule=verdict.rule,
                count=len(ids),
                ready=None if found is None else found.ready,
                consumers=None if found is None else found.consumers,
                waiting=waiting.waiting,
                held=waiting.held,
            )
        return len(ids)

    def _history_kept(self, waiting: WaitingCount | None, started: datetime) -> bool:
        """Whether this look leaves the previous one in place: it is younger than the gap a
        rule needs, so the next look still compares with it (a woken pass, a quick retry)."""
        if waiting is None or waiting.previous_look is None:
            return False
        return (started - waiting.previous_look).total_seconds() < self.bounds.min_gap

    def _set_lane_gauge(self, looks: list[QueueLook]) -> None:
        lanes = lane_consumers(looks, self.bounds.max_age)
        gauge = self.metrics.lane_consumers
        for lane, consumers in lanes.items():
            gauge.labels(lane).set(consumers)
        for labels in list(self._lanes_shown - lanes.keys()):
            with contextlib.suppress(KeyError):
                gauge.remove(labels)
        self._lanes_shown = set(lanes)
