"""Prometheus metrics for the worker, and the small HTTP server behind `/metrics` and the probes.

Every metric lives on a `CollectorRegistry` passed in (tests get a fresh one;
nothing is registered at import). Labels are bounded: queue, job type, outcome
and a few fixed cause codes. Values that live elsewhere (queue depth, oldest
job age) are read at scrape time through `Metrics.add_scrape_callback`.

The server is a deliberately tiny HTTP/1.1 responder on `asyncio.start_server`:
three read-only paths do not justify a web framework in the worker, and it
runs on the worker's own event loop so the probes reflect that loop's health.
"""

from __future__ import annotations

import asyncio
import errno
import json
import platform
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from coldbrew.batching import GroupCommit
from coldbrew.crontab import TICK_OUTCOMES, parse_tick_id
from coldbrew.errors import ConfigurationError
from coldbrew.model import Status

if TYPE_CHECKING:
    from coldbrew.procpool import ProcessPool

__all__ = [
    "API_BUCKETS",
    "BREAKER_STATES",
    "DURATION_BUCKETS",
    "OUTCOMES",
    "RECONCILE_RULES",
    "REDELIVERY_CAUSES",
    "RELAY_CAUSES",
    "SCHEDULED_DELIVERIES",
    "WAITER_KINDS",
    "WEBHOOK_OUTCOMES",
    "ApiMetrics",
    "JobHandles",
    "Metrics",
    "MetricsServer",
    "Outcome",
    "ScrapeCallback",
    "coldbrew_version",
    "init_build_info",
]

Outcome = Literal["succeeded", "failed", "retrying", "dead", "cancelled", "fenced", "released"]
OUTCOMES: Final[tuple[Outcome, ...]] = (
    "succeeded",
    "failed",
    "retrying",
    "dead",
    "cancelled",
    "fenced",
    "released",
)
REDELIVERY_CAUSES: Final = (
    "broker_flag",
    "aging_sweep",
    "duplicate",
    "lease_expired",
    "worker_lost",
)
RELAY_CAUSES: Final = ("submission", "retry", "lease_expired", "replay", "scheduled")
SCHEDULED_DELIVERIES: Final = ("deferred", "early")
"""What became of a delivery that asked for, or arrived before, its job's run_at."""
RECONCILE_RULES: Final = ("count", "idle")
BreakerState = Literal["closed", "half_open", "open"]
BREAKER_STATES: Final[Mapping[BreakerState, int]] = MappingProxyType(
    {"closed": 0, "half_open": 1, "open": 2}
)

# Seconds, from 1 ms thumbnails to hour-long transcodes: roughly 1-2.5-5 per
# decade below a minute, then minutes, so both ends keep useful resolution.
DURATION_BUCKETS: Final = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 30.0),
    *(60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0),
)

ScrapeCallback = Callable[[], Iterable[tuple[Sequence[str], float]]]
"""Returns ``(label_values, value)`` pairs; called synchronously during every scrape."""

_PREFIX: Final = "coldbrew_"


@dataclass(frozen=True, slots=True)
class JobHandles:
    """The labelled children for one ``(queue, type)``, resolved once.

    ``Counter.labels()`` takes a lock and builds a tuple per call; at thousands
    of jobs per second the worker uses these instead.
    """

    started: Counter
    duration: Histogram
    retries: Counter
    finished: Mapping[str, Counter]
    start_latency: Histogram

    def finish(self, outcome: Outcome | Status, seconds: float | None = None) -> None:
        """Count the outcome (a final ``Status`` is its own label) and, when the job
        ran, observe how long it took."""
        self.finished[outcome].inc()
        if seconds is not None:
            self.duration.observe(seconds)


WEBHOOK_OUTCOMES: Final = ("delivered", "retried", "refused", "blocked", "gave_up")
"""coldbrew_webhook_deliveries_total's outcomes (renamed from coldbrew_api_webhooks_total)."""


