"""The tracing facade: off (and free) without the extra or a provider; the W3C header checks."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from coldbrew import tracing
from coldbrew.model import Envelope, JobFields, message_body, message_headers, parse_envelope

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def job() -> JobFields:
    return JobFields("j1", "echo", "default", "acme", {}, 0, None, None, None)


def parse(headers: dict[str, object]) -> Envelope:
    return parse_envelope(
        message_body("echo", {}),
        routing_key="default.acme",
        message_id="j1",
        headers=headers,
        priority=None,
        max_body_bytes=1 << 20,
    )


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.use_provider(provider)
    yield memory
    tracing.use_provider(None)


def test_without_a_provider_the_facade_is_a_no_op() -> None:
    """The SDK is installed but no provider is set (OpenTelemetry's proxy): nothing is
    built, the job gets no trace context, a caller's header is not attached."""
    assert not tracing.active()
    target = job()
    span_cm = tracing.job_span("coldbrew run", target, attempt=1)
    assert span_cm is tracing._NULL  # the one shared nullcontext: nothing per job
    with span_cm as span:
        assert span is None
    assert target.traceparent is None
    assert tracing.remote_parent(VALID) is tracing._NULL
    assert tracing.log_trace_id(target) is tracing._NULL
    tracing.set_attributes(None, {"a": 1})
    tracing.mark_error(None, "x")
    assert tracing.span("coldbrew batch", {"coldbrew.batch.id": "b"}) is tracing._NULL
    assert tracing.current() == (None, None)
    tracing.stamp([target])
    assert target.traceparent is None


def test_stamp_gives_the_current_span_to_jobs_without_a_context(
    exporter: InMemorySpanExporter,
) -> None:
    """What a batch's members, a child and a cron tick get: the current span's context,
    never in place of a context a job has."""
    fresh, own = job(), job()
    own.traceparent = VALID
    assert tracing.current() == (None, None)  # a provider, but no span is current
    with tracing.span("coldbrew batch", {"coldbrew.batch.id": "b"}) as span:
        assert span is not None
        tracing.stamp([fresh, own])
    (batch,) = exporter.get_finished_spans()
    assert fresh.traceparent == tracing.traceparent_of(batch)[0]  # type: ignore[arg-type]
    assert own.traceparent == VALID


def test_without_the_extra_nothing_is_imported() -> None:
    """opentelemetry not importable (the extra not installed): tracer() is None and the
    span helpers are no-ops; coldbrew itself never imports opentelemetry."""
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from coldbrew import tracing, model, client\n"
        "from coldbrew.worker import runner\n"
        "j = model.JobFields('j', 't', 'q', 'x', {}, 0, None, None, None)\n"
        "assert tracing.tracer() is None and not tracing.active()\n"
        "with tracing.job_span('coldbrew run', j) as s: assert s is None\n"
        "assert j.traceparent is None\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.')]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_with_a_provider_a_job_span_gives_the_job_its_context(
    exporter: InMemorySpanExporter,
) -> None:
    target = job()
    with tracing.job_span("coldbrew submit", target, kind="producer") as span:
        assert span is not None
    assert target.traceparent is not None and tracing.check_traceparent(target.traceparent)
    with tracing.job_span("coldbrew run", target, attempt=2, previous=VALID):
        pass
    submit, run = exporter.get_finished_spans()
    assert run.parent is not None and run.parent.span_id == submit.context.span_id
    assert run.context.trace_id == submit.context.trace_id
    assert [f"{link.context.span_id:016x}" for link in run.links] == ["00f067aa0ba902b7"]
    assert (run.attributes or {})["coldbrew.job.attempt"] == 2


@pytest.mark.parametrize(
    "value",
    [
        VALID,
        VALID.encode(),
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future",  # a later version
    ],
)
def test_a_valid_traceparent_is_kept(value: object) -> None:
    assert tracing.check_traceparent(value) == (
        value.decode() if isinstance(value, bytes) else value
    )


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        VALID.upper(),  # W3C: lower-case hex only
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff is invalid
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        VALID + "-extra",  # version 00 has exactly four fields
        VALID + "\n",
        b"\xff\xfe",
        42,
        "00-" + "a" * 600,
    ],
)
def test_a_malformed_traceparent_is_refused(value: object) -> None:
    assert tracing.check_traceparent(value) is None


def test_the_headers_round_trip_through_the_contract() -> None:
    """What message_headers writes, parse_envelope reads back (and a worker traces)."""
    headers = message_headers(
        idempotency_key=None,
        max_attempts=None,
        timeout=None,
        traceparent=VALID,
        tracestate="vendor=opaque",
        previous_span=VALID,
    )
    envelope = parse(headers)
    assert (envelope.traceparent, envelope.tracestate, envelope.previous_span) == (
        VALID,
        "vendor=opaque",
        VALID,
    )
    assert envelope.trace_ignored is None
    assert "traceparent" not in message_headers(
        idempotency_key=None, max_attempts=None, timeout=None
    )


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"traceparent": "00-nope-01"}, "invalid_traceparent"),
        ({"traceparent": 7}, "invalid_traceparent"),
        ({"traceparent": VALID, "tracestate": "caf\u00e9=1"}, "invalid_tracestate"),
    ],
)
def test_a_malformed_header_is_noted_and_the_job_still_parses(
    headers: dict[str, object], reason: str
) -> None:
    """Never a ContractViolation: the job runs, the intake counts the reason."""
    envelope = parse(headers)
    assert envelope.trace_ignored == reason
    assert envelope.tracestate is None
    if reason == "invalid_traceparent":
        assert envelope.traceparent is None
