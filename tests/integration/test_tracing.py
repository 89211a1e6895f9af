"""OpenTelemetry traces across the real broker and database (issue #17).

The SDK's ``InMemorySpanExporter`` collects what an in-process worker and the
submitters record: one trace per job whatever the entry point (``Client``,
``POST /jobs`` with a caller's ``traceparent``, a raw aio-pika producer's
header), the spans' names, parents and attributes, a retry's run span linked to
the failed attempt's, and a malformed header ignored (the job runs).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import aio_pika
import asyncpg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from coldbrew import tracing
from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.helpers import (
    DATABASE_URL,
    WorkerFactory,
    holds,
    metric,
    publish_raw,
    quote_ident,
    status_is,
    wait_until,
)
from tests.integration.test_api import ACME, api_client

WORKER_SPANS = ("coldbrew claim", "coldbrew run", "coldbrew outcome")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """coldbrew traces into an SDK provider of this test's own (the global one can be set
    only once per process), exported to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    yield exporter
    tracing.use_provider(None)
    provider.shutdown()


@pytest.fixture
def test_app() -> Any:
    return load_app("tests.tracing_apps:app")


@pytest.fixture
async def worker(start_worker: WorkerFactory, spans: InMemorySpanExporter) -> Any:
    return await start_worker(processes=1)


def of_job(exporter: InMemorySpanExporter, job_id: str) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("coldbrew.job.id") == job_id
    ]


