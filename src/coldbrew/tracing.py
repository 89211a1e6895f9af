"""OpenTelemetry traces: one facade, a no-op unless the ``otel`` extra is installed and a
tracer provider is configured.

A job's trace context is W3C Trace Context (``traceparent``, ``tracestate``) carried
as AMQP headers, and in its row (migration 0017) so that what the relay publishes
later -- a retry, a scheduled job, a submission whose publish failed -- stays in the
submitter's trace. Every span a job gets names that context as its parent: the
submit (the trace's root for a job ``Client`` submits outside any span), its publish,
then in the worker the claim, the run and the outcome of each attempt. A retry's run
span links to the previous attempt's run span (``x-coldbrew-previous-span``).

Zero cost when off: ``tracer()`` is one call that answers None until the extra is
importable and a provider other than OpenTelemetry's proxy/no-op one is set, and
every span helper then hands back one shared ``nullcontext`` -- no dict, no object
per job. opentelemetry is imported on the first ``tracer()`` call, not with
coldbrew. The header checks (``check_traceparent``) are plain Python: the worker
validates what producers send whether or not it traces.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import structlog

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from coldbrew.model import JobFields

__all__ = [
    "PREVIOUS_SPAN_HEADER",
    "active",
    "check_traceparent",
    "check_tracestate",
    "current",
    "job_span",
    "log_trace_id",
    "remote_parent",
    "span",
    "stamp",
    "trace_id_of",
    "traceparent_of",
    "tracer",
    "use_provider",
]

PREVIOUS_SPAN_HEADER: Final = "x-coldbrew-previous-span"
"""The relay's header on a retry: the previous attempt's run span, as a traceparent."""

# W3C Trace Context level 1: version 00 has exactly these four fields; a future version
# may append fields after the flags (so only "ff" is refused, and more text after 00).
_TRACEPARENT: Final = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16
MAX_TRACESTATE: Final = 512
"""Characters of ``tracestate`` kept (W3C: 32 list members; 512 is what it asks to keep)."""
_TRACESTATE: Final = re.compile(r"[\x20-\x7e]*")

_NULL: Final = contextlib.nullcontext()
"""What every span helper returns when tracing is off: shared, so nothing is built."""

_SYSTEM: Final = "rabbitmq"


def check_traceparent(value: object) -> str | None:
    """``value`` as a valid ``traceparent`` (text, lower-case hex), or None when it is not
    one: a producer's malformed header is ignored, never a reason to refuse its job."""
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str) or len(value) > 512:
        return None
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    version, trace_id, span_id, _flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return value


def check_tracestate(value: object) -> str | None:
    """``value`` as ``tracestate`` text (printable ASCII, at most 512 characters), or None."""
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str) or not value or len(value) > MAX_TRACESTATE:
        return None
    return value if _TRACESTATE.fullmatch(value) else None


def trace_id_of(traceparent: str) -> str:
    """The 32 hex digits of a checked ``traceparent``'s trace id."""
    return traceparent[3:35]


# --- the OpenTelemetry side (imported on first use) ---------------------------------

_UNRESOLVED: Final[Any] = object()
_otel: Any = _UNRESOLVED
"""The ``_Otel`` bundle once imported, None when the extra is not installed."""
_tracer: Tracer | None = None
_override: TracerProvider | None = None