class Metrics:
    """All of coldbrew's metrics, registered on ``registry``.

    Counters and gauges are public attributes; call ``.labels(...)`` on them
    off the hot path, and use `job_handles` on it.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._init_job_metrics(registry)
        self._init_delivery_metrics(registry)
        self._init_fleet_metrics(registry)
        self._init_intake_metrics(registry)
        self._init_reconcile_metrics(registry)
        self._init_unique_metrics(registry)
        self._init_cron_metrics(registry)
        self._init_dead_letter_metrics(registry)
        init_build_info(registry)
        self._init_ratelimit_metrics(registry)
        self._init_scheduled_metrics(registry)
        self._init_webhook_metrics(registry)
        self._init_prune_metrics(registry)
        self._handles: dict[tuple[str, str], JobHandles] = {}
        # Known label values exist from the start, so rate() sees the first increment.
        for cause in REDELIVERY_CAUSES:
            self.redeliveries.labels(cause=cause)
        for cause in RELAY_CAUSES:
            self.relay_published.labels(cause=cause)
        for outcome in SCHEDULED_DELIVERIES:
            self.scheduled_deliveries.labels(outcome=outcome)

    def _init_webhook_metrics(self, reg: CollectorRegistry) -> None:
        """Webhook delivery attempts (coldbrew/webhooks/delivery.py; each is a job's attempt)."""
        self.webhook_deliveries = Counter(
            "coldbrew_webhook_deliveries_total",
            "Webhook delivery attempts by outcome: delivered (2xx), retried (a network error, "
            "a time-out, 408/425/429 or 5xx, and attempts remain), refused (3xx or another "
            "4xx: not retried, the delivery job failed), blocked (the SSRF guard refused the "
            "address: no connection made), gave_up (the last attempt failed: the delivery "
            "job is dead).",
            ["outcome"],
            registry=reg,
        )
        for outcome in WEBHOOK_OUTCOMES:
            self.webhook_deliveries.labels(outcome)

    def _init_scheduled_metrics(self, reg: CollectorRegistry) -> None:
        """Scheduled jobs and snoozes (the ``coldbrew_jobs_scheduled`` gauge is stats.py's)."""
        self.jobs_snoozed = Counter(
            "coldbrew_jobs_snoozed_total",
            "Attempts that ended in a snooze (raise/return Snooze): scheduled again, no attempt "
            "spent.",
            ["type"],
            registry=reg,
        )
        self.scheduled_deliveries = Counter(
            "coldbrew_scheduled_deliveries_total",
            "Deliveries about scheduled jobs, acked without running: deferred (a raw message "
            "with x-run-at or x-delay-seconds, recorded as scheduled) or early (a delivery of a "
            "scheduled job before its run_at).",
            ["outcome"],
            registry=reg,
        )

    def _init_job_metrics(self, reg: CollectorRegistry) -> None:
        self.jobs_started = Counter(
            "coldbrew_jobs_started_total",
            "Job attempts started.",
            ["queue", "type"],
            registry=reg,
        )
        self.jobs_finished = Counter(
            "coldbrew_jobs_finished_total",
            "Job attempts finished, by outcome.",
            ["queue", "type", "outcome"],
            registry=reg,
        )
        self.job_duration = Histogram(
            "coldbrew_job_duration_seconds",
            "Wall time of one job attempt.",
            ["type"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.job_start_latency = Histogram(
            "coldbrew_job_start_latency_seconds",
            "Seconds from when a job became due (created, or its run_at when scheduled or "
            "retried) to its start, per attempt (PostgreSQL's clock for both).",
            ["queue", "type"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.jobs_in_flight = Gauge(
            "coldbrew_jobs_in_flight", "Jobs this worker is running now.", registry=reg
        )
        self.retries = Counter(
            "coldbrew_retries_total", "Attempts that will be retried.", ["type"], registry=reg
        )

    def _init_delivery_metrics(self, reg: CollectorRegistry) -> None:
        self.duplicate_deliveries = Counter(
            "coldbrew_duplicate_deliveries_total",
            "Deliveries of a job already running elsewhere or finished; acked, not run.",
            ["queue"],
            registry=reg,
        )
        self.redeliveries = Counter(
            "coldbrew_redeliveries_total",
            "Deliveries seen again, by cause.",
            ["cause"],
            registry=reg,
        )
        self.dead_letters = Counter(
            "coldbrew_dead_letters_total",
            "Deprecated (removed in the next release): rejected messages and dead jobs in one "
            "counter; use coldbrew_rejected_messages_total and coldbrew_jobs_dead_total.",
            ["reason"],
            registry=reg,
        )
        self.fenced_writes = Counter(
            "coldbrew_fenced_writes_total",
            "Writes that found the row moved on (another attempt or status) and changed nothing.",
            ["operation"],
            registry=reg,
        )

    def _init_fleet_metrics(self, reg: CollectorRegistry) -> None:
        """Leases, the relay, tenant provisioning: this worker's part in the fleet's upkeep."""
        self.lease_extensions = Counter(
            "coldbrew_lease_extensions_total", "Leases extended by heartbeats.", registry=reg
        )
        self.leases_lost = Counter(
            "coldbrew_leases_lost_total",
            "In-flight jobs whose lease this worker no longer holds.",
            registry=reg,
        )
        self.workers_lost = Counter(
            "coldbrew_workers_lost_total",
            "Workers this worker found dead (their PostgreSQL session ended) and whose "
            "running jobs it released at once.",
            registry=reg,
        )
        self.heartbeat_lag = Gauge(
            "coldbrew_heartbeat_lag_seconds",
            "How late the last heartbeat ran against its schedule.",
            registry=reg,
        )
        self.relay_published = Counter(
            "coldbrew_relay_published_total",
            "Due rows the relay published, by cause.",
            ["cause"],
            registry=reg,
        )
        self.tenants_provisioned = Counter(
            "coldbrew_tenants_provisioned_total",
            "Tenant queues this worker declared on first use.",
            registry=reg,
        )

    def _init_intake_metrics(self, reg: CollectorRegistry) -> None:
        """What happens to deliveries before they run: clamped, capped, handed back, swept."""
        self.priority_clamped = Counter(
            "coldbrew_priority_clamped_total",
            "Messages whose priority was outside 0-9 and was clamped.",
            registry=reg,
        )
        self.trace_headers_ignored = Counter(
            "coldbrew_trace_headers_ignored_total",
            "Messages whose traceparent/tracestate header was malformed and ignored "
            "(the job ran without it), by reason.",
            ["reason"],
            registry=reg,
        )
        self.cap_waits = Counter(
            "coldbrew_cap_waits_total",
            "Claims that found a fleet-wide cap full; the delivery was held, not run.",
            ["scope"],
            registry=reg,
        )
        self.held_requeued = Counter(
            "coldbrew_held_requeued_total",
            "Waiting deliveries handed back to RabbitMQ before its consumer_timeout.",
            registry=reg,
        )
        self.consumer_pauses = Counter(
            "coldbrew_consumer_pauses_total",
            "Times the tenant queues' consumers were cancelled because every slot was busy and "
            "the worker held what it will start within COLDBREW_HOLD_SECONDS.",
            registry=reg,
        )
        self.consumer_prefetch = Gauge(
            "coldbrew_consumer_prefetch",
            "Deliveries each tenant queue's consumer may hold unacked now (0: paused).",
            registry=reg,
        )
        self.aging_sweeps = Counter(
            "coldbrew_aging_sweeps_total",
            "Looks past a queue's head for jobs held back behind higher priorities, by result "
            "(kept: found some; none_held_back; empty: nothing ready).",
            ["result"],
            registry=reg,
        )
        self.aging_swept = Counter(
            "coldbrew_aging_swept_total",
            "Messages taken by aging sweeps: kept to run (held back too long) or returned.",
            ["fate"],
            registry=reg,
        )
        self.claim_acks = Counter(
            "coldbrew_claim_acks_total",
            "Asynchronously committed claims whose delivery was settled, by how: covered "
            "(a later commit flushed it), barrier, verified (survived a PostgreSQL restart), "
            "superseded (the row moved on; acked), lost (requeued; the job runs again), "
            "unsettled (the worker stopped before it knew; requeued).",
            ["how"],
            registry=reg,
        )
        self.breaker_state = Gauge(
            "coldbrew_breaker_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open.",
            ["name"],
            registry=reg,
        )

    def _init_unique_metrics(self, reg: CollectorRegistry) -> None:
        """Unique jobs (unique.py): submissions that returned an existing job."""
        self.unique_duplicates = Counter(
            "coldbrew_unique_duplicates_total",
            "Submissions of a unique job type that found a job holding their key and "
            "returned it instead of creating one, by type and source (client: a Client, so "
            "coldbrew submit and the API; amqp: a raw delivery a worker acked).",
            ["type", "source"],
            registry=reg,
        )

    def _init_ratelimit_metrics(self, reg: CollectorRegistry) -> None:
        """Fleet-wide rate limits: claims that found no token, and the deliveries waiting."""
        self.rate_limited = Counter(
            "coldbrew_rate_limited_total",
            "Claims that found a rate limit's bucket empty; the delivery waited for its token "
            "(scope: tenant, type or key), holding no job slot.",
            ["scope"],
            registry=reg,
        )
        self.rate_waiting = Gauge(
            "coldbrew_rate_waiting",
            "Deliveries held here waiting for a rate limit's token.",
            registry=reg,
        )
        self.rate_wait_seconds = Histogram(
            "coldbrew_rate_wait_seconds",
            "The wait a refused rate-limited claim was told (until its token is due).",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120, 600),
            registry=reg,
        )
        for scope in ("tenant", "type", "key"):
            self.rate_limited.labels(scope=scope)

    def _init_reconcile_metrics(self, reg: CollectorRegistry) -> None:
        self.reconcile_passes = Counter(
            "coldbrew_reconcile_passes_total",
            "Reconcile passes this worker tried, by result (reconciled: it looked at the "
            "queues; skipped: another worker's pass held the lock or had just looked).",
            ["result"],
            registry=reg,
        )
        self.reconcile_republished = Counter(
            "coldbrew_reconcile_republished_total",
            "Waiting jobs whose message could not be in their queue, made due for the relay "
            "again, by rule (count: fewer messages than rows beyond what consumers can hold, "
            "at two looks; idle: an empty queue at two looks, beyond what workers hold).",
            ["rule"],
            registry=reg,
        )
        self.queues_redeclared = Counter(
            "coldbrew_queues_redeclared_total",
            "Tenant queues declared and bound again after the broker lost them, by how that "
            "was seen (cancelled: the broker cancelled our consumer; missing: a reconcile look).",
            ["cause"],
            registry=reg,
        )
        self.lane_consumers = Gauge(
            "coldbrew_lane_consumers",
            "Consumers of each lane at the latest reconcile look (the most on any of its "
            "tenant queues); 0 while jobs wait means no running worker serves the lane.",
            ["lane"],
            registry=reg,
        )
        self.rejected_jobs_failed = Counter(
            "coldbrew_rejected_jobs_failed_total",
            "Waiting jobs failed because the worker rejected their message, by reason.",
            ["reason"],
            registry=reg,
        )
        for rule in RECONCILE_RULES:
            self.reconcile_republished.labels(rule=rule)
        for result in ("reconciled", "skipped"):
            self.reconcile_passes.labels(result=result)

    def _init_prune_metrics(self, reg: CollectorRegistry) -> None:
        # worker/prune.py: table is jobs, job_once, job_unique, job_aliases (status: the
        # pruned job's), rejected_messages or rate_buckets (status "any")
        self.pruned_rows = Counter(
            "coldbrew_pruned_rows_total",
            "Rows the prune service deleted past their retention, by table and job status.",
            ["table", "status"],
            registry=reg,
        )
        self.prune_last_success = Gauge(
            "coldbrew_prune_last_success_timestamp_seconds",
            "When this worker last finished a prune pass (Unix time; 0: never). One worker "
            "of the fleet prunes at a time: take the max over workers.",
            registry=reg,
        )
        self.prune_failures = Counter(
            "coldbrew_prune_failures_total",
            "Prune passes that failed (logged as prune_failed, retried after a backoff).",
            registry=reg,
        )

    def _init_cron_metrics(self, reg: CollectorRegistry) -> None:
        self.cron_ticks = Counter(
            "coldbrew_cron_ticks_total",
            "Cron ticks decided by this worker, by schedule and outcome (fired: on time; "
            "caught_up: missed during an outage, run by the catch_up policy; skipped: missed "
            "and dropped by it). Each tick is decided by one worker of the fleet: sum them.",
            ["schedule", "outcome"],
            registry=reg,
        )
        self.cron_start_lag = Histogram(
            "coldbrew_cron_start_lag_seconds",
            "Seconds from a cron tick to its job's first start (PostgreSQL's clock for both).",
            ["schedule"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.cron_last_tick = Gauge(
            "coldbrew_cron_last_tick_timestamp_seconds",
            "The latest tick this worker decided, per schedule (Unix time; max over workers).",
            ["schedule"],
            registry=reg,
        )
        self.cron_next_tick = Gauge(
            "coldbrew_cron_next_tick_timestamp_seconds",
            "The earliest tick not yet decided, per schedule, as this worker's cron loop last "
            "saw it (Unix time; min over workers). Well in the past: ticks are being missed.",
            ["schedule"],
            registry=reg,
        )
        # label values come from declarations only: a producer may send any "cron:" id
        self._cron_schedules: set[str] = set()

    def declare_cron_schedule(self, schedule: str) -> None:
        """Make a schedule's series exist from the start, so rate() sees the first tick."""
        self._cron_schedules.add(schedule)
        for outcome in TICK_OUTCOMES:
            self.cron_ticks.labels(schedule=schedule, outcome=outcome)

    def observe_cron_start(self, job_id: str, started_at: datetime) -> None:
        """The start lag of a cron tick's job (a job id of ``crontab.tick_job_id``)."""
        parsed = parse_tick_id(job_id)
        if parsed is not None and parsed[0] in self._cron_schedules:
            schedule, tick = parsed
            lag = (started_at - tick).total_seconds()
            self.cron_start_lag.labels(schedule=schedule).observe(max(0.0, lag))

    def _init_dead_letter_metrics(self, reg: CollectorRegistry) -> None:
        """Rejected messages and dead jobs, apart: a broken producer is not a failing job.

        ``coldbrew_dead_letters_total`` (deprecated) still counts both, as it
        did; ``rejected`` and ``job_dead`` keep it in step (one call, two counters).
        """
        self.rejected_messages = Counter(
            "coldbrew_rejected_messages_total",
            "Messages that broke the message contract (not JSON, unknown type, bad arguments, "
            "data PostgreSQL cannot store...), stored as rejected and acked, by reason.",
            ["reason"],
            registry=reg,
        )
        # not coldbrew_dead_jobs_total: the fleet gauge coldbrew_dead_jobs (stats.py) owns
        # that family name, and a counter named so would collide with it
        self.jobs_dead = Counter(
            "coldbrew_jobs_dead_total",
            "Jobs that became dead (out of attempts, a lease lost for the last time, "
            "refused outright), by reason.",
            ["reason"],
            registry=reg,
        )

    def rejected(self, reason: str) -> None:
        """A message broke the contract: counted as rejected (and as a dead letter)."""
        self.rejected_messages.labels(reason).inc()
        self.dead_letters.labels(reason).inc()

    def job_dead(self, reason: str) -> None:
        """A job became dead: counted as dead (and as a dead letter)."""
        self.jobs_dead.labels(reason).inc()
        self.dead_letters.labels(reason).inc()

    def job_handles(self, queue: str, type: str) -> JobHandles:
        """Return the cached labelled children for a registered job type on a queue.

        Only call it with registered types and declared queues: every distinct
        pair becomes a set of series that lives as long as the process.
        """
        key = (queue, type)
        handles = self._handles.get(key)
        if handles is None:
            finished: dict[str, Counter] = {
                o: self.jobs_finished.labels(queue, type, o) for o in OUTCOMES
            }
            handles = JobHandles(
                started=self.jobs_started.labels(queue, type),
                duration=self.job_duration.labels(type),
                retries=self.retries.labels(type),
                finished=MappingProxyType(finished),
                start_latency=self.job_start_latency.labels(queue, type),
            )
            self._handles[key] = handles
        return handles

    def set_breaker_state(self, name: str, state: BreakerState) -> None:
        """Publish a circuit breaker's state as 0/1/2 so it can be graphed and alerted on."""
        self.breaker_state.labels(name=name).set(BREAKER_STATES[state])

    def add_scrape_callback(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        fn: ScrapeCallback,
        *,
        counter: bool = False,
    ) -> None:
        """Expose a gauge (or, with ``counter``, a counter) family that ``fn`` fills at each scrape.

        For values that are expensive to keep current but cheap to read when
        asked (queue depth, oldest job age). ``fn`` runs synchronously during
        the scrape, so it should return a cached snapshot, not do I/O. If it
        raises, the family is left out of that scrape and the error is logged.
        """
        if not name.startswith(_PREFIX):
            raise ValueError(f"metric name {name!r} must start with {_PREFIX!r}")
        self.registry.register(
            _CallbackCollector(name, documentation, tuple(labelnames), fn, counter=counter)
        )

    def watch_worker(
        self,
        *,
        ready: Callable[[], bool],
        database_up: Callable[[], bool],
        broker_up: Callable[[], bool],
        slots: int,
    ) -> None:
        """``coldbrew_worker_ready``, ``coldbrew_database_up``, ``coldbrew_broker_up``: 1 or 0.

        The probes answer a kubelet; alerts need the same facts as series, so
        "not ready", "PostgreSQL unreachable" and "RabbitMQ unreachable" are
        told apart from "the worker is down" (Prometheus's own ``up``).
        ``coldbrew_worker_slots`` (its concurrency) is the c of utilisation
        rho = in flight / slots, summed over the fleet.
        """
        checks = (
            ("coldbrew_worker_ready", "1 while /readyz answers 200 (consuming, reachable).", ready),
            (
                "coldbrew_database_up",
                "1 while this worker's PostgreSQL probe succeeds.",
                database_up,
            ),
            ("coldbrew_broker_up", "1 while this worker's RabbitMQ connection is open.", broker_up),
        )
        for name, doc, check in checks:
            self.add_scrape_callback(name, doc, [], _as_series(check))
        self.add_scrape_callback(
            "coldbrew_worker_slots",
            "Jobs this worker may run at once (COLDBREW_CONCURRENCY).",
            [],
            lambda: [((), float(slots))],
        )

    def watch_group_commits(self, batchers: Iterable[GroupCommit[Any, Any]]) -> None:
        """Batches and items per group-commit writer: items / batches is the mean batch.

        Read from the writers' own counts at scrape time, so the hot path pays nothing.
        """
        writers = tuple(batchers)
        self.add_scrape_callback(
            "coldbrew_group_commit_batches",
            "Statements written by group commit, by writer (claim, complete, release).",
            ["writer"],
            lambda: [((b.name,), b.batches) for b in writers],
            counter=True,
        )
        self.add_scrape_callback(
            "coldbrew_group_commit_items",
            "Items written by group commit, by writer; divided by batches: the mean batch.",
            ["writer"],
            lambda: [((b.name,), b.items) for b in writers],
            counter=True,
        )

    def watch_process_pool(self, pool: ProcessPool) -> None:
        """Process-pool children replaced, by reason, read from the pool's counts at scrape time.

        ``memory``: killed over ``COLDBREW_PROCESS_MAX_MEMORY_MB``; ``max_jobs``:
        recycled after ``COLDBREW_PROCESS_MAX_JOBS``; ``timeout``, ``cancelled``:
        killed to stop their job; ``crashed``: died on their own. Every reason
        is reported from the start, so rate() sees the first one.
        """
        self.add_scrape_callback(
            "coldbrew_pool_children_replaced",
            "Process-pool children replaced by a fresh one, by reason (memory: over "
            "COLDBREW_PROCESS_MAX_MEMORY_MB; max_jobs: recycled; timeout; cancelled; crashed).",
            ["reason"],
            lambda: [((reason,), count) for reason, count in pool.replaced.items()],
            counter=True,
        )
        self.add_scrape_callback(
            "coldbrew_pool_children",
            "Process-pool children able to take jobs.",
            [],
            lambda: [((), pool.alive)],
        )


# --- coldbrew api (api/instrument.py) ----------------------------------

# Request latency: most answers take milliseconds; long polls and event streams
# are held up to minutes, so the top buckets tell a held request from a slow one.
API_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WAITER_KINDS: Final = ("long_poll", "event_stream")


class ApiMetrics:
    """The metrics of one ``coldbrew api`` process, registered on ``registry``.

    Routes are labelled by their template (``/jobs/{job_id}``), never the raw
    path, and methods outside HTTP's registered few as ``other``: no request
    can add a series of its own.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        init_build_info(registry)
        self._init_api_metrics(registry)

    def _init_api_metrics(self, reg: CollectorRegistry) -> None:
        self.requests = Counter(
            "coldbrew_api_requests_total",
            "HTTP requests answered, by route template (unmatched: no route), method and status.",
            ["route", "method", "status"],
            registry=reg,
        )
        self.request_seconds = Histogram(
            "coldbrew_api_request_seconds",
            "Time from a request's arrival to the end of its answer (long polls and event "
            "streams included: they are held open), by route template and method.",
            ["route", "method"],
            buckets=API_BUCKETS,
            registry=reg,
        )

    def watch_waiters(self, open_waiters: Callable[[], Mapping[str, int]]) -> None:
        """``coldbrew_api_open_waiters{kind}``: long polls and event streams open now."""

        def series() -> list[tuple[Sequence[str], float]]:
            counts = open_waiters()
            return [((kind,), counts.get(kind, 0)) for kind in WAITER_KINDS]

        self.registry.register(
            _CallbackCollector(
                "coldbrew_api_open_waiters",
                "Long polls (kind long_poll) and event streams (event_stream) open now; "
                "together at most COLDBREW_API_MAX_WAITERS.",
                ("kind",),
                series,
            )
        )


def _as_series(check: Callable[[], bool]) -> ScrapeCallback:
    """A yes/no check as one unlabelled series: 1.0 or 0.0."""
    return lambda: [((), 1.0 if check() else 0.0)]


def init_build_info(registry: CollectorRegistry) -> Gauge:
    """``coldbrew_build_info{version,python} 1``: which build every component runs.

    The usual Prometheus idiom: join on it (``* on(instance) group_left(version)``)
    to see a rollout's progress, or alert on two versions serving at once.
    """
    info = Gauge(
        "coldbrew_build_info",
        "Always 1; the labels say which coldbrew and which Python this process runs.",
        ["version", "python"],
        registry=registry,
    )
    info.labels(version=coldbrew_version(), python=platform.python_version()).set(1)
    return info


def coldbrew_version() -> str:
    """The installed coldbrew's version (the ``workers`` row and ``coldbrew_build_info``)."""
    try:
        return metadata.version("coldbrew")
    except metadata.PackageNotFoundError:
        return "unknown"


class _CallbackCollector:
    """A custom collector: one gauge or counter family filled by a callback at scrape time."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        fn: ScrapeCallback,
        *,
        counter: bool = False,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = labelnames
        self._fn = fn
        self._family = CounterMetricFamily if counter else GaugeMetricFamily

    def describe(self) -> list[Metric]:
        """Declare the family's name so the registry rejects a duplicate at registration."""
        return [self._family(self._name, self._documentation, labels=self._labelnames)]

    def collect(self) -> list[Metric]:
        family = self._family(self._name, self._documentation, labels=self._labelnames)
        try:
            for label_values, value in self._fn():
                family.add_metric(self._check_labels(label_values), float(value))
        except Exception:  # noqa: BLE001 - a broken gauge must not take the other metrics down
            structlog.get_logger("coldbrew.metrics").warning(
                "scrape_callback_failed", metric=self._name, exc_info=True
            )
            return []
        return [family]

    def _check_labels(self, label_values: Sequence[str]) -> list[str]:
        if len(label_values) != len(self._labelnames):
            raise ValueError(
                f"expected {len(self._labelnames)} label values, got {len(label_values)}"
            )
        return [str(v) for v in label_values]


# --- the HTTP server ---------------------------------------------------------

HealthCheck = Callable[[], tuple[bool, str]]

_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_PATHS: Final = frozenset({"/metrics", "/healthz", "/readyz"})
_JSON: Final = "application/json"
_TEXT: Final = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: str
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class _Response:
    status: int
    content_type: str
    body: bytes
    extra_headers: tuple[tuple[str, str], ...] = ()


def _text(status: int, message: str) -> _Response:
    return _Response(status, _TEXT, f"{message}\n".encode())


def _parse_head(head: bytes) -> _Request | None:
    """Parse a request line and headers; ``None`` means malformed (400)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return None
    method, target, version = parts
    if not _TOKEN.fullmatch(method) or not target.startswith("/"):
        return None
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            return None
        headers[name.lower()] = value.strip(" \t")
    return _Request(method, target.split("?", 1)[0], headers)


class MetricsServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` for one worker.

    ``is_healthy`` answers "should this process be restarted?" (liveness) and
    ``is_ready`` "should it get work?" (readiness); each returns ``(ok, reason)``.
    Every response closes the connection: scrapers and probes open one per
    request anyway, and it keeps the server free of keep-alive state.
    """

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        *,
        is_healthy: HealthCheck,
        is_ready: HealthCheck,
        ready_details: Callable[[], Mapping[str, str]] | None = None,
        read_timeout: float = 5.0,
        max_header_bytes: int = 8192,
    ) -> None:
        self._host = host
        self._port = port
        self._registry = registry
        self._is_healthy = is_healthy
        self._is_ready = is_ready
        self._ready_details = ready_details  # added to /readyz's body (which nodes)
        self._read_timeout = read_timeout
        self._max_header_bytes = max_header_bytes
        self._server: asyncio.Server | None = None
        self._closing = False
        self._connections: set[asyncio.Task[Any]] = set()

    @property
    def port(self) -> int:
        """The port listened on; the real one after `start` when configured as 0."""
        if self._server is not None and self._server.sockets:
            return int(self._server.sockets[0].getsockname()[1])
        return self._port

    async def start(self) -> None:
        """Listen; returns once connections are accepted.

        Raises `ConfigurationError` when the address cannot be bound, because
        the usual cause is a second worker on the same host and port.
        """
        if self._server is not None or self._closing:
            raise RuntimeError("a metrics server starts once")
        try:
            self._server = await asyncio.start_server(
                self._handle, self._host, self._port, limit=self._max_header_bytes
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigurationError(
                    f"metrics port {self._port} on {self._host} is already in use; "
                    "set COLDBREW_METRICS_PORT to a free port (0 picks one)"
                ) from exc
            raise ConfigurationError(
                f"cannot listen for metrics on {self._host}:{self._port} ({exc}); "
                "check COLDBREW_METRICS_HOST and COLDBREW_METRICS_PORT"
            ) from exc

    async def close(self) -> None:
        """Stop listening and drop open connections; safe to call twice."""
        server, self._server = self._server, None
        if server is None:
            return
        self._closing = True
        server.close()
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> MetricsServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one request; never lets an exception escape into the event loop."""
        task = asyncio.current_task()
        if self._closing or task is None:
            writer.close()
            return
        self._connections.add(task)
        try:
            request, response = await self._read_and_respond(reader)
            if response is not None:
                with_body = request is None or request.method != "HEAD"
                await self._send(writer, response, with_body=with_body)
        except Exception as exc:  # noqa: BLE001 - one bad connection must not reach the loop
            structlog.get_logger("coldbrew.metrics").debug(
                "metrics_connection_failed", error=repr(exc)
            )
        finally:
            self._connections.discard(task)
            writer.close()

    async def _read_and_respond(
        self, reader: asyncio.StreamReader
    ) -> tuple[_Request | None, _Response | None]:
        try:
            async with asyncio.timeout(self._read_timeout):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            return None, _text(408, "request timeout")
        except asyncio.LimitOverrunError:
            return None, _text(431, f"request head over {self._max_header_bytes} bytes")
        except asyncio.IncompleteReadError:
            return None, None  # the client went away before finishing its request
        request = _parse_head(head)
        if request is None:
            return None, _text(400, "malformed request")
        return request, self._route(request)

    def _route(self, request: _Request) -> _Response:
        if request.path not in _PATHS:
            return _text(404, "not found")
        if request.method not in ("GET", "HEAD"):
            return _Response(405, _TEXT, b"method not allowed\n", (("Allow", "GET, HEAD"),))
        if request.path == "/metrics":
            return self._render_metrics(request.headers.get("accept", ""))
        if request.path == "/healthz":
            return _probe(self._is_healthy)
        return _probe(self._is_ready, self._ready_details)

    def _render_metrics(self, accept: str) -> _Response:
        """Render in the format the scraper asked for (text 0.0.4 unless it wants OpenMetrics)."""
        encoder, content_type = choose_encoder(accept)
        try:
            body = encoder(self._registry)
        except Exception:  # noqa: BLE001 - answer 500 rather than drop the connection
            structlog.get_logger("coldbrew.metrics").warning("metrics_render_failed", exc_info=True)
            return _text(500, "metrics collection failed")
        return _Response(200, content_type, body)

    async def _send(
        self, writer: asyncio.StreamWriter, response: _Response, *, with_body: bool
    ) -> None:
        """Write the response; a HEAD gets the same headers, Content-Length included, no body."""
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            ("Connection", "close"),
            *response.extra_headers,
        ]
        reason = _REASONS.get(response.status, "Unknown")
        lines = [f"HTTP/1.1 {response.status} {reason}"]
        lines += [f"{name}: {value}" for name, value in headers]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        writer.write(head + response.body if with_body else head)
        async with asyncio.timeout(self._read_timeout):
            await writer.drain()


def _probe(check: HealthCheck, details: Callable[[], Mapping[str, str]] | None = None) -> _Response:
    """Turn a probe callback into 200 or 503; a raising callback counts as not ok."""
    try:
        ok, reason = check()
    except Exception as exc:  # noqa: BLE001 - a probe that cannot answer is a failing probe
        ok, reason = False, f"check raised {type(exc).__name__}"
    if ok:
        body: dict[str, str] = {"status": "ok"}
    else:
        body = {"status": "unavailable", "reason": reason}
    if details is not None:
        try:
            body.update(details())
        except Exception as exc:  # noqa: BLE001 - details are extra: the probe still answers
            body["details"] = f"unavailable ({type(exc).__name__})"
    return _Response(200 if ok else 503, _JSON, json.dumps(body, separators=(",", ":")).encode())
