"""``coldbrew demo``: a self-contained tour on the local broker and database.

It migrates a demo namespace (``COLDBREW_NAMESPACE`` or ``--namespace`` when
given, else ``coldbrew_demo``), starts a worker in this process with the
example app, submits a handful of jobs (coroutines with progress, CPU-bound
transcodes in the process pool, one scheduled for later and cancelled, a flaky job that
retries, a job that fails permanently, a new tenant, a garbage message) and
follows them to their end: live progress bars on a terminal, one line per
change (each with its job id) otherwise. Then it prints each job once with its
outcome, and a summary from the job table of every tenant and lane it touched.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import aio_pika
from rich.console import Console
from rich.table import Table
from rich.text import Text

from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.migrate import drop_namespace, migrate
from coldbrew.model import JobRecord, Status
from coldbrew.settings import Settings
from coldbrew.topology import Topology
from coldbrew.watch import STATUS_STYLES, detail, follow, renderer_for
from coldbrew.worker import Worker

DEMO_APP = "coldbrew.examples.demo:app"
DEMO_NAMESPACE = "coldbrew_demo"
DEMO_TIMEOUT_SECONDS = 120.0
PLAIN_WIDTH = 160
"""Columns of the tables when stdout is not a terminal (a log, a pipe): wide enough that
no cell wraps."""


def demo_settings(settings: Settings, *, namespace_given: bool) -> Settings:
    """The tour's settings: the environment's, in the demo's own namespace unless one was
    given (``--namespace`` or ``COLDBREW_NAMESPACE``), with short intervals."""
    given = namespace_given or "namespace" in settings.model_fields_set
    return settings.model_copy(
        update={
            "namespace": settings.namespace if given else DEMO_NAMESPACE,
            "metrics_port": 0,
            "processes": min(settings.processes, 2),
            "retry_base_seconds": 0.5,
            "relay_interval_seconds": 0.2,
            "progress_flush_seconds": 0.2,
            "heartbeat_seconds": min(settings.heartbeat_seconds, 1.0),
        }
    )


async def run_demo(settings: Settings, *, keep: bool, namespace_given: bool) -> int:
    """Run the tour; return the exit code (0 when every job ended as expected)."""
    settings = demo_settings(settings, namespace_given=namespace_given)
    console = Console(file=sys.stdout, highlight=False)
    if not console.is_terminal:
        console = Console(file=sys.stdout, highlight=False, width=PLAIN_WIDTH)
    say = Say(console)
    say(
        f"coldbrew demo · RabbitMQ {settings.safe_amqp_url()} · "
        f"PostgreSQL {settings.safe_database_url()} · namespace {settings.namespace!r}"
    )
    await migrate(settings.database_url, settings.namespace)
    worker = Worker(load_app(DEMO_APP), settings)
    worker_task = asyncio.create_task(worker.run(), name="demo-worker")
    started = time.monotonic()
    ok = False
    try:
        await worker.wait_ready(worker_task)
        say(
            f"worker ready: lanes {', '.join(worker.lanes)}; {settings.concurrency} coroutine "
            f"slots, {settings.processes} processes; metrics on :{worker.metrics_port}/metrics\n"
        )
        async with Client.connect(settings, app=worker.app) as client:
            expected = await _submit_all(client, settings, say)
            ok = await _follow_all(client, expected, console)
            await _summary(client, console, since=time.monotonic() - started + 60)
    finally:
        worker.stop()
        await worker_task
        if not keep:
            await _cleanup(settings)
    return 0 if ok else 1


class Say:
    """Print a line of the story as it is (no rich markup: lanes look like ``[a, b]``)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, text: str = "") -> None:
        self.console.print(text, markup=False, highlight=False)


async def _submit_all(client: Client, settings: Settings, say: Say) -> dict[str, Status]:
    """Submit the tour's jobs; return job id → the status each should end in."""
    expected: dict[str, Status] = {}
    for tenant, video in (("acme", "cat-video"), ("acme", "dog-video"), ("globex", "launch")):
        job = await client.submit("thumbnail", {"video_id": video}, tenant=tenant)
        expected[job.id] = Status.SUCCEEDED
    resolutions = ["480p", "720p", "1080p"]
    for video in ("keynote", "trailer"):
        job = await client.submit(
            "transcode",
            {"video_id": video, "resolutions": resolutions},
            tenant="globex",
            priority=5,
        )
        expected[job.id] = Status.SUCCEEDED
    # a third transcode is scheduled for an hour from now, then cancelled: it never runs
    # (cancelling one that waits for a pool process would race the worker)
    blooper = await client.submit(
        "transcode",
        {"video_id": "blooper", "resolutions": resolutions},
        tenant="globex",
        delay=3600,
    )
    await client.cancel(blooper.id, "cancelled by the demo while it was scheduled")
    expected[blooper.id] = Status.CANCELLED
    notify = {"user": "ada", "message": "your video is ready"}
    first = await client.submit("notify", notify, tenant="initech", idempotency_key="ada-1")
    again = await client.submit("notify", notify, tenant="initech", idempotency_key="ada-1")
    expected[first.id] = Status.SUCCEEDED
    big = await client.submit("ingest", {"size_bytes": 5_000_000_000}, tenant="acme")
    expected[big.id] = Status.FAILED
    await _publish_garbage(settings)
    same = "the same job" if again.id == first.id else "ANOTHER job (unexpected)"
    say(
        f"submitted {len(expected)} jobs and 1 garbage message; a second submit with "
        f"idempotency key 'ada-1' returned {same}\n"
    )
    return expected