class _Otel:
    """The parts of opentelemetry the facade uses, imported once."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.trace = trace
        self.context = context
        self.propagator = TraceContextTextMapPropagator()
        self.off = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        # Whether a global provider may be set: get_tracer_provider() reads os.environ on
        # every call while none is (about 1.5 us here, four times a job), so the facade
        # reads the API's own global instead, and the variable once.
        self.env_provider = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
        self.reads_global = hasattr(trace, "_TRACER_PROVIDER")
        self.kinds = {
            "producer": trace.SpanKind.PRODUCER,
            "consumer": trace.SpanKind.CONSUMER,
            "internal": trace.SpanKind.INTERNAL,
            "server": trace.SpanKind.SERVER,
        }


def _load() -> Any:
    global _otel
    if _otel is _UNRESOLVED:
        try:
            _otel = _Otel()
        except ImportError:
            _otel = None
    return _otel


def tracer() -> Tracer | None:
    """coldbrew's tracer, or None: the extra is not installed, or no tracer provider is
    set (``opentelemetry.trace.set_tracer_provider``, or ``use_provider``). Once a real
    global provider is found it is kept: OpenTelemetry sets the global one only once."""
    if _tracer is not None:
        return _tracer
    if _otel is None:
        return None
    return _resolve()


def _resolve() -> Tracer | None:
    global _tracer
    otel = _otel if _otel is not _UNRESOLVED else _load()
    if otel is None:
        return None
    if (
        _override is None
        and otel.reads_global
        and otel.trace._TRACER_PROVIDER is None
        and not otel.env_provider
    ):
        return None  # no provider set: the hot path's answer while tracing is off
    provider = _override if _override is not None else otel.trace.get_tracer_provider()
    if isinstance(provider, otel.off):
        return None
    _tracer = provider.get_tracer("coldbrew", _version())
    return _tracer


def _version() -> str:
    try:
        return importlib.metadata.version("coldbrew")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def active() -> bool:
    """Whether spans are recorded (see ``tracer``)."""
    return tracer() is not None


def use_provider(provider: TracerProvider | None) -> None:
    """Trace with ``provider`` instead of the global one (None: the global one again).

    For tests and embedders that keep a provider of their own; OpenTelemetry's global
    provider can be set only once per process."""
    global _override, _tracer
    _override = provider
    _tracer = None


def _parent(traceparent: str | None, tracestate: str | None) -> Any:
    """The OpenTelemetry context a checked ``traceparent`` names (None: the current one)."""
    if traceparent is None:
        return None
    return _extract(traceparent, tracestate)


@functools.lru_cache(maxsize=4096)
def _extract(traceparent: str, tracestate: str | None) -> Any:
    """The propagator's reading of a job's headers, cached: each of a job's spans names the
    same parent, and an OpenTelemetry context is immutable."""
    carrier = {"traceparent": traceparent}
    if tracestate is not None:
        carrier["tracestate"] = tracestate
    return _otel.propagator.extract(carrier)


def traceparent_of(span: Span) -> tuple[str, str | None]:
    """The ``traceparent`` and ``tracestate`` (None when empty) that name ``span``."""
    context = span.get_span_context()
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    state = context.trace_state.to_header() if context.trace_state else ""
    return parent, state or None


@contextlib.contextmanager
def _job_span(
    tracer: Tracer,
    name: str,
    job: JobFields,
    kind: str,
    attempt: int | None,
    destination: str | None,
    previous: str | None,
) -> Iterator[Span]:
    otel = _otel
    attributes: dict[str, Any] = {
        "coldbrew.job.id": job.id,
        "coldbrew.job.type": job.type,
        "coldbrew.job.tenant": job.tenant,
    }
    if kind != "internal":  # a messaging span: the message's conventions (the SDK checks
        # every attribute of every span, so the run and outcome spans carry only the job's)
        attributes["coldbrew.job.queue"] = job.queue
        attributes["messaging.system"] = _SYSTEM
        attributes["messaging.message.id"] = job.id
        attributes["messaging.rabbitmq.destination.routing_key"] = f"{job.queue}.{job.tenant}"
        if destination is not None:
            attributes["messaging.destination.name"] = destination
    if attempt is not None:
        attributes["coldbrew.job.attempt"] = attempt
    links = None
    if previous is not None:
        link_context = otel.trace.get_current_span(_parent(previous, None)).get_span_context()
        links = [otel.trace.Link(link_context, {"coldbrew.link": "previous_attempt"})]
    with tracer.start_as_current_span(
        name,
        context=_parent(job.traceparent, job.tracestate),
        kind=otel.kinds[kind],
        attributes=attributes,
        links=links,
    ) as span:
        if job.traceparent is None:  # the job's first span: the rest of its spans nest here
            job.traceparent, job.tracestate = traceparent_of(span)
        yield span


def job_span(
    name: str,
    job: JobFields,
    *,
    kind: str = "internal",
    attempt: int | None = None,
    destination: str | None = None,
    previous: str | None = None,
) -> contextlib.AbstractContextManager[Span | None]:
    """A span for one step of ``job`` (yields None when tracing is off).

    Its parent is the job's trace context (``job.traceparent``) when it has one, else
    the current context; a job without one takes this span's, so that its later spans
    (and its row, and its messages) are of the same trace. ``previous``: a traceparent
    to link to (the previous attempt's run span). The span is current inside the
    ``with``, so a job's own spans nest under its run span; an exception escaping it is
    recorded and marks it an error (OpenTelemetry's default)."""
    active_tracer = _tracer
    if active_tracer is None:
        if _otel is None:  # the extra is not installed: one global read
            return _NULL
        active_tracer = _resolve()
        if active_tracer is None:
            return _NULL
    return _job_span(active_tracer, name, job, kind, attempt, destination, previous)


def set_attributes(span: Span | None, attributes: Mapping[str, Any]) -> None:
    """Add attributes to ``span`` (nothing when tracing is off and ``span`` is None)."""
    if span is not None:
        span.set_attributes(attributes)


def mark_error(span: Span | None, description: str) -> None:
    """Mark ``span`` failed (a job's failed attempt is data to the worker, not an
    exception that escapes the span)."""
    if span is not None:
        span.set_status(_otel.trace.Status(_otel.trace.StatusCode.ERROR, description))


@contextlib.contextmanager
def _attached(context: Any) -> Iterator[None]:
    token = _otel.context.attach(context)
    try:
        yield
    finally:
        _otel.context.detach(token)


def remote_parent(
    traceparent: object, tracestate: object = None
) -> contextlib.AbstractContextManager[None]:
    """Make a caller's trace context (an HTTP request's ``traceparent`` header) current
    inside the ``with``; nothing when tracing is off or the header is missing or
    malformed (ignored, as a producer's is)."""
    if traceparent is None or tracer() is None:
        return _NULL
    if _otel.trace.get_current_span().get_span_context().is_valid:
        return _NULL  # an instrumented server already made the request's span current
    checked = check_traceparent(traceparent)
    if checked is None:
        return _NULL
    return _attached(_parent(checked, check_tracestate(tracestate)))


def current() -> tuple[str | None, str | None]:
    """The current span's ``traceparent`` and ``tracestate``, or (None, None) when tracing
    is off or no span is current: what a job inserted from inside another's span (a
    child, a member ``ctx.batch.add`` adds, a batch's members) carries in its row, so its
    publish and its attempts join that trace."""
    if tracer() is None:
        return None, None
    context = _otel.trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None, None
    return traceparent_of(_otel.trace.get_current_span())


def stamp(jobs: Iterable[JobFields]) -> None:
    """Give each of ``jobs`` without a trace context the current one (``current``)."""
    traceparent, tracestate = current()
    if traceparent is None:
        return
    for job in jobs:
        if job.traceparent is None:
            job.traceparent, job.tracestate = traceparent, tracestate


def span(
    name: str, attributes: Mapping[str, Any], *, kind: str = "producer"
) -> contextlib.AbstractContextManager[Span | None]:
    """A span of no single job (a batch's submission, a cron tick), current inside the
    ``with``, a child of the current context; None (nothing built) when tracing is off."""
    active_tracer = tracer()
    if active_tracer is None:
        return _NULL
    return active_tracer.start_as_current_span(
        name, kind=_otel.kinds[kind], attributes=dict(attributes)
    )


def log_trace_id(job: JobFields) -> contextlib.AbstractContextManager[Any]:
    """Bind ``trace_id`` into structlog's context vars inside the ``with`` when the job has
    a trace context (a producer's header, or the span tracing gave it): the job's log
    lines, the worker's and its own ``ctx.log``, then carry it. Nothing otherwise."""
    if job.traceparent is None:
        return _NULL
    return structlog.contextvars.bound_contextvars(trace_id=trace_id_of(job.traceparent))