def named(found: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


async def job_spans(
    exporter: InMemorySpanExporter, job_id: str, *, runs: int = 1
) -> list[ReadableSpan]:
    """The job's spans once its last outcome span ended (it ends after the row is written)."""
    await wait_until(
        lambda: holds(len(named(of_job(exporter, job_id), "coldbrew outcome")) >= runs)
    )
    return of_job(exporter, job_id)


def one(found: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    matching = named(found, name)
    assert len(matching) == 1, [s.name for s in found]
    return matching[0]


def assert_worker_spans(
    found: Sequence[ReadableSpan], parent: ReadableSpan | int, names: Sequence[str] = WORKER_SPANS
) -> None:
    """claim, run and outcome: children of the job's context, in its trace, attributed."""
    parent_id = parent if isinstance(parent, int) else parent.context.span_id
    trace_id = {s.context.trace_id for s in found}
    assert len(trace_id) == 1, "one trace per job"
    for name in names:
        span = one(found, name)
        assert span.parent is not None and span.parent.span_id == parent_id, name
        attributes = span.attributes or {}
        assert attributes["coldbrew.job.attempt"] == 1
        assert attributes["coldbrew.job.type"] and attributes["coldbrew.job.tenant"]
    if "coldbrew claim" in names:
        claim = one(found, "coldbrew claim")
        assert claim.kind is SpanKind.CONSUMER
        assert (claim.attributes or {})["messaging.system"] == "rabbitmq"
    assert (one(found, "coldbrew outcome").attributes or {})["coldbrew.job.status"] == "succeeded"


async def test_a_client_submission_is_one_trace(
    worker: Any, client: Client, spans: InMemorySpanExporter
) -> None:
    """submit (the root) -> publish, then the worker's claim, run and outcome under submit;
    the job's log lines carry the trace's id."""
    job = await client.submit("traced", tenant="acme")
    done = await client.wait(job.id, timeout=20)
    assert done.status == "succeeded"
    found = await job_spans(spans, job.id)
    submit = one(found, "coldbrew submit")
    assert submit.parent is None and submit.kind is SpanKind.PRODUCER
    publish = one(found, "coldbrew publish")
    assert publish.parent is not None and publish.parent.span_id == submit.context.span_id
    assert (publish.attributes or {})["messaging.destination.name"] == (
        f"{client.settings.namespace}.jobs"
    )
    assert_worker_spans(found, submit)
    run = one(found, "coldbrew run")
    assert (run.attributes or {})["coldbrew.job.tenant"] == "acme"
    assert done.result == {"trace_id": f"{submit.context.trace_id:032x}"}


async def test_a_pool_job_gets_the_worker_spans(
    start_worker: WorkerFactory, client: Client, spans: InMemorySpanExporter
) -> None:
    """A process-pool job: its run span is around the pool call, in the submitter's trace."""
    await start_worker(processes=1)
    job = await client.submit("pooled", {"n": 7})
    assert (await client.wait(job.id, timeout=30)).result == 49
    found = await job_spans(spans, job.id)
    assert_worker_spans(found, one(found, "coldbrew submit"))


async def test_a_pool_jobs_log_lines_carry_its_trace_id(
    start_worker: WorkerFactory, client: Client, spans: InMemorySpanExporter
) -> None:
    """The child process binds the job's trace_id into its log context (one string sent
    with the job; none when the job has no trace context)."""
    await start_worker(processes=1)
    job = await client.submit("pooled_traced")
    done = await client.wait(job.id, timeout=30)
    submit = one(of_job(spans, job.id), "coldbrew submit")
    assert done.result == {"trace_id": f"{submit.context.trace_id:032x}"}


async def test_post_jobs_joins_the_callers_trace(
    worker: Any, client: Client, spans: InMemorySpanExporter
) -> None:
    """A ``traceparent`` on ``POST /jobs`` makes the submit span its child; the job's
    spans are in the caller's trace."""
    async with api_client(client) as http:
        response = await http.post(
            "/jobs",
            json={"type": "traced", "args": {}},
            headers={**ACME, "traceparent": TRACEPARENT},
        )
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    assert (await client.wait(job_id, timeout=20)).status == "succeeded"
    found = await job_spans(spans, job_id)
    submit = one(found, "coldbrew submit")
    assert submit.parent is not None and f"{submit.parent.span_id:016x}" == PARENT_SPAN
    assert f"{submit.context.trace_id:032x}" == TRACE_ID
    assert_worker_spans(found, submit)


async def test_a_raw_producers_traceparent_is_the_parent(
    worker: Any,
    client: Client,
    settings: Settings,
    amqp: aio_pika.abc.AbstractChannel,
    spans: InMemorySpanExporter,
) -> None:
    """A producer without coldbrew sets ``traceparent``/``tracestate``: the worker's spans
    are children of its span, in its trace, and the job's log lines carry its trace id."""
    await publish_raw(
        amqp,
        settings.namespace,
        json.dumps({"type": "traced"}).encode(),
        "default.default",
        message_id="raw-traced",
        headers={"traceparent": TRACEPARENT, "tracestate": "vendor=opaque"},
    )
    await wait_until(lambda: status_is(client, "raw-traced", "succeeded"))
    found = await job_spans(spans, "raw-traced")
    assert {f"{s.context.trace_id:032x}" for s in found} == {TRACE_ID}
    assert_worker_spans(found, int(PARENT_SPAN, 16))
    assert one(found, "coldbrew run").context.trace_state.get("vendor") == "opaque"
    assert (await client.get("raw-traced")).result == {"trace_id": TRACE_ID}


async def test_a_retry_is_a_linked_run_span_of_the_same_trace(
    worker: Any, client: Client, spans: InMemorySpanExporter
) -> None:
    """Fail once, then succeed: two run spans in the submitter's trace, both children of
    the submit span, the second linked to the first; the relay's republish is traced."""
    job = await client.submit("fails_once")
    done = await client.wait(job.id, timeout=20)
    assert done.status == "succeeded" and done.attempt == 2
    found = await job_spans(spans, job.id, runs=2)
    assert len({s.context.trace_id for s in found}) == 1
    submit = one(found, "coldbrew submit")
    first, second = sorted(named(found, "coldbrew run"), key=lambda s: s.start_time or 0)
    for run in (first, second):
        assert run.parent is not None and run.parent.span_id == submit.context.span_id
    assert [(run.attributes or {})["coldbrew.job.attempt"] for run in (first, second)] == [1, 2]
    assert not first.status.is_ok and (first.attributes or {})["coldbrew.job.status"] == (
        "retrying"
    )
    assert not first.links
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert len(named(found, "coldbrew publish")) == 2  # the submit's, and the relay's
    assert done.result["trace_id"] == f"{submit.context.trace_id:032x}"


async def test_a_malformed_traceparent_is_ignored_and_the_job_runs(
    worker: Any,
    client: Client,
    settings: Settings,
    amqp: aio_pika.abc.AbstractChannel,
    spans: InMemorySpanExporter,
) -> None:
    """A garbled header is counted and ignored, not a dead letter: the job runs in a trace
    of its own, rooted at its claim."""
    await publish_raw(
        amqp,
        settings.namespace,
        json.dumps({"type": "traced"}).encode(),
        "default.default",
        message_id="raw-garbled",
        headers={"traceparent": "00-not-a-trace-context-01"},
    )
    await wait_until(lambda: status_is(client, "raw-garbled", "succeeded"))
    found = await job_spans(spans, "raw-garbled")
    claim = one(found, "coldbrew claim")
    assert claim.parent is None
    assert (claim.attributes or {})["coldbrew.job.attempt"] == 1
    assert_worker_spans(found, claim, ("coldbrew run", "coldbrew outcome"))
    assert (
        metric(worker, "coldbrew_trace_headers_ignored_total", reason="invalid_traceparent") == 1.0
    )


async def test_nothing_is_recorded_without_a_provider(
    start_worker: WorkerFactory, client: Client
) -> None:
    """Without a provider the facade is off end to end: the job runs, no header is sent."""
    assert not tracing.active()
    await start_worker(processes=1)
    job = await client.submit("traced")
    done = await client.wait(job.id, timeout=20)
    assert done.status == "succeeded" and done.result == {"trace_id": None}


# --- the trace context in the row, whatever the path that inserts it ---------------------


async def row_trace(namespace: str, job_id: str) -> tuple[str | None, str | None]:
    """The job's ``traceparent`` and ``tracestate`` columns, as the relay reads them."""
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        row = await conn.fetchrow(
            f"SELECT traceparent, tracestate FROM {quote_ident(namespace)}.jobs WHERE id = $1",
            job_id,
        )
    finally:
        await conn.close()
    assert row is not None, job_id
    return row["traceparent"], row["tracestate"]


def names_span(traceparent: str | None, span: ReadableSpan) -> bool:
    """Whether ``traceparent`` is ``span``'s context (its trace and span ids)."""
    return traceparent is not None and traceparent[3:52] == (
        f"{span.context.trace_id:032x}-{span.context.span_id:016x}"
    )


async def test_submissions_outside_insert_job_keep_the_trace_in_the_row(
    client: Client, settings: Settings, spans: InMemorySpanExporter
) -> None:
    """In the caller's transaction, unique, and a batch's members: each row names the span
    that submitted it, so the relay's publish (and a retry) stays in that trace."""
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        async with conn.transaction():
            in_tx = await client.submit("traced", connection=conn)
    finally:
        await conn.close()
    unique = await client.submit("traced", unique_for=60)
    batch = await client.batch([("pooled", {"n": 1}), ("pooled", {"n": 2})])
    for job_id in (in_tx.id, unique.id):
        submit = one(of_job(spans, job_id), "coldbrew submit")
        assert names_span((await row_trace(settings.namespace, job_id))[0], submit), job_id
    batch_span = one(spans.get_finished_spans(), "coldbrew batch")
    assert (batch_span.attributes or {})["coldbrew.batch.id"] == batch.id
    for member in batch.member_ids:
        assert names_span((await row_trace(settings.namespace, member))[0], batch_span)
        publish = one(of_job(spans, member), "coldbrew publish")
        assert publish.parent is not None
        assert publish.parent.span_id == batch_span.context.span_id


async def test_children_and_added_members_join_the_run_span(
    worker: Any, client: Client, settings: Settings, spans: InMemorySpanExporter
) -> None:
    """``ctx.submit``'s child (of a coroutine job and of a process-pool job) and
    ``ctx.batch.add``'s member: their rows name the run span of the job that made them,
    and their own spans are in its trace."""
    parent = await client.submit("spawns")
    child_id = (await client.wait(parent.id, timeout=20)).result
    pooled = await client.submit("pooled_spawns")  # relayed from a process-pool child
    pooled_child_id = (await client.wait(pooled.id, timeout=30)).result
    batch = await client.batch([("adds", {})])
    adder = batch.member_ids[0]
    added_id = (await client.wait(adder, timeout=20)).result
    for maker, made in ((parent.id, child_id), (pooled.id, pooled_child_id), (adder, added_id)):
        assert (await client.wait(made, timeout=20)).status == "succeeded"
        run = one(await job_spans(spans, maker), "coldbrew run")
        assert names_span((await row_trace(settings.namespace, made))[0], run), made
        found = await job_spans(spans, made)
        assert_worker_spans(found, run)
        assert found[0].context.trace_id == run.context.trace_id


async def test_a_cron_tick_is_a_trace_rooted_in_its_cron_span(
    start_worker: WorkerFactory, client: Client, spans: InMemorySpanExporter
) -> None:
    """A tick's job: its publish and worker spans are children of the tick's span."""
    await start_worker(load_app("tests.tracing_apps:cron_app"), processes=1)
    await wait_until(
        lambda: holds(bool(named(spans.get_finished_spans(), "coldbrew outcome"))), timeout=20
    )
    outcome = named(spans.get_finished_spans(), "coldbrew outcome")[0]
    found = of_job(spans, (outcome.attributes or {})["coldbrew.job.id"])
    cron = [
        s
        for s in named(spans.get_finished_spans(), "coldbrew cron")
        if s.context.trace_id == outcome.context.trace_id
    ]
    assert len(cron) == 1 and cron[0].parent is None
    assert_worker_spans(found, cron[0])


async def test_a_raw_producers_traceparent_is_in_the_row_from_the_first_claim(
    start_worker: WorkerFactory,
    client: Client,
    settings: Settings,
    amqp: aio_pika.abc.AbstractChannel,
) -> None:
    """Tracing off, a job that succeeds at once: its row still keeps the producer's trace
    context (the claim records it), so anything the relay publishes later joins it."""
    await start_worker(processes=1)
    await publish_raw(
        amqp,
        settings.namespace,
        json.dumps({"type": "traced"}).encode(),
        "default.default",
        message_id="raw-kept",
        headers={"traceparent": TRACEPARENT, "tracestate": "vendor=opaque"},
    )
    await wait_until(lambda: status_is(client, "raw-kept", "succeeded"))
    assert await row_trace(settings.namespace, "raw-kept") == (TRACEPARENT, "vendor=opaque")