async def _publish_garbage(settings: Settings) -> None:
    """A message that breaks the contract: it lands in the dead letters, nothing stalls."""
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(Topology(settings.namespace).jobs_exchange)
        await exchange.publish(
            aio_pika.Message(b"{not json", message_id="garbage-1"), routing_key="default.acme"
        )
    finally:
        await connection.close()


async def _follow_all(client: Client, expected: dict[str, Status], console: Console) -> bool:
    """Show the jobs' progress until all are finished, then each job once with its outcome."""
    ids = list(expected)
    try:
        jobs = await follow(
            client, ids, renderer_for(console, plain=False), timeout=DEMO_TIMEOUT_SECONDS
        )
    except TimeoutError as exc:
        print(f"coldbrew: the demo timed out: {exc}", file=sys.stderr)
        return False
    wrong = [job for job in jobs if job.status != expected[job.id]]
    console.print()
    console.print(_results_table(jobs))
    if wrong:
        unexpected = ", ".join(f"{j.id[:8]} {j.type} {j.status.value}" for j in wrong)
        print(f"coldbrew: the demo's jobs ended unexpectedly: {unexpected}", file=sys.stderr)
    return not wrong


def _results_table(jobs: list[JobRecord]) -> Table:
    table = Table(title=f"all {len(jobs)} jobs finished", title_justify="left")
    for name, justify in (
        ("id", "left"),
        ("type", "left"),
        ("tenant", "left"),
        ("lane", "left"),
        ("status", "left"),
        ("attempts", "right"),
        ("took", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("result or error", overflow="fold")
    for job in jobs:
        took = (
            "-"
            if job.finished_at is None
            else f"{(job.finished_at - job.created_at).total_seconds():.1f}s"
        )
        table.add_row(
            job.id[:8],
            job.type,
            job.tenant,
            job.queue,
            Text(job.status.value, style=STATUS_STYLES[job.status]),
            f"{job.attempt}/{job.max_attempts}",
            took,
            Text(detail(job).removeprefix("→ ")),
        )
    return table


async def _summary(client: Client, console: Console, *, since: float) -> None:
    """Every tenant and lane the demo touched, from the job table; the dead letters."""
    finished = await client.store.stats.finished_stats(since)
    table = Table(
        title="from the job table (`coldbrew stats`), every lane and tenant",
        title_justify="left",
    )
    for name in ("lane", "tenant"):
        table.add_column(name, no_wrap=True)
    for name in ("succeeded", "failed", "cancelled", "dead", "run p50", "run p95", "wait p50"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in finished:
        table.add_row(
            row.queue,
            row.tenant,
            str(row.succeeded),
            str(row.failed),
            str(row.cancelled),
            str(row.dead),
            *(
                _seconds(v)
                for v in (row.run_p50_seconds, row.run_p95_seconds, row.wait_p50_seconds)
            ),
        )
    console.print()
    console.print(table)
    for reason, count in (await client.store.dead.rejected_counts()).items():
        console.print(
            f"dead letters: {count} rejected message(s), reason {reason!r} (kept with their "
            "original bytes; copies on the <namespace>.dead queue: `coldbrew dlq list --rejected`)",
            markup=False,
        )
    console.print(_TRY_IT, markup=False, highlight=False)


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}s"


_TRY_IT = f"""
Try it by hand (in two terminals):
  .venv/bin/coldbrew migrate
  .venv/bin/coldbrew worker {DEMO_APP}
  .venv/bin/coldbrew submit thumbnail --args '{{"video_id": "v1"}}' --tenant acme --wait
  .venv/bin/coldbrew stats --since 15m"""


async def _cleanup(settings: Settings) -> None:
    await drop_namespace(settings.database_url, settings.namespace)
    topo = settings.topology()
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await connection.channel()
        pairs = [
            (lane, t)
            for lane in ("default", "slow")
            for t in ("default", "acme", "globex", "initech")
        ]
        for queue in topo.every_queue_name(pairs):
            await channel.queue_delete(queue)
        for exchange in (topo.jobs_exchange, topo.unrouted_exchange, topo.dead_exchange):
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()
