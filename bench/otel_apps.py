"""``bench.apps:app`` with tracing on: an SDK tracer provider whose spans are batched and
dropped, so ``throughput.py --otel on`` measures what recording spans costs the worker, not
an exporter's network."""

from __future__ import annotations

from collections.abc import Sequence

from bench.apps import app
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

__all__ = ["app"]


class _Dropped(SpanExporter):
    """Takes every batch and keeps nothing."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(BatchSpanProcessor(_Dropped()))
trace.set_tracer_provider(_provider)
